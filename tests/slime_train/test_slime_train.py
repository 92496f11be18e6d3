"""What slime's own ``train.py --debug-rollout-only`` saved when it ran the plugin on a CPU against the real
SGLang server (``scripts/slime_cpu_smoke.sh``): every Sample against the server's answers, statuses and rewards
against each episode's record, groups, slime's partial rollout and eval, and the plugin's wandb keys.

The smoke's model writes random tokens under a grammar (``scripts/slime_cpu/smoke_settings.yaml``): it answers
at once, calls the Python tool then answers, or calls it to the limit, as its own sampling decides. The tests
check whatever it did against the rules, and that the run covered what it must (a tool call then an answer, a
continued episode). The same overlay puts the sandbox on a Ray pool (``sandbox.placement: ray``) inside slime's
cluster: the tests check by Ray's own account that the model's programs ran on its workers, and that nothing of
the pool outlived train.py.

Each test runs once per configuration of the smoke (conftest.py): ``sync`` (slime's default rollout function, the
sandbox on its Ray pool) and ``async_workers`` (slime's fully-async rollout function, episodes on rollout workers,
an abort between steps); a test taking ``async_smoke``, ``pool_smoke`` or ``workers_smoke`` runs on the
configurations that have that part.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import types
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml

from slime_strands.agent.record import RewardRule, Termination
from slime_strands.reward_norm import post_process_rewards
from slime_strands.testing.invariants import assert_sample_invariants
from slime_train.smoke_output import FULLY_ASYNC_THREAD, RayActor, SmokeRun, served_turns

pytestmark = pytest.mark.slime_train

REPO = Path(__file__).resolve().parents[2]
_BOXED = re.compile(r"Answer: \\boxed\{(\d+)\}")


def _masked_before(smoke: SmokeRun, sample: object) -> int:
    """Response tokens ``--mask-offpolicy-in-partial-rollout`` took out of the loss (none unless the smoke set it)."""
    return SmokeRun.record(sample).offpolicy_masked_tokens if smoke.config["mask_offpolicy"] else 0  # type: ignore[arg-type]


def test_every_rollout_step_saved_a_full_batch_of_whole_groups(smoke: SmokeRun) -> None:
    n, batch = smoke.config["n_samples_per_prompt"], smoke.config["rollout_batch_size"]
    assert sorted(smoke.train) == list(range(smoke.config["num_rollout"]))
    for rollout_id, samples in smoke.train.items():
        assert len(samples) == batch * n, f"rollout {rollout_id}: {len(samples)} samples"
        groups = Counter(s.group_index for s in samples)
        assert sorted(groups.values()) == [n] * batch, f"rollout {rollout_id}: group sizes {groups}"
        assert len({s.index for s in samples}) == len(samples), (
            f"rollout {rollout_id}: repeated sample indices"
        )
    trained = Counter(s.index for samples in smoke.train.values() for s in samples)
    assert max(trained.values()) == 1, (
        f"samples trained at two steps: {[i for i, n in trained.items() if n > 1]}"
    )


def test_every_saved_sample_is_what_the_server_wrote(smoke: SmokeRun) -> None:
    """The trajectory invariants, slime's view and the server's: tokens = prompt + response, mask and logprobs the
    response's length, every trained token the server's output for the trajectory so far (with its logprob),
    every tool-output or template token masked, and the trajectory ending on a model output."""
    samples = smoke.every_sample()
    assert samples
    for sample in samples:
        masked = _masked_before(smoke, sample)
        assert_sample_invariants(sample, masked_before=masked)
        turns = served_turns(sample, smoke.log, masked_before=masked)
        # one server answer per turn: a grammar-constrained turn slime's abort cut is asked again whole
        assert len(turns) == SmokeRun.record(sample).turns, f"sample {sample.index}"
        assert len(sample.weight_versions) == len(turns), (
            f"sample {sample.index}: a weight version per answer"
        )


def test_statuses_and_rewards_follow_each_episode_record(smoke: SmokeRun) -> None:
    reward = smoke.settings.reward
    for evaluation, steps in ((False, smoke.train), (True, smoke.evals)):
        for sample in (s for step in steps.values() for s in step):
            record = SmokeRun.record(sample)
            assert record.evaluation is evaluation
            assert sample.status.name == record.treatment.status, (sample.index, record.termination)
            assert bool(sample.remove_sample) is record.treatment.remove_sample
            assert record.treatment.reward is RewardRule.SCORE, (
                f"sample {sample.index} ended {record.termination}"
            )
            answers = _BOXED.findall(sample.response)
            correct = bool(answers) and answers[-1] == str(sample.label)
            if evaluation:
                expected = 1.0 if correct else 0.0
            elif correct:
                expected = reward.correct
            else:
                shaped = (
                    reward.incorrect
                    + (record.tool_iters - reward.shaping_baseline_iters) * reward.shaping_per_iter
                )
                expected = min(reward.shaping_cap, shaped) if reward.tool_shaping else reward.incorrect
            assert sample.reward == pytest.approx(expected), (
                sample.index,
                sample.response[-80:],
                sample.label,
            )
            if record.termination is Termination.END_TURN:
                assert answers, f"sample {sample.index} ended its turn without an answer"
            if record.termination is Termination.TOOL_LIMIT:
                assert record.tool_iters == smoke.settings.max_tool_iters


def test_the_reward_post_process_normalises_each_saved_group(smoke: SmokeRun) -> None:
    """slime calls the plugin's reward post-process only when it trains: run it on what each step saved."""
    args = types.SimpleNamespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        n_samples_per_prompt=smoke.config["n_samples_per_prompt"],
        rollout_batch_size=smoke.config["rollout_batch_size"],
        reward_key=None,
    )
    for rollout_id, samples in smoke.train.items():
        raw, normalised = post_process_rewards(args, samples)
        assert raw == [s.reward for s in samples]
        by_group: dict[int, list[float]] = defaultdict(list)
        for sample, value in zip(samples, normalised, strict=True):
            by_group[sample.group_index].append(value)
        for group, values in by_group.items():
            assert sum(values) == pytest.approx(0.0, abs=1e-5), (
                f"rollout {rollout_id} group {group}: {values}"
            )


