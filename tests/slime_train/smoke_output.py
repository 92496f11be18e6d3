"""What one ``scripts/slime_cpu_smoke.sh`` run left in its OUT_DIR, loaded for the tier's tests, and the check of
a saved Sample against what the real server answered.

The rollout files are slime's ``--save-debug-rollout-data`` (``torch.save`` of ``Sample.to_dict()`` per sample),
read back into the project's field-for-field copy of slime's ``Sample``. ``requests.jsonl`` is the recording
proxy's log (``serve.py``): every request slime's router sent the server, in arrival order, with its answer.
``ray_state.json`` is Ray's account of the smoke's cluster once train.py had exited
(``scripts/slime_cpu/record_ray_state.py``).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from slime_strands.agent.record import EpisodeRecord
from slime_strands.settings import PluginSettings
from slime_strands.testing.slime_types import Sample

__all__ = [
    "CONFIGURATIONS",
    "FULLY_ASYNC_THREAD",
    "Answer",
    "Configuration",
    "RayActor",
    "RayState",
    "ServerLog",
    "SmokeRun",
    "served_turns",
]


@dataclass(frozen=True)
class Configuration:
    """One of the smoke's named configurations (``SMOKE_CONFIG``, scripts/slime_cpu_smoke.sh), as its tests know
    it before it has run (which tests apply to it); :meth:`SmokeRun.load` checks a run against it."""

    rollout: str
    """``sync`` (slime's default rollout function) or ``fully_async`` (slime's fully-async one)."""
    sandbox_pool: bool
    """The model's programs run on the sandbox's Ray pool (``sandbox.placement: ray``)."""
    rollout_workers: bool
    """Episodes run on the plugin's rollout workers (``rollout_workers.count`` > 0)."""


CONFIGURATIONS = {
    "sync": Configuration(rollout="sync", sandbox_pool=True, rollout_workers=False),
    "async_workers": Configuration(rollout="fully_async", sandbox_pool=False, rollout_workers=True),
}
FULLY_ASYNC_THREAD = "fully-async-rollout"
"""The name slime's fully-async rollout gives the thread of its worker's event loop."""

_STEP_FILE = re.compile(r"rollout_(eval_)?(\d+)\.pt$")


@dataclass(frozen=True)
class Answer:
    """One /generate the server answered: what was sent and what it wrote."""

    order: int
    """Position in the proxy's log (arrival order of the requests)."""
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: str


@dataclass(frozen=True)
class ServerLog:
    """The proxy's log: the answered generations by their input, and where slime's aborts fell."""

    answers: tuple[Answer, ...]
    by_input: dict[tuple[int, ...], tuple[Answer, ...]]
    abort_orders: tuple[int, ...]
    """Log positions of the ``/abort_request`` calls (slime's abort at the end of a rollout step)."""

    @classmethod
    def load(cls, path: Path) -> ServerLog:
        answers: list[Answer] = []
        aborts: list[int] = []
        for order, line in enumerate(path.read_text().splitlines()):
            row = json.loads(line)
            if row["path"] == "/abort_request":
                aborts.append(order)
            answer = row.get("answer")
            if row["path"] != "/generate" or row.get("status") != 200 or not isinstance(answer, dict):
                continue
            meta = answer["meta_info"]
            pairs = meta.get("output_token_logprobs") or []
            answers.append(
                Answer(
                    order=order,
                    input_ids=tuple(row["body"]["input_ids"]),
                    output_ids=tuple(int(p[1]) for p in pairs),
                    logprobs=tuple(float(p[0]) for p in pairs),
                    finish=meta["finish_reason"]["type"],
                )
            )
        by_input: dict[tuple[int, ...], list[Answer]] = defaultdict(list)
        for a in answers:
            by_input[a.input_ids].append(a)
        return cls(tuple(answers), {k: tuple(v) for k, v in by_input.items()}, tuple(aborts))


@dataclass(frozen=True)
class RayActor:
    """One actor of the smoke's Ray cluster, as Ray's state API reported it after train.py exited."""

    actor_id: str
    class_name: str
    state: str
    pid: int | None
    job_id: str
    node_id: str | None
    required_resources: dict[str, float]
    process_alive: bool
    """Whether its process still existed when the state was recorded."""


@dataclass(frozen=True)
class RayState:
    """The cluster once train.py had exited, before the smoke stopped it."""

    actors: tuple[RayActor, ...]
    runs: tuple[dict[str, Any], ...]
    """Every ``SandboxWorker.run`` task Ray recorded (one execution on a pool worker): ``state``, ``actor_id``,
    ``worker_pid``."""
    sandbox_processes: tuple[dict[str, Any], ...]
    """Sandbox interpreters (and their launchers) of the driver venv still alive: ``pid``, ``argv_head``."""

    @classmethod
    def load(cls, path: Path) -> RayState:
        raw = json.loads(path.read_text())
        names = [f.name for f in fields(RayActor)]
        actors = tuple(
            RayActor(**{**{k: a[k] for k in names}, "required_resources": a["required_resources"] or {}})
            for a in raw["actors"]
        )
        return cls(actors, tuple(raw["runs"]), tuple(raw["sandbox_processes"]))

    def of_class(self, name: str) -> list[RayActor]:
        return [a for a in self.actors if a.class_name == name]


