"""The CPU smoke's parts that need no run: the tiny model's Megatron flags, the settings overlay, the cpu accelerator
and the Megatron import stubs of the test harness, the record of sandbox processes left, and the script's refusals
before it builds anything."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import pytest
import yaml
from ray_kit import alive, descendants, wait_until
from real_sglang.tiny_model import make_tiny_model
from sandbox_isolation import start_or_skip

from slime_strands.sandbox import Sandbox
from slime_strands.settings import SandboxSettings

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "scripts" / "slime_cpu_smoke.sh"
HARNESS = REPO / "tests" / "slime_train" / "harness"
RENDER = REPO / "scripts" / "slime_cpu" / "render_settings.py"
RECORD = REPO / "scripts" / "slime_cpu" / "record_ray_state.py"


def _model_args() -> dict[str, str | bool]:
    out = subprocess.run(
        ["bash", "-c", f'source {REPO}/scripts/models/tiny-qwen3.sh && printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")[:-1]
    args: dict[str, str | bool] = {}
    for i, word in enumerate(out):
        if word.startswith("--"):
            following = out[i + 1] if i + 1 < len(out) else "--"
            args[word] = True if following.startswith("--") else following
    return args


def test_the_tiny_models_megatron_flags_match_its_config(tmp_path: Path) -> None:
    config = json.loads((make_tiny_model(tmp_path) / "config.json").read_text())
    args = _model_args()
    assert args["--num-layers"] == str(config["num_hidden_layers"])
    assert args["--hidden-size"] == str(config["hidden_size"])
    assert args["--ffn-hidden-size"] == str(config["intermediate_size"])
    assert args["--num-attention-heads"] == str(config["num_attention_heads"])
    assert args["--num-query-groups"] == str(config["num_key_value_heads"])
    assert args["--kv-channels"] == str(config["head_dim"])
    assert args["--vocab-size"] == str(config["vocab_size"])
    assert float(str(args["--norm-epsilon"])) == config["rms_norm_eps"]
    assert float(str(args["--rotary-base"])) == config["rope_theta"]
    assert ("--untie-embeddings-and-output-weights" in args) is not config["tie_word_embeddings"]


def _render(tmp_path: Path, overlay: dict) -> subprocess.CompletedProcess[str]:
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    return subprocess.run(
        [sys.executable, str(RENDER), str(REPO / "configs" / "strands_math.yaml"), str(tmp_path / "overlay.yaml"),
         str(tmp_path / "out.yaml")],
        capture_output=True,
        text=True,
    )  # fmt: skip


def test_the_overlay_changes_only_its_own_keys(tmp_path: Path) -> None:
    overlay = {"strands": {"sampling_params": {"regex": "Answer: 1"}, "sandbox": {"timeout_s": 3.0}}}
    assert _render(tmp_path, overlay).returncode == 0
    base = yaml.safe_load((REPO / "configs" / "strands_math.yaml").read_text())["strands"]
    out = yaml.safe_load((tmp_path / "out.yaml").read_text())["strands"]
    assert out["sampling_params"] == {"regex": "Answer: 1"}
    assert out["sandbox"] == {**base["sandbox"], "timeout_s": 3.0}
    assert {k: v for k, v in out.items() if k not in ("sampling_params", "sandbox")} == {
        k: v for k, v in base.items() if k not in ("sampling_params", "sandbox")
    }


def test_an_overlay_the_plugin_rejects_stops_with_one_line_and_no_file(tmp_path: Path) -> None:
    result = _render(tmp_path, {"strands": {"max_tool_iterz": 3}})
    assert result.returncode == 2
    assert "max_tool_iterz" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.yaml").exists()


def _load_script(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_ray_record_finds_a_live_sandbox_interpreter_and_none_once_it_stopped() -> None:
    """The smoke's leftover check can fail: record_ray_state.py finds the sandbox processes (interpreter and its
    isolation launcher) that this python started, while they live, and none of them once the sandbox stopped."""
    record = _load_script(RECORD)
    box = Sandbox(SandboxSettings(preload_modules=()))
    await start_or_skip(box)
    try:
        mine = descendants(os.getpid())
        found = {p["pid"] for p in record._sandbox_processes() if p["pid"] in mine}
        assert found, "the sandbox's interpreter was not found"
    finally:
        await box.aclose()
    await wait_until(lambda: not any(alive(pid) for pid in found), "the sandbox's processes ending")
    assert not found & {p["pid"] for p in record._sandbox_processes()}


def _slime_source() -> Path:
    source = Path(os.environ.get("SLIME_STRANDS_SLIME_SOURCE") or REPO.parent / "shared" / "slime")
    if not (source / "slime" / "utils" / "accelerator" / "__init__.py").is_file():
        pytest.skip(f"no slime source at {source} (set SLIME_STRANDS_SLIME_SOURCE)")
    return source


def _in_slime(code: str, *, switched_on: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SLIME_STRANDS_CPU_ACCELERATOR"}
    env["PYTHONPATH"] = os.pathsep.join([str(HARNESS), str(HARNESS / "megatron_stub"), str(_slime_source())])
    if switched_on:
        env["SLIME_STRANDS_CPU_ACCELERATOR"] = "1"
    prelude = (
        "import slime_cpu_accelerator; slime_cpu_accelerator.install()\n"  # what the driver venv's .pth does
    )
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, env=env)


def test_the_harness_registers_a_cpu_accelerator_in_slime_only_when_switched_on() -> None:
    code = (
        "import json\nfrom slime.utils import accelerator\nacc = accelerator.get_accelerator()\n"
        "print(json.dumps([acc.name, acc.device_type, acc.device_count(), acc.communication_backend(),"
        " acc.mem_get_info()]))"
    )
    on = _in_slime(code, switched_on=True)
    assert on.returncode == 0, on.stderr[-2000:]
    assert json.loads(on.stdout.splitlines()[-1]) == ["cpu", "cpu", 1, "gloo", [0, 0]]
    off = _in_slime(code, switched_on=False)
    assert off.returncode != 0
    assert "No usable accelerator" in off.stderr


@pytest.mark.parametrize(
    "call",
    [
        "from megatron.legacy import fused_kernels; fused_kernels.load()",
        "from megatron.legacy.model.module import param_is_not_shared; param_is_not_shared(None)",
        "from megatron.rl.parallel_utils import build_inference_pg_collection; build_inference_pg_collection()",
    ],
)
def test_the_megatron_import_stubs_raise_when_called(call: str) -> None:
    result = _in_slime(call, switched_on=False)
    assert result.returncode != 0
    assert "import-only stub" in result.stderr


def test_the_smoke_needs_an_out_dir() -> None:
    result = subprocess.run(["bash", str(SMOKE)], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage: bash scripts/slime_cpu_smoke.sh OUT_DIR" in result.stderr


def test_the_smoke_refuses_a_folder_it_did_not_write_and_leaves_it_alone(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    result = subprocess.run(["bash", str(SMOKE), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 1
    assert "is not empty and not an earlier smoke's" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


PROGRESS = REPO / "scripts" / "lib" / "progress.sh"
EXPECTED_LINES = REPO / "scripts" / "slime_cpu" / "expected_lines.sh"
_GUARD_S = 120.0
"""How long a step of a script may take before the test fails as hung (never reached unless broken)."""


def _carrying(entry: bytes) -> set[int]:
    """The live processes whose environment holds ``entry`` (a marker the test's script passed on)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if entry in environ:
                found.add(int(proc.name))
    return found


def _wait_for(path: Path, text: str) -> None:
    deadline = time.monotonic() + _GUARD_S
    while text not in path.read_text():
        if time.monotonic() > deadline:
            pytest.fail(f"hung: {text!r} not written within {_GUARD_S:g} s; wrote {path.read_text()!r}")
        time.sleep(0.05)


def test_the_progress_ticker_says_the_phase_and_its_time_and_leaves_no_process(tmp_path: Path) -> None:
    """A phase with a ticker every second prints the phase, its elapsed time and its status; once the phase has
    stopped the ticker, no process of it is left (the ticker's subshell nor its sleep)."""
    log = tmp_path / "stderr.txt"
    token = uuid.uuid4().hex
    script = f"""set -euo pipefail
source {PROGRESS}
where() {{ echo "step 3 of 4"; }}
SS_TICK_S=1 ss_tick_start "warming up the model" where
until [ "$(grep -c 'warming up' {log})" -ge 3 ]; do sleep 0.05; done
ss_tick_stop
echo "phase over: $(ss_tick_elapsed 42) $(ss_tick_elapsed 90) $(ss_tick_elapsed 3600)" >&2
exec sleep 600
"""
    with log.open("w") as err:
        process = subprocess.Popen(
            ["bash", "-c", script], stderr=err, env={**os.environ, "SS_TICK_TEST": token}
        )
    try:
        _wait_for(log, "phase over")
        left = _carrying(f"SS_TICK_TEST={token}".encode())
        assert left == {process.pid}, "a process of the ticker outlived ss_tick_stop"
    finally:
        process.kill()
        process.wait()
    *ticks, last = log.read_text().splitlines()
    assert last == "phase over: 42s 1m30s 60m00s"
    elapsed = []
    for line in ticks:
        match = re.fullmatch(
            r"\[slime-strands\] \.\.\. warming up the model: (\d+)s so far \(step 3 of 4\)", line
        )
        assert match, line
        elapsed.append(int(match[1]))
    assert len(elapsed) >= 3 and elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0]