_CALL_AND_RESULT = re.compile(
    r'"code": "(?P<code>(?:[^"\\]|\\.)*)"\}\}\s*</tool_call>.*?<tool_response>\s*(?P<output>.*?)\s*</tool_response>',
    re.DOTALL,
)
_PRINTED_SUM = re.compile(r"print\((\d+(?: [-+*] \d+)*)\)")


def _arithmetic(expression: str) -> int:
    """The value of ``a op b op c`` with + - * on integers (what the smoke's grammar lets the model print), by
    Python's precedence, without evaluating model-written text as code."""
    node = ast.parse(expression, mode="eval").body

    def value(n: ast.AST) -> int:
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        assert isinstance(n, ast.BinOp), ast.dump(n)
        left, right = value(n.left), value(n.right)
        ops = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}
        return ops[type(n.op)]

    return value(node)


def test_episodes_called_the_python_tool_and_then_answered(smoke: SmokeRun) -> None:
    """The sandbox ran the model's program (inside slime's Ray cluster: its RolloutManager actor, or the pool's
    workers, below): each call's tool response (masked, see above) holds what the program printed."""
    tool_then_answer = []
    for sample in smoke.every_sample():
        record = SmokeRun.record(sample)
        if record.tool_calls and record.termination is Termination.END_TURN:
            tool_then_answer.append(sample)
            assert record.tool_errors == 0, f"sample {sample.index}: the sandbox failed the model's program"
    assert tool_then_answer, "no episode called the tool and then answered"
    for sample in tool_then_answer:
        calls = list(_CALL_AND_RESULT.finditer(sample.response))
        assert len(calls) == SmokeRun.record(sample).tool_calls, sample.response[-600:]
        for call in calls:
            assert call["output"], f"sample {sample.index}: an empty tool response"
            printed = _PRINTED_SUM.fullmatch(call["code"])
            if printed:
                assert call["output"] == str(_arithmetic(printed.group(1))), call.group(0)