def served_turns(sample: Any, log: ServerLog, *, masked_before: int = 0) -> list[Answer]:
    """The server answers the sample's trajectory is made of, in order, checking on the way that every trained
    token (loss mask 1) is a token the server wrote for a request whose input was the trajectory up to it, with
    the server's logprob, that every other token (prompt, tool output, template) is masked with logprob 0.0, and
    that the trajectory ends on a model output. AssertionError names the first position that breaks it.

    ``masked_before``: response positions ``--mask-offpolicy-in-partial-rollout`` took out of the loss."""
    tokens = list(sample.tokens)
    n = sample.response_length
    prompt_len = len(tokens) - n
    mask, logprobs = list(sample.loss_mask), list(sample.rollout_log_probs)
    turns: list[Answer] = []
    pos = prompt_len
    while pos < len(tokens):
        matches = [
            a
            for a in log.by_input.get(tuple(tokens[:pos]), ())
            if a.output_ids and tuple(tokens[pos : pos + len(a.output_ids)]) == a.output_ids
        ]
        if not matches:
            i = pos - prompt_len
            assert mask[i] == 0, f"response token {i} is trained but no server answer wrote it there"
            assert logprobs[i] == 0.0, f"response token {i} is not the server's but has logprob {logprobs[i]}"
            pos += 1
            continue
        answer = max(matches, key=lambda a: len(a.output_ids))
        start, end = pos - prompt_len, pos - prompt_len + len(answer.output_ids)
        want = [0 if i < masked_before else 1 for i in range(start, end)]
        assert mask[start:end] == want, (
            f"loss mask of the server's output at {start}:{end} is {mask[start:end]}"
        )
        assert logprobs[start:end] == list(answer.logprobs), f"logprobs at {start}:{end} are not the server's"
        turns.append(answer)
        pos += len(answer.output_ids)
    if n:
        assert turns, "a response with no server answer in it"
        assert len(turns[0].input_ids) == prompt_len, "the first request was not the prompt"
        last = turns[-1]
        assert len(last.input_ids) + len(last.output_ids) == len(tokens), (
            "the trajectory ends on no model output"
        )
    return turns


@dataclass(frozen=True)
class SmokeRun:
    out: Path
    config: dict[str, Any]
    """smoke.json: the run's size and files (keys: the smoke script's variable names, lower case)."""
    train: dict[int, list[Sample]]
    """rollout_{id}.pt by rollout id."""
    evals: dict[int, list[Sample]]
    """rollout_eval_{id}.pt by rollout id."""
    log: ServerLog
    wandb_rows: list[dict[str, Any]]
    """wandb_history.jsonl: every row slime's offline wandb runs logged."""
    settings: PluginSettings
    ray: RayState
    """ray_state.json: the cluster after train.py."""

    @property
    def name(self) -> str:
        """The configuration's name (``SMOKE_CONFIG``; an older run without one: ``sync``)."""
        return str(self.config.get("smoke_config") or "sync")

    @property
    def configuration(self) -> Configuration:
        return CONFIGURATIONS[self.name]

    @property
    def fully_async(self) -> bool:
        return self.configuration.rollout == "fully_async"

    @classmethod
    def load(cls, out: Path) -> SmokeRun:
        import torch  # here, not at collection: it takes a second

        config = json.loads((out / "smoke.json").read_text())
        train: dict[int, list[Sample]] = {}
        evals: dict[int, list[Sample]] = {}
        for path in sorted(out.glob("rollout_*.pt")):
            match = _STEP_FILE.search(path.name)
            assert match, path
            saved = torch.load(path, weights_only=False)
            assert saved["rollout_id"] == int(match.group(2)), (
                f"{path.name} holds rollout {saved['rollout_id']}"
            )
            (evals if match.group(1) else train)[int(match.group(2))] = [
                Sample.from_dict(s) for s in saved["samples"]
            ]
        rows = [json.loads(line)["values"] for line in (out / "wandb_history.jsonl").read_text().splitlines()]
        run = cls(
            out=out,
            config=config,
            train=train,
            evals=evals,
            log=ServerLog.load(out / "requests.jsonl"),
            wandb_rows=rows,
            settings=PluginSettings.from_yaml(config["plugin_config"]),
            ray=RayState.load(out / "ray_state.json"),
        )
        known = run.configuration  # a name the tests do not know fails here, with the name
        ran = Configuration(
            rollout=str(config.get("smoke_rollout") or "sync"),
            sandbox_pool=run.settings.sandbox.placement == "ray",
            rollout_workers=run.settings.rollout_workers.count > 0,
        )
        assert ran == known, f"{out}: configuration {run.name} ran as {ran}, its tests expect {known}"
        return run

    def aborts(self) -> list[dict[str, Any]]:
        """aborts.jsonl: the aborts abort_between_steps.py sent between steps (fully-async configurations)."""
        path = self.out / "aborts.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def every_sample(self) -> list[Sample]:
        return [s for step in (*self.train.values(), *self.evals.values()) for s in step]

    @staticmethod
    def record(sample: Sample) -> EpisodeRecord:
        record = EpisodeRecord.of(sample)
        assert record is not None, f"sample {sample.index} carries no episode record"
        return record