_SAMPLE_LINES = {  # each expected line as its program writes it, and the log the smoke finds it in
    "aiohttp": (
        "server.log",
        "Error handling request from 127.0.0.1\nTraceback (most recent call last):\n"
        "aiohttp.http_exceptions.BadHttpMessage: 400, message:\n  Pause on PRI/Upgrade:\n\n"
        "    b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n'\n      ^\n",
    ),
    "Ray": (
        "ray.log",
        "2026-12-03 07:45:01,123\tERROR node.py:721 -- Failed to mark the local node as draining on SIGTERM; "
        "proceeding with immediate shutdown.\n",
    ),
    "Strands": (
        "train.log",
        "(RolloutManager pid=4242) exception=<GenerationAbortedError> | event loop cycle failed\n",
    ),
    "transformers": (
        "train.log",
        "The tokenizer you are loading from '/tmp/out/model' with an incorrect regex pattern: https://hf.co/x. "
        "This will lead to incorrect tokenization.\n",
    ),
}
_NOISE = "INFO everything is fine\nWARNING a real warning\n"


def _expected_summary(out: Path) -> list[str]:
    result = subprocess.run(
        ["bash", "-c", f'set -euo pipefail; source "{EXPECTED_LINES}"; smoke_expected_lines "{out}"'],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and result.stdout == "", result.stderr
    return result.stderr.splitlines()


@pytest.mark.parametrize("program", sorted(_SAMPLE_LINES))
def test_the_smokes_summary_names_an_expected_line_found_and_no_other(tmp_path: Path, program: str) -> None:
    for log in ("train.log", "server.log", "serve.log", "ray.log"):
        (tmp_path / log).write_text(_NOISE)
    log, sample = _SAMPLE_LINES[program]
    (tmp_path / log).write_text(_NOISE + sample + _NOISE + sample)
    header, *named = _expected_summary(tmp_path)
    assert header == "[slime-strands] lines in the logs that read as failures but are expected:"
    assert len(named) == 1, named
    assert named[0].startswith(f"[slime-strands]   2 x {program} "), named
    assert f" ({log}): " in named[0], named  # where, and what it means
    assert len(named[0].split(": ", 1)[1]) > 40, named


def test_the_smokes_summary_counts_each_expected_line_in_every_log_and_says_nothing_without_one(
    tmp_path: Path,
) -> None:
    assert _expected_summary(tmp_path) == []  # no logs
    for log in ("train.log", "server.log", "serve.log", "ray.log"):
        (tmp_path / log).write_text(_NOISE)
    assert _expected_summary(tmp_path) == []
    (tmp_path / "train.log").write_text(_SAMPLE_LINES["Strands"][1] * 3 + _SAMPLE_LINES["transformers"][1])
    (tmp_path / "serve.log").write_text(_SAMPLE_LINES["Strands"][1])
    _, *named = _expected_summary(tmp_path)
    assert [line.split(" (")[0] for line in named] == [
        '[slime-strands]   4 x Strands "exception=<GenerationAbortedError> | event loop cycle failed"',
        '[slime-strands]   1 x transformers "incorrect regex pattern"',
    ]
    assert "(train.log serve.log)" in named[0]


def test_the_smokes_configurations_are_the_ones_its_tests_know(tmp_path: Path) -> None:
    """An unknown SMOKE_CONFIG stops the smoke before it builds anything, naming the configurations it has: the
    ones tests/slime_train checks (smoke_output.CONFIGURATIONS) and CI runs (.ci/run)."""
    from slime_train.smoke_output import CONFIGURATIONS

    env = {**os.environ, "SMOKE_CONFIG": "nope"}
    result = subprocess.run(["bash", str(SMOKE), str(tmp_path)], capture_output=True, text=True, env=env)
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if "SMOKE_CONFIG=nope" in line]
    assert line.split("configurations are ", 1)[1].split(" and ") == sorted(CONFIGURATIONS)
    assert list(tmp_path.iterdir()) == []
    (ci,) = re.findall(r'^smoke_configs="([^"]*)"$', (REPO / ".ci" / "run").read_text(), re.MULTILINE)
    assert sorted(ci.split()) == sorted(CONFIGURATIONS)