def test_slime_aborted_episodes_and_continued_them_at_a_later_step(smoke: SmokeRun) -> None:
    """``--partial-rollout`` with over-sampling: slime aborted the slowest episodes when a step had its batch,
    put their groups back in its buffer, and a later step handed them back; with ``resume_aborted`` the episode
    went on where it stopped: its turns from before the abort were not generated again."""
    if smoke.config["partial_rollout"] != 1 or smoke.config["num_rollout"] < 2:
        pytest.skip("a smoke variant without partial rollout or with one step: nothing can continue")
    assert smoke.settings.resume_aborted
    if smoke.fully_async:
        # No abort of slime's own (its weight update's, which --debug-rollout-only skips): the smoke's, once each
        # step but the last was saved, each in the proxy's log (where the seams below are read)
        aborts = smoke.aborts()
        assert [a["after_rollout"] for a in aborts] == list(range(smoke.config["num_rollout"] - 1)), aborts
        assert all(a["status"] == 200 for a in aborts), aborts
        assert len(smoke.log.abort_orders) >= len(aborts)
    else:
        assert smoke.config["over_sampling_batch_size"] > smoke.config["rollout_batch_size"]
        collected = [
            int(n)
            for n in re.findall(r"Collected (\d+) partial samples", (smoke.out / "train.log").read_text())
        ]
        assert sum(collected) > 0, "slime's abort collected no partial sample"
    carried = []  # episodes that continued with turns from before an abort
    for rollout_id, samples in smoke.train.items():
        for sample in samples:
            record = SmokeRun.record(sample)
            assert record.regenerations >= record.continuations
            if record.turns_saved:
                assert record.continuations >= 1
                if not smoke.fully_async:
                    # slime's abort marks a partial sample with its step when it holds a response (the
                    # fully-async worker hands an ABORTED group back to the buffer without marking it)
                    assert sample.metadata["start_rollout_id"] < rollout_id
                carried.append(sample)
    assert carried, "no saved episode continued with turns from before slime's abort"
    for sample in carried:
        record = SmokeRun.record(sample)
        turns = served_turns(sample, smoke.log, masked_before=_masked_before(smoke, sample))
        prompt_len = len(sample.tokens) - sample.response_length
        # Its trajectory: turns the server answered before one of slime's aborts, then turns answered after it,
        # each continuation going on from the turns before it (not from the prompt: nothing generated again).
        # A seam is where an abort fell between two of its turns; each continuation carried every turn before
        # its seam (a turn the abort cut is asked again whole under the grammar). The first abort after a turn
        # always hits the episode (it is running), so every seam carried once at least; a later abort in the same
        # gap may hit its continuation again or find it waiting in slime's buffer (both seen in CI), so the
        # record's turns_saved is the seams' sum plus repeats of them, each continuation carrying at most the
        # turns before the last seam.
        seams = sorted(
            {
                i
                for i in range(1, len(turns))
                if any(turns[i - 1].order < a < turns[i].order for a in smoke.log.abort_orders)
            }
        )
        assert seams, f"sample {sample.index}: no abort between its turns"
        assert len(seams) <= record.continuations, (sample.index, seams, record.continuations)
        assert sum(seams) <= record.turns_saved <= record.continuations * seams[-1], (
            sample.index,
            seams,
            record.turns_saved,
            record.continuations,
        )
        assert all(len(turns[i].input_ids) > prompt_len for i in seams)


_POOL_STARTED = re.compile(
    r"\((?P<actor>\w+) pid=(?P<pid>\d+)\).*slime-strands sandbox: Ray pool of (?P<workers>\d+) workers x "
    r"(?P<slots>\d+) slots on (?P<nodes>\d+) node\(s\): (?P<where>.*)$",
    re.MULTILINE,
)
# the pool's warning when a worker is lost (and replaced)
_POOL_WORKER_LOST = re.compile(r"slime-strands sandbox: Ray sandbox worker on .* lost \(")


def _pool_workers(smoke: SmokeRun) -> list[RayActor]:
    assert smoke.settings.sandbox.placement == "ray"
    return smoke.ray.of_class("SandboxWorker")


def test_the_sandbox_pool_started_inside_slimes_ray_cluster(pool_smoke: SmokeRun) -> None:
    """slime's RolloutManager actor started the pool its settings size, in the cluster train.py runs on: its log
    line (workers x slots on nodes, each worker's pid) against Ray's own record of the workers; none was lost."""
    smoke = pool_smoke
    workers, pool = _pool_workers(smoke), smoke.settings.sandbox.ray
    log = (smoke.out / "train.log").read_text()
    started = list(_POOL_STARTED.finditer(log))
    assert len(started) == 1, [m.group(0) for m in started]  # one pool for the rollout process, started once
    line = started[0]
    (manager,) = smoke.ray.of_class("RolloutManager")
    assert (line["actor"], int(line["pid"])) == ("RolloutManager", manager.pid)
    assert (int(line["workers"]), int(line["slots"])) == (pool.workers, pool.slots_per_worker)
    assert int(line["nodes"]) == len({w.node_id for w in workers}) >= 1
    logged_pids = sorted(int(pid) for pid in re.findall(r"pid (\d+)", line["where"]))
    assert logged_pids == sorted(w.pid for w in workers)
    assert not _POOL_WORKER_LOST.search(log), "a sandbox worker was lost in a healthy run"
    assert len(workers) == pool.workers  # none replaced
    wanted = {"CPU": pool.cpus_per_worker} | ({pool.custom_resource: 1.0} if pool.custom_resource else {})
    for worker in workers:
        assert worker.job_id == manager.job_id, "the pool's workers belong to train.py's job"
        assert worker.required_resources == wanted


def test_the_models_programs_ran_on_the_pools_workers(pool_smoke: SmokeRun) -> None:
    """Ray's record of the workers' ``run`` calls: each on one of the pool's workers, and at least one finished
    call per tool response the saved samples hold (more ran: episodes slime aborted, over-sampled groups).

    Ray's task events are best effort: under load one may be dropped, and a finished call then has no worker pid
    in the record (seen once in CI). A pid that is there must be its worker's; most calls have one."""
    smoke = pool_smoke
    workers = {w.actor_id: w.pid for w in _pool_workers(smoke)}
    runs = smoke.ray.runs
    assert runs, "Ray recorded no execution on the pool"
    for run in runs:
        assert run["actor_id"] in workers and run["worker_pid"] in (None, workers[run["actor_id"]]), run
    assert sum(run["worker_pid"] is not None for run in runs) * 2 > len(runs), runs
    finished = Counter(run["actor_id"] for run in runs if run["state"] == "FINISHED")
    responses = sum(s.response.count("<tool_response>") for s in smoke.every_sample())
    assert responses > 0
    assert sum(finished.values()) >= responses, (finished, responses)


def test_nothing_of_the_run_outlived_train_py(smoke: SmokeRun) -> None:
    """Once train.py exited, every actor of the run (slime's, and the sandbox pool's workers it owned) was dead,
    the pool workers' processes gone, and no sandbox interpreter was left on the machine. (slime's own actors'
    processes are slime's and Ray's to end: Ray marks them DEAD at once, and under load CI saw
    MegatronTrainRayActor's process outlive train.py by over a minute.)"""
    assert smoke.ray.of_class("RolloutManager"), "Ray recorded no actor of the run"
    for actor in smoke.ray.actors:
        assert actor.state == "DEAD", actor
    for worker in smoke.ray.of_class("SandboxWorker"):
        assert not worker.process_alive, worker
    assert smoke.ray.sandbox_processes == (), smoke.ray.sandbox_processes


def _eval_calls(smoke: SmokeRun) -> list[int]:
    """The rollout ids slime's train.py evaluates at, in order: before the first step, then after each step its
    ``--eval-interval`` ends (``should_run_periodic_action``; the epoch boundary counts only when ``--num-epoch``
    sets the number of steps, and the smoke sets ``--num-rollout``)."""
    interval = smoke.config["eval_interval"]
    steps = range(smoke.config["num_rollout"])
    return [0, *(r for r in steps if (r + 1) % interval == 0)]


def test_eval_ran_through_slimes_eval_path_with_the_eval_reward(smoke: SmokeRun) -> None:
    size = smoke.config["eval_prompts"] * smoke.config["eval_n_samples"]
    calls = _eval_calls(smoke)
    assert sorted(smoke.evals) == sorted(set(calls))
    plugin_rows = [r for r in smoke.wandb_rows if "eval/strands/aime/accuracy" in r]
    slime_rows = [r for r in smoke.wandb_rows if "eval/aime" in r]
    assert len(plugin_rows) == len(slime_rows) == len(calls)
    for rollout_id, samples in smoke.evals.items():
        last = max(i for i, call in enumerate(calls) if call == rollout_id)  # a later eval rewrote the file
        assert len(samples) == size, f"eval {rollout_id}: {len(samples)} samples"
        assert all(s.reward in (0.0, 1.0) for s in samples), "eval rewards are plain accuracy"
        accuracy = sum(s.reward == 1.0 for s in samples) / size
        assert plugin_rows[last]["eval/strands/aime/accuracy"] == pytest.approx(accuracy)
        assert plugin_rows[last]["eval/strands/aime/samples"] == size
        assert slime_rows[last]["eval/aime"] == pytest.approx(accuracy)
        k = 1
        while k <= smoke.config["eval_n_samples"]:
            assert f"eval/strands/aime/pass@{k}" in plugin_rows[last]
            k *= 2


def test_the_plugins_rollout_metrics_reached_wandb(smoke: SmokeRun) -> None:
    rows = [r for r in smoke.wandb_rows if "rollout/strands/samples" in r]
    assert len(rows) == smoke.config["num_rollout"]
    for row, (rollout_id, samples) in zip(rows, sorted(smoke.train.items()), strict=True):
        records = [SmokeRun.record(s) for s in samples]
        assert row["rollout/strands/samples"] == len(samples), rollout_id
        assert row["rollout/strands/continued_episodes"] == sum(1 for r in records if r.continuations)
        assert row["rollout/strands/tool_calls_mean"] == pytest.approx(
            sum(r.tool_calls for r in records) / len(records)
        )
        assert any(key.startswith("rollout/strands/termination/") for key in row)


def _plugin_flags(args: list[str]) -> list[str]:
    """The plugin's flags (and values) in a train.py command line."""
    out = []
    for i, arg in enumerate(args):
        if arg.startswith("--custom-") or arg == "--log-passrate":
            out.append(arg)
            if arg != "--log-passrate":
                out.append(args[i + 1])
    return out


def test_the_smoke_ran_the_recipes_plugin_flags_and_settings(smoke: SmokeRun) -> None:
    smoke_cmd = shlex.split((smoke.out / "run_config" / "command.txt").read_text().removeprefix("+ "))
    recipe = subprocess.run(
        ["bash", str(REPO / "scripts" / "strands_qwen3_8b.sh")],
        env={"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "AUTO_PREPARE": "0", "HOME": str(smoke.out)},
        capture_output=True,
        text=True,
        check=True,
    )
    submit = next(line for line in recipe.stdout.splitlines() if "train.py" in line)
    recipe_flags = _plugin_flags(shlex.split(submit.removeprefix("+ ")))
    settings_path = smoke.config["plugin_config"]
    assert _plugin_flags(smoke_cmd) == [
        settings_path if f.endswith("strands_math.yaml") else f for f in recipe_flags
    ]
    # The settings: the recipe's file, with the smoke's overlay and nothing else changed.
    recipe_settings = yaml.safe_load((REPO / "configs" / "strands_math.yaml").read_text())["strands"]
    overlay = yaml.safe_load(Path(smoke.config["smoke_settings"]).read_text())["strands"]
    ran = yaml.safe_load(Path(settings_path).read_text())["strands"]
    assert {k: v for k, v in ran.items() if k not in overlay} == {
        k: v for k, v in recipe_settings.items() if k not in overlay
    }
    for key, value in overlay.items():
        assert ran[key] == _overlaid(recipe_settings[key], value), key


def _overlaid(recipe: object, overlay: object) -> object:
    """The recipe's value with the overlay's on top: mappings key by key, anything else replaced."""
    if isinstance(recipe, dict) and isinstance(overlay, dict):
        return {**recipe, **{k: _overlaid(recipe.get(k), v) for k, v in overlay.items()}}
    return overlay


def test_each_sample_ran_on_the_event_loop_of_slimes_rollout_path(smoke: SmokeRun) -> None:
    """Which thread's event loop called ``generate`` (the record's ``rollout_thread``): under slime's default
    rollout function, training and eval alike on slime's one loop (its ``async_utils`` thread); under the
    fully-async one, every training sample on its worker's loop, on a thread of its own, and eval on slime's
    main loop, in the same process."""
    train = Counter(SmokeRun.record(s).rollout_thread for step in smoke.train.values() for s in step)
    evals = Counter(SmokeRun.record(s).rollout_thread for step in smoke.evals.values() for s in step)
    assert None not in train and None not in evals, (train, evals)
    assert len(evals) == 1 and FULLY_ASYNC_THREAD not in evals, evals
    log = (smoke.out / "train.log").read_text()
    if not smoke.fully_async:
        assert train.keys() == evals.keys(), (train, evals)
        assert "fully-async" not in log
        return
    assert set(train) == {FULLY_ASYNC_THREAD}, train
    # slime's own account: its worker started once and fed every step
    assert log.count("starting fully-async rollout worker") == 1
    for rollout_id in smoke.train:
        assert re.search(rf"fully-async rollout {rollout_id}: done in", log), rollout_id


def test_the_fully_async_worker_handed_aborted_groups_back_and_trained_each_once(
    async_smoke: SmokeRun,
) -> None:
    """Each abort between steps cut episodes in flight on the fully-async worker's loop: their groups went back to
    slime's data buffer ABORTED (never to training), came back at a later step, and each was trained once, whole
    (the tests above: one step per save, whole groups, no index twice, every continuation token-exact)."""
    smoke = async_smoke
    records = [SmokeRun.record(s) for step in smoke.train.values() for s in step]
    assert all(s.status.name != "ABORTED" for step in smoke.train.values() for s in step)
    continued = [r for r in records if r.continuations]
    assert continued, "no training episode continued after an abort between steps"
    assert sum(r.turns_saved for r in continued) > 0
    # every abort found generations in flight: a request that reached the server after the abort before it
    # (the proxy logs by arrival) was answered `abort`
    aborted = [a.order for a in smoke.log.answers if a.finish == "abort"]
    for before, order in zip((-1, *smoke.log.abort_orders), smoke.log.abort_orders, strict=False):
        assert any(before < a < order for a in aborted), (
            f"no request cut by the abort at log position {order}"
        )


def test_episodes_ran_on_the_rollout_workers_one_pool_per_event_loop(workers_smoke: SmokeRun) -> None:
    """``rollout_workers``: every episode on one of the workers, a pool per event loop that ran episodes (slime's
    fully-async rollout runs two), each pool's start logged once by slime's RolloutManager, every worker in
    train.py's job with the CPUs its settings ask and gone once train.py exited, and the pool's counts in slime's
    rollout log: nothing lost, retried or failed, at least one episode per saved sample."""
    smoke = workers_smoke
    settings = smoke.settings.rollout_workers
    loops = {SmokeRun.record(s).rollout_thread for s in smoke.every_sample()}
    workers = smoke.ray.of_class("RolloutWorker")
    assert len(workers) == settings.count * len(loops), (len(workers), loops)
    (manager,) = smoke.ray.of_class("RolloutManager")
    for worker in workers:
        assert worker.job_id == manager.job_id
        assert worker.required_resources == {"CPU": settings.cpus_per_worker}
        assert worker.state == "DEAD" and not worker.process_alive, worker
    log = (smoke.out / "train.log").read_text()
    started = re.findall(r"\(RolloutManager pid=(\d+)\).*slime-strands: (\d+) rollout workers x", log)
    assert [(int(pid), int(n)) for pid, n in started] == [(manager.pid, settings.count)] * len(loops), started
    rows = [r for r in smoke.wandb_rows if "rollout/strands/workers/count" in r]
    assert len(rows) == smoke.config["num_rollout"]
    last = rows[-1]
    assert last["rollout/strands/workers/count"] == len(workers)
    for key in ("lost_workers", "retried", "failed"):
        assert last[f"rollout/strands/workers/{key}"] == 0, key
    episodes = sum(last[f"rollout/strands/workers/episodes/{i}"] for i in range(len(workers)))
    saved = sum(len(step) for step in smoke.train.values()) + len(smoke.evals[0])
    assert episodes >= saved, (episodes, saved)
