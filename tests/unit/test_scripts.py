"""The launch and checkpoint scripts: syntax, shellcheck, and what DRY_RUN=1 would run.

Every run here is hermetic: SLIME_DIR / MODELS_DIR / DATA_DIR point into tmp_path, PATH is a
controlled directory (fake `hf`, `nvidia-smi`, ... where a test needs them), and nothing real is
ever started (DRY_RUN=1, or a preflight that fails before anything runs).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slime_strands.settings import PluginSettings

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
ALL_SCRIPTS = sorted(SCRIPTS.rglob("*.sh"))
TOP_SCRIPTS = sorted(SCRIPTS.glob("*.sh"))
MODEL_SCRIPTS = {"8b": SCRIPTS / "strands_qwen3_8b.sh", "4b": SCRIPTS / "strands_qwen3_4b.sh"}

# slime's scripts/models/qwen3-8B.sh / qwen3-4B.sh (the 4B ties its embeddings).
QWEN3_8B_ARGS = {
    "--num-layers": "36",
    "--hidden-size": "4096",
    "--ffn-hidden-size": "12288",
    "--num-attention-heads": "32",
    "--num-query-groups": "8",
    "--kv-channels": "128",
    "--vocab-size": "151936",
    "--norm-epsilon": "1e-6",
    "--normalization": "RMSNorm",
    "--rotary-base": "1000000",
}
QWEN3_4B_ARGS = {**QWEN3_8B_ARGS, "--hidden-size": "2560", "--ffn-hidden-size": "9728"}
MODEL_FLAGS = [
    "--swiglu",
    "--group-query-attention",
    "--use-rotary-position-embeddings",
    "--disable-bias-linear",
]
MODEL_FLAGS += ["--qk-layernorm"]


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def _fake_tool(bin_dir: Path, name: str, body: str = "exit 0") -> Path:
    path = bin_dir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def sandbox(tmp_path: Path) -> dict:
    """A hermetic environment: no slime, no GPUs, no hub tools unless a test adds fakes to bin/."""
    return _hermetic_env(tmp_path)


def _hermetic_env(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return {
        "env": {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "PYTHON": sys.executable,
            "SLIME_DIR": str(tmp_path / "no-slime"),
            "MEGATRON_DIR": str(tmp_path / "no-megatron"),
            "MODELS_DIR": str(tmp_path / "models"),
            "DATA_DIR": str(tmp_path / "data"),
        },
        "bin": bin_dir,
        "tmp": tmp_path,
    }


@pytest.fixture(scope="module")
def dry_8b(tmp_path_factory) -> tuple[dict, subprocess.CompletedProcess]:
    """One DRY_RUN of the 8B recipe with nothing prepared, shared by the tests that only read it."""
    box = _hermetic_env(tmp_path_factory.mktemp("dry8b"))
    return box, run(MODEL_SCRIPTS["8b"], box["env"], DRY_RUN="1")


def run(script: Path, env: dict, *args: str, **overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *args],
        env={**env, **overrides},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=env.get("HOME"),
    )


def commands(stdout: str) -> list[list[str]]:
    """The commands a script printed (lines starting with '+ '), split like a shell would."""
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


def find_command(cmds: list[list[str]], *prefix: str) -> list[str]:
    matches = [c for c in cmds if c[: len(prefix)] == list(prefix)]
    assert matches, f"no command starting with {prefix} in {cmds}"
    return matches[0]


def train_args(stdout: str) -> list[str]:
    submit = find_command(commands(stdout), "ray", "job", "submit")
    rest = submit[submit.index("--") + 1 :]
    assert rest[1].endswith("/train.py"), rest[:2]
    return rest[2:]


def value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} appears {args.count(flag)} times"
    return args[args.index(flag) + 1]


def complete_inputs(sandbox: dict, model: str = "Qwen3-8B", config: dict | None = None) -> None:
    """Create the checkpoint and data files a run needs, so nothing is auto-prepared."""
    hf = Path(sandbox["env"]["MODELS_DIR"]) / "Qwen" / model
    hf.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps(config or {"rope_theta": 1000000, "vocab_size": 151936}))
    dist = hf.parent / f"{model}_torch_dist"
    dist.mkdir()
    (dist / "latest_checkpointed_iteration.txt").write_text("release")
    data = Path(sandbox["env"]["DATA_DIR"])
    data.mkdir()
    for name in ("dapo-math-17k.jsonl", "aime-2024.jsonl"):
        (data / name).write_text('{"prompt": "1+1?", "label": "2"}\n')


# --------------------------------------------------------------------------------------------------
# static checks
# --------------------------------------------------------------------------------------------------


def test_expected_scripts_exist():
    names = {p.relative_to(SCRIPTS).as_posix() for p in ALL_SCRIPTS}
    assert {
        "strands_qwen3_8b.sh",
        "strands_qwen3_4b.sh",
        "strands_qwen3_8b_code.sh",
        "download_model.sh",
        "convert_hf_to_torch_dist.sh",
        "convert_torch_dist_to_hf.sh",
        "prepare_data.sh",
        "join_worker.sh",
        "lib/common.sh",
        "models/qwen3-8B.sh",
        "models/qwen3-4B.sh",
    } <= names


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: p.relative_to(SCRIPTS).as_posix())
def test_bash_syntax(script: Path):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (CI installs it)")
def test_shellcheck():
    # Every file by name (shellcheck reports only on the files it is given), from the repository root
    # like .ci/run; scripts/.shellcheckrc lets it follow `source lib/common.sh`.
    paths = [str(script.relative_to(REPO)) for script in ALL_SCRIPTS]
    result = subprocess.run(["shellcheck", *paths], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_shellcheck_disable_is_explained():
    for script in ALL_SCRIPTS:
        for line in script.read_text().splitlines():
            if "shellcheck disable" in line or "shellcheck source=/dev/null" in line:
                assert re.search(r"#.*#\s*\S", line), f"{script}: unexplained directive: {line}"


def test_no_script_kills_unrelated_processes():
    for script in ALL_SCRIPTS:
        code = [line.split("#", 1)[0] for line in script.read_text().splitlines()]
        for line in code:
            assert not re.search(r"\b(pkill|killall)\b|kill\s+-9", line), f"{script}: {line}"


def test_top_level_scripts_are_strict_and_executable():
    for script in TOP_SCRIPTS:
        text = script.read_text()
        assert text.startswith("#!/usr/bin/env bash\n"), script
        assert "set -euo pipefail" in text, script
        assert os.access(script, os.X_OK), f"{script} is not executable"


def test_model_scripts_are_thin():
    # The recipe lives in scripts/lib/common.sh; each model script is only its configuration.
    for script in MODEL_SCRIPTS.values():
        lines = [
            ln for ln in script.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")
        ]
        assert len(lines) <= 15, f"{script} has {len(lines)} lines of code"


# --------------------------------------------------------------------------------------------------
# the training recipe (DRY_RUN)
# --------------------------------------------------------------------------------------------------


def test_dry_run_8b_prints_the_recipe(dry_8b):
    sandbox, result = dry_8b
    assert result.returncode == 0, result.stderr
    args = train_args(result.stdout)

    # The plugin.
    assert value(args, "--custom-generate-function-path") == "slime_strands.rollout.generate"
    assert value(args, "--custom-rm-path") == "slime_strands.reward.math_reward"
    assert (
        value(args, "--custom-reward-post-process-path") == "slime_strands.reward_norm.post_process_rewards"
    )
    assert value(args, "--custom-rollout-log-function-path") == "slime_strands.metrics.log_rollout"
    assert value(args, "--custom-eval-rollout-log-function-path") == "slime_strands.metrics.log_eval_rollout"
    assert "--log-passrate" in args
    assert "--apply-chat-template" not in args
    assert value(args, "--input-key") == "prompt"
    assert value(args, "--label-key") == "label"
    # The recipe.
    assert value(args, "--n-samples-per-prompt") == "8"
    assert value(args, "--rollout-batch-size") == "16"
    assert value(args, "--global-batch-size") == "128"
    assert value(args, "--rollout-max-response-len") == "16384"
    assert value(args, "--rollout-temperature") == "1"
    assert value(args, "--advantage-estimator") == "grpo"
    assert value(args, "--eps-clip") == "0.2"
    assert value(args, "--eps-clip-high") == "0.28"
    assert value(args, "--lr") == "1e-6"
    assert value(args, "--tensor-model-parallel-size") == "2"
    assert value(args, "--max-tokens-per-gpu") == "18432"
    assert value(args, "--rollout-num-gpus-per-engine") == "2"
    assert value(args, "--sglang-mem-fraction-static") == "0.4"
    assert {"--sequence-parallel", "--use-dynamic-batch-size", "--balance-data", "--colocate"} <= set(args)
    assert value(args, "--actor-num-nodes") == "1"
    assert value(args, "--actor-num-gpus-per-node") == "8"
    assert value(args, "--num-gpus-per-node") == "8"
    # Model args (bundled copy, since SLIME_DIR does not exist).
    for flag, expected in QWEN3_8B_ARGS.items():
        assert value(args, flag) == expected, flag
    assert set(MODEL_FLAGS) | {"--untie-embeddings-and-output-weights"} <= set(args)
    # Data and checkpoints follow the env.
    data, models = sandbox["env"]["DATA_DIR"], sandbox["env"]["MODELS_DIR"]
    assert value(args, "--prompt-data") == f"{data}/dapo-math-17k.jsonl"
    assert value(args, "--hf-checkpoint") == f"{models}/Qwen/Qwen3-8B"
    assert value(args, "--ref-load") == f"{models}/Qwen/Qwen3-8B_torch_dist"
    assert value(args, "--save") == value(args, "--load") == f"{models}/Qwen/Qwen3-8B_strands_dapo"
    # wandb without a key: offline.
    assert value(args, "--wandb-mode") == "offline"
    assert "--wandb-key" not in args
    # Ray: our own head, then the job.
    ray_start = find_command(commands(result.stdout), "ray", "start", "--head")
    assert value(ray_start, "--num-gpus") == "8"
    assert "pkill" not in result.stdout + result.stderr


def test_dry_run_config_files_exist_and_load(dry_8b):
    sandbox, result = dry_8b
    args = train_args(result.stdout)
    plugin_config = Path(value(args, "--custom-config-path"))
    assert plugin_config.is_absolute() and plugin_config.is_file()
    assert plugin_config == REPO / "configs" / "strands_math.yaml"
    PluginSettings.from_yaml(plugin_config)
    # The eval config is rendered into the run directory; DRY_RUN shows what it would contain.
    eval_config = value(args, "--eval-config")
    assert (
        eval_config == f"{sandbox['env']['MODELS_DIR']}/Qwen/Qwen3-8B_strands_dapo/run_config/eval_aime.yaml"
    )
    assert value(args, "--eval-interval") == "20"
    rendered = result.stderr.split(f"would write {eval_config}:", 1)[1]
    doc = yaml.safe_load("\n".join(line[4:] for line in rendered.splitlines() if line.startswith("    ")))
    (aime,) = doc["eval"]["datasets"]
    assert aime["path"] == f"{sandbox['env']['DATA_DIR']}/aime-2024.jsonl"
    assert aime["custom_rm_path"] == "slime_strands.reward.accuracy"


def test_dry_run_4b_variant(sandbox):
    result = run(MODEL_SCRIPTS["4b"], sandbox["env"], DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    args = train_args(result.stdout)
    for flag, expected in QWEN3_4B_ARGS.items():
        assert value(args, flag) == expected, flag
    assert "--untie-embeddings-and-output-weights" not in args  # Qwen3-4B ties its embeddings
    assert value(args, "--actor-num-gpus-per-node") == "4"
    assert value(args, "--num-gpus-per-node") == "4"
    assert value(args, "--rollout-max-response-len") == "8192"
    assert value(args, "--max-tokens-per-gpu") == "9216"
    assert value(args, "--hf-checkpoint").endswith("/Qwen/Qwen3-4B")
    assert value(args, "--custom-generate-function-path") == "slime_strands.rollout.generate"
    assert value(find_command(commands(result.stdout), "ray", "start", "--head"), "--num-gpus") == "4"
    # What it auto-prepares is the 4B model too (the helpers get the 4B script's settings).
    models = sandbox["env"]["MODELS_DIR"]
    cmds = commands(result.stdout)
    assert find_command(cmds, "hf", "download")[2] == "Qwen/Qwen3-4B"
    convert = next(c for c in cmds if any(a.endswith("tools/convert_hf_to_torch_dist.py") for a in c))
    assert value(convert, "--hidden-size") == "2560"
    assert value(convert, "--save") == f"{models}/Qwen/Qwen3-4B_torch_dist"


def test_dry_run_code_recipe(sandbox):
    """scripts/strands_qwen3_8b_code.sh: the code agent trained on MBPP with code_reward, evaluated on HumanEval."""
    result = run(SCRIPTS / "strands_qwen3_8b_code.sh", sandbox["env"], DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    args = train_args(result.stdout)
    assert value(args, "--custom-rm-path") == "slime_strands.reward.code_reward"
    assert value(args, "--custom-config-path") == str(REPO / "configs" / "strands_code.yaml")
    data = sandbox["env"]["DATA_DIR"]
    assert value(args, "--prompt-data") == f"{data}/mbpp-train.jsonl"
    assert value(args, "--eval-config").endswith("_strands_code/run_config/eval_humaneval.yaml")
    prepares = [c for c in commands(result.stdout) if "data_prep.prepare" in c]
    assert [(value(c, "--dataset"), value(c, "--out")) for c in prepares] == [
        ("mbpp", f"{data}/mbpp-train.jsonl"),
        ("humaneval", f"{data}/humaneval.jsonl"),
    ]
    math = train_args(run(MODEL_SCRIPTS["8b"], sandbox["env"], DRY_RUN="1").stdout)
    assert (
        value(math, "--custom-rm-path") == "slime_strands.reward.math_reward"
    )  # the math recipe keeps its own


def test_dry_run_vlm_geometry_recipe(sandbox):
    """scripts/strands_qwen_vl_geo3k.sh: the same recipe on Geometry3K with its figures, a Qwen3.5-VL model."""
    script = SCRIPTS / "strands_qwen_vl_geo3k.sh"
    result = run(script, sandbox["env"], DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    args = train_args(result.stdout)
    assert json.loads(value(args, "--multimodal-keys")) == {"image": "images"}
    assert args[args.index("--spec") + 1 : args.index("--spec") + 3] == [
        "slime_plugins.models.qwen3_5_vl",
        "get_qwen3_5_vl_model_provider",
    ]
    assert value(args, "--custom-config-path") == str(REPO / "configs" / "strands_geo3k.yaml")
    assert value(args, "--hf-checkpoint").endswith("/Qwen/Qwen3.5-4B")
    data = sandbox["env"]["DATA_DIR"]
    assert value(args, "--prompt-data") == f"{data}/geo3k-train.jsonl"
    assert value(args, "--eval-config").endswith("_strands_geo3k/run_config/eval_geo3k.yaml")
    prepares = [c for c in commands(result.stdout) if "data_prep.prepare" in c]
    assert [(value(c, "--dataset"), value(c, "--out")) for c in prepares] == [
        ("geometry3k", f"{data}/geo3k-train.jsonl"),
        ("geometry3k", f"{data}/geo3k-test.jsonl"),
    ]
    assert value(prepares[1], "--split") == "test" and "--split" not in prepares[0]
    assert f"path: {data}/geo3k-test.jsonl" in result.stderr  # the eval config's geo3k, rendered


def test_env_overrides_take_effect(sandbox):
    result = run(
        MODEL_SCRIPTS["8b"],
        sandbox["env"],
        "--eval-interval",
        "5",
        DRY_RUN="1",
        NUM_GPUS="2",
        N_SAMPLES_PER_PROMPT="4",
        MAX_RESPONSE_LEN="4096",
        LR="2e-6",
        WANDB_PROJECT="proj",
        WANDB_GROUP="grp",
        WANDB_KEY="s3cr3t-key",
        HF_CHECKPOINT="/ckpt/hf",
        TORCH_DIST_DIR="/ckpt/dist",
        SAVE_DIR="/runs/one",
        TRAIN_DATA="/d/train.jsonl",
        EXTRA_TRAIN_ARGS="--rollout-top-p 0.9 --skip-eval-before-train",
        MAX_CONTEXT_LEN="32768",
        MODEL_ARGS_ROTARY_BASE="123",
        NUM_NODES="2",
        MASTER_ADDR="10.1.2.3",
    )
    assert result.returncode == 0, result.stderr
    args = train_args(result.stdout)
    assert value(args, "--rotary-base") == "123"
    # Two nodes: the head is this node's address and the workers are told how to join.
    assert value(args, "--actor-num-nodes") == "2"
    head = find_command(commands(result.stdout), "ray", "start", "--head")
    assert value(head, "--node-ip-address") == "10.1.2.3"
    assert value(head, "--num-gpus") == "2"
    assert "MASTER_ADDR=10.1.2.3" in result.stderr and "join_worker.sh" in result.stderr
    assert value(args, "--actor-num-gpus-per-node") == "2"
    assert value(args, "--n-samples-per-prompt") == "4"
    assert value(args, "--rollout-max-response-len") == "4096"
    assert value(args, "--lr") == "2e-6"
    assert value(args, "--wandb-project") == "proj"
    assert value(args, "--wandb-group") == "grp"
    assert value(args, "--wandb-key") == "<redacted>"  # present, but never printed
    assert "--wandb-mode" not in args
    assert "s3cr3t-key" not in result.stdout + result.stderr
    assert value(args, "--hf-checkpoint") == "/ckpt/hf"
    assert value(args, "--ref-load") == "/ckpt/dist"
    assert value(args, "--save") == "/runs/one"
    assert value(args, "--eval-config") == "/runs/one/run_config/eval_aime.yaml"
    assert value(args, "--prompt-data") == "/d/train.jsonl"
    assert value(args, "--rollout-max-context-len") == "32768"
    # EXTRA_TRAIN_ARGS, then the script's own arguments, come last (argparse: the last value wins).
    assert args[-5:] == ["--rollout-top-p", "0.9", "--skip-eval-before-train", "--eval-interval", "5"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"PARTIAL_ROLLOUT": "1"}, ["--partial-rollout", "--over-sampling-batch-size", "24"]),
        (
            {"PARTIAL_ROLLOUT": "1", "OVER_SAMPLING_BATCH_SIZE": "32", "MASK_OFFPOLICY": "1"},
            ["--partial-rollout", "--over-sampling-batch-size", "32", "--mask-offpolicy-in-partial-rollout"],
        ),
        ({"MASK_OFFPOLICY": "1"}, []),  # masking means nothing without partial rollout
    ],
)
def test_partial_rollout_is_one_switch(sandbox, env, expected):
    result = run(MODEL_SCRIPTS["8b"], sandbox["env"], DRY_RUN="1", **env)
    assert result.returncode == 0, result.stderr
    args = train_args(result.stdout)
    flags = ("--partial-rollout", "--over-sampling-batch-size", "--mask-offpolicy-in-partial-rollout")
    found = [
        a for i, a in enumerate(args) if a in flags or (i and args[i - 1] == "--over-sampling-batch-size")
    ]
    assert found == expected


def test_rotary_base_follows_the_checkpoint(sandbox):
    # Qwen3-4B-Instruct-2507 uses rope_theta 5e6: read from config.json, not the model file's 1e6.
    complete_inputs(sandbox, "Qwen3-4B-Instruct-2507", {"rope_theta": 5000000.0})
    result = run(MODEL_SCRIPTS["4b"], sandbox["env"], DRY_RUN="1", MODEL_NAME="Qwen3-4B-Instruct-2507")
    assert result.returncode == 0, result.stderr
    assert value(train_args(result.stdout), "--rotary-base") == "5000000"


def test_model_args_come_from_slime_when_available(sandbox):
    slime_models = Path(sandbox["env"]["SLIME_DIR"]) / "scripts" / "models"
    slime_models.mkdir(parents=True)
    (slime_models / "qwen3-8B.sh").write_text("MODEL_ARGS=(--num-layers 36 --from-slime-file)\n")
    result = run(MODEL_SCRIPTS["8b"], sandbox["env"], DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    assert "--from-slime-file" in train_args(result.stdout)
    result = run(MODEL_SCRIPTS["8b"], sandbox["env"], DRY_RUN="1", MODEL_ARGS_SOURCE="bundled")
    assert "--from-slime-file" not in train_args(result.stdout)


def test_model_args_source_slime_requires_the_file(sandbox):
    result = run(MODEL_SCRIPTS["8b"], sandbox["env"], DRY_RUN="1", MODEL_ARGS_SOURCE="slime")
    assert result.returncode != 0
    assert "MODEL_ARGS_SOURCE=slime but" in result.stderr
    assert "ray job submit" not in result.stdout


def test_dry_run_auto_prepares_missing_inputs(dry_8b):
    sandbox, result = dry_8b
    cmds = commands(result.stdout)
    models, data = sandbox["env"]["MODELS_DIR"], sandbox["env"]["DATA_DIR"]
    download = find_command(cmds, "hf", "download")
    assert download[2:] == ["Qwen/Qwen3-8B", "--local-dir", f"{models}/Qwen/Qwen3-8B"]
    convert = next(c for c in cmds if any(a.endswith("tools/convert_hf_to_torch_dist.py") for a in c))
    assert value(convert, "--save") == f"{models}/Qwen/Qwen3-8B_torch_dist"
    preps = [c for c in cmds if "data_prep.prepare" in c]
    assert [(value(c, "--dataset"), value(c, "--out")) for c in preps] == [
        ("dapo-math-17k", f"{data}/dapo-math-17k.jsonl"),
        ("aime-2024", f"{data}/aime-2024.jsonl"),
    ]
    # Preflight problems are reported, not fatal, under DRY_RUN.
    assert "a real run would stop here" in result.stderr
    assert f"SLIME_DIR={sandbox['env']['SLIME_DIR']} does not exist" in result.stderr


def test_nothing_is_prepared_when_inputs_exist(sandbox):
    complete_inputs(sandbox)
    result = run(MODEL_SCRIPTS["8b"], sandbox["env"], DRY_RUN="1")
    cmds = commands(result.stdout)
    assert [c[:2] for c in cmds] == [["ray", "start"], ["ray", "job"]]
    assert "checkpoint" not in result.stderr.split("preflight (training)")[-1].split("model args")[0]


# --------------------------------------------------------------------------------------------------
# real (non-dry) runs fail early and clearly
# --------------------------------------------------------------------------------------------------


def test_missing_slime_fails_before_starting_anything(sandbox):
    _fake_tool(sandbox["bin"], "ray", f"echo ray-was-called >> {sandbox['tmp']}/ray.log")
    result = run(
        MODEL_SCRIPTS["8b"],
        sandbox["env"],
        SLIME_DIR="/nowhere/slime",
        AUTO_PREPARE="0",
        NUM_NODES="2",
        MASTER_ADDR="127.0.0.1",
    )
    assert result.returncode != 0
    assert "NUM_NODES=2 needs MASTER_ADDR" in result.stderr
    assert "ERROR: preflight (training) failed" in result.stderr
    assert "SLIME_DIR=/nowhere/slime does not exist" in result.stderr
    assert "nvidia-smi not found" in result.stderr
    assert "missing" in result.stderr  # checkpoint and data
    assert not (sandbox["tmp"] / "ray.log").exists()
    assert "ray" not in result.stdout


def test_auto_prepare_runs_the_downloader_and_checks_its_result(sandbox):
    log = sandbox["tmp"] / "hf.log"
    _fake_tool(sandbox["bin"], "hf", f'echo "$@" >> {log}')
    result = run(MODEL_SCRIPTS["8b"], sandbox["env"])
    assert result.returncode != 0
    assert log.read_text().split() == [
        "download",
        "Qwen/Qwen3-8B",
        "--local-dir",
        f"{sandbox['env']['MODELS_DIR']}/Qwen/Qwen3-8B",
    ]
    assert "config.json is missing" in result.stderr


def test_invalid_plugin_settings_fail_preflight(sandbox):
    bad = sandbox["tmp"] / "bad.yaml"
    bad.write_text("strands:\n  max_tool_iterz: 3\n")
    result = run(MODEL_SCRIPTS["8b"], sandbox["env"], DRY_RUN="1", AUTO_PREPARE="0", PLUGIN_CONFIG=str(bad))
    assert "are invalid" in result.stderr and "max_tool_iterz" in result.stderr
    # AUTO_PREPARE=0: missing inputs are reported, not prepared.
    cmds = commands(result.stdout)
    assert not [c for c in cmds if c[0] == "hf" or "data_prep.prepare" in c]
    assert find_command(cmds, "ray", "job", "submit")


# --------------------------------------------------------------------------------------------------
# helpers: download, conversions, data, workers
# --------------------------------------------------------------------------------------------------


def test_download_model_dry_run(sandbox):
    _fake_tool(sandbox["bin"], "hf")
    result = run(SCRIPTS / "download_model.sh", sandbox["env"], DRY_RUN="1", MODEL_NAME="Qwen3-4B")
    assert result.returncode == 0, result.stderr
    assert commands(result.stdout) == [
        ["hf", "download", "Qwen/Qwen3-4B", "--local-dir", f"{sandbox['env']['MODELS_DIR']}/Qwen/Qwen3-4B"]
    ]


def test_download_model_falls_back_to_huggingface_cli_and_skips_existing(sandbox):
    _fake_tool(sandbox["bin"], "huggingface-cli")
    result = run(
        SCRIPTS / "download_model.sh", sandbox["env"], DRY_RUN="1", HF_REPO="org/m", HF_CHECKPOINT="/x"
    )
    assert commands(result.stdout) == [["huggingface-cli", "download", "org/m", "--local-dir", "/x"]]
    complete_inputs(sandbox)
    result = run(SCRIPTS / "download_model.sh", sandbox["env"], DRY_RUN="1")
    assert result.returncode == 0 and commands(result.stdout) == []
    assert "nothing to download" in result.stderr


def test_convert_hf_to_torch_dist_dry_run(sandbox):
    result = run(SCRIPTS / "convert_hf_to_torch_dist.sh", sandbox["env"], DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    (cmd,) = commands(result.stdout)
    slime, megatron = sandbox["env"]["SLIME_DIR"], sandbox["env"]["MEGATRON_DIR"]
    assert cmd[:3] == ["env", f"PYTHONPATH={megatron}:{slime}", sys.executable]
    assert cmd[3] == f"{slime}/tools/convert_hf_to_torch_dist.py"
    for flag, expected in QWEN3_8B_ARGS.items():
        assert value(cmd, flag) == expected
    models = sandbox["env"]["MODELS_DIR"]
    assert value(cmd, "--hf-checkpoint") == f"{models}/Qwen/Qwen3-8B"
    assert value(cmd, "--save") == f"{models}/Qwen/Qwen3-8B_torch_dist"
    # Several GPUs: torchrun.
    result = run(SCRIPTS / "convert_hf_to_torch_dist.sh", sandbox["env"], DRY_RUN="1", CONVERT_NPROC="4")
    (cmd,) = commands(result.stdout)
    assert cmd[2:5] == ["torchrun", "--nproc-per-node", "4"]


def test_convert_hf_to_torch_dist_needs_slime(sandbox):
    result = run(SCRIPTS / "convert_hf_to_torch_dist.sh", sandbox["env"])
    assert result.returncode != 0
    assert "convert_hf_to_torch_dist.py not found" in result.stderr
    assert commands(result.stdout) == []


def _checkpoint_dir(sandbox: dict, tracker: str, *iters: str) -> Path:
    ckpt = sandbox["tmp"] / "run"
    for name in iters:
        (ckpt / name).mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text(tracker + "\n")
    return ckpt


def test_convert_torch_dist_to_hf_uses_the_latest_iteration(sandbox):
    complete_inputs(sandbox)
    ckpt = _checkpoint_dir(sandbox, "200", "iter_0000100", "iter_0000200")
    result = run(SCRIPTS / "convert_torch_dist_to_hf.sh", sandbox["env"], DRY_RUN="1", CKPT_DIR=str(ckpt))
    assert result.returncode == 0, result.stderr
    (cmd,) = commands(result.stdout)
    assert cmd[3] == f"{sandbox['env']['SLIME_DIR']}/tools/convert_torch_dist_to_hf.py"
    assert value(cmd, "--input-dir") == f"{ckpt}/iter_0000200"
    assert value(cmd, "--output-dir") == f"{ckpt}_hf/iter_0000200"
    assert value(cmd, "--origin-hf-dir") == f"{sandbox['env']['MODELS_DIR']}/Qwen/Qwen3-8B"
    assert value(cmd, "--vocab-size") == "151936"
    assert "--force" not in cmd
    # A chosen iteration, output and overwrite.
    result = run(
        SCRIPTS / "convert_torch_dist_to_hf.sh",
        sandbox["env"],
        DRY_RUN="1",
        CKPT_DIR=str(ckpt),
        ITERATION="100",
        HF_OUT="/out/hf",
        FORCE="1",
    )
    (cmd,) = commands(result.stdout)
    assert value(cmd, "--input-dir") == f"{ckpt}/iter_0000100"
    assert value(cmd, "--output-dir") == "/out/hf"
    assert "--force" in cmd


def test_convert_torch_dist_to_hf_release_and_missing_tracker(sandbox):
    ckpt = _checkpoint_dir(sandbox, "release", "release")
    result = run(SCRIPTS / "convert_torch_dist_to_hf.sh", sandbox["env"], DRY_RUN="1", CKPT_DIR=str(ckpt))
    assert value(commands(result.stdout)[0], "--input-dir") == f"{ckpt}/release"
    result = run(
        SCRIPTS / "convert_torch_dist_to_hf.sh", sandbox["env"], CKPT_DIR=str(sandbox["tmp"] / "nope")
    )
    assert result.returncode != 0
    assert "latest_checkpointed_iteration.txt not found" in result.stderr


def test_prepare_data_dry_run(sandbox):
    result = run(SCRIPTS / "prepare_data.sh", sandbox["env"], DRY_RUN="1", DATA_DIR="/mnt/data")
    assert result.returncode == 0, result.stderr
    cmds = commands(result.stdout)
    assert [(value(c, "--dataset"), value(c, "--out")) for c in cmds] == [
        ("dapo-math-17k", "/mnt/data/dapo-math-17k.jsonl"),
        ("aime-2024", "/mnt/data/aime-2024.jsonl"),
    ]
    assert all(c[c.index("-m") + 1] == "data_prep.prepare" for c in cmds)


def test_join_worker(sandbox):
    result = run(
        SCRIPTS / "join_worker.sh", sandbox["env"], DRY_RUN="1", MASTER_ADDR="10.0.0.7", NUM_GPUS="4"
    )
    assert result.returncode == 0, result.stderr
    (cmd,) = commands(result.stdout)
    assert cmd[:4] == ["ray", "start", "--address", "10.0.0.7:6379"]
    assert value(cmd, "--num-gpus") == "4"
    assert "--block" in cmd
    result = run(SCRIPTS / "join_worker.sh", sandbox["env"])
    assert result.returncode != 0
    assert "set MASTER_ADDR" in result.stderr


# --------------------------------------------------------------------------------------------------
# eval config rendering (scripts/lib/common.sh ss_render_eval_config)
# --------------------------------------------------------------------------------------------------


def _render(env: dict) -> dict:
    script = f"source {shlex.quote(str(SCRIPTS / 'lib' / 'common.sh'))}; ss_defaults; "
    script += f"ss_render_eval_config {shlex.quote(str(REPO / 'configs' / 'eval_aime.yaml'))}"
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_render_eval_config(sandbox):
    env = {**sandbox["env"], "DATA_DIR": "/mnt/d"}
    (aime,) = _render(env)["eval"]["datasets"]
    assert aime["path"] == "/mnt/d/aime-2024.jsonl"
    assert aime["n_samples_per_eval_prompt"] == 16
    env.update(EVAL_DATA="/x/aime.jsonl", EVAL_N_SAMPLES="4", EVAL_MAX_RESPONSE_LEN="2048")
    (aime,) = _render(env)["eval"]["datasets"]
    assert (aime["path"], aime["n_samples_per_eval_prompt"], aime["max_response_len"]) == (
        "/x/aime.jsonl",
        4,
        2048,
    )
    assert aime["custom_rm_path"] == "slime_strands.reward.accuracy"


# --------------------------------------------------------------------------------------------------
# the real (non-dry) training flow against fake ray / nvidia-smi / slime
# --------------------------------------------------------------------------------------------------


# Entry-point modules another part of the plugin may not have written yet: stand-ins, used only when the
# real module cannot be found (a meta-path finder appended after the normal ones).
@pytest.fixture
def fake_cluster(sandbox):
    env, bin_dir, tmp = sandbox["env"], sandbox["bin"], sandbox["tmp"]
    log = tmp / "ray.log"
    _fake_tool(
        bin_dir,
        "nvidia-smi",
        'if [ "$1" = -L ]; then for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: H100"; done; fi',
    )
    _fake_tool(
        bin_dir,
        "ray",
        f'echo "$*" >> {log}\n'
        'case "$1 $2" in "status "*) exit "${FAKE_RAY_STATUS:-1}" ;; "job submit") exit "${FAKE_JOB_RC:-0}" ;; esac',
    )
    slime = Path(env["SLIME_DIR"])
    (slime / "slime" / "utils").mkdir(parents=True)
    for name in ("slime/__init__.py", "slime/utils/__init__.py", "slime/utils/arguments.py", "train.py"):
        (slime / name).write_text("")
    (Path(env["MEGATRON_DIR"]) / "megatron").mkdir(parents=True)
    complete_inputs(sandbox)
    return {**sandbox, "log": log}


def _ray_calls(box) -> list[str]:
    return box["log"].read_text().splitlines() if box["log"].exists() else []


def test_real_run_starts_and_stops_only_its_own_ray(fake_cluster):
    box = fake_cluster
    result = run(MODEL_SCRIPTS["8b"], box["env"], WANDB_KEY="s3cr3t")
    assert result.returncode == 0, result.stderr
    calls = _ray_calls(box)
    assert [c.split()[:2] for c in calls] == [
        ["status", "--address"],
        ["start", "--head"],
        ["job", "submit"],
        ["stop"],
    ]
    save_dir = Path(box["env"]["MODELS_DIR"]) / "Qwen" / "Qwen3-8B_strands_dapo"
    rendered = yaml.safe_load((save_dir / "run_config" / "eval_aime.yaml").read_text())
    assert rendered["eval"]["datasets"][0]["path"] == f"{box['env']['DATA_DIR']}/aime-2024.jsonl"
    command = (save_dir / "run_config" / "command.txt").read_text()
    assert "--wandb-key '<redacted>'" in command and "s3cr3t" not in command
    assert (save_dir / "wandb").is_dir()
    submit = shlex.split(next(c for c in calls if c.startswith("job submit")))
    assert value(submit, "--eval-config") == str(save_dir / "run_config" / "eval_aime.yaml")
    assert value(submit, "--wandb-key") == "s3cr3t"  # the real key reaches slime


def test_real_run_reuses_a_running_cluster_and_leaves_it(fake_cluster):
    result = run(MODEL_SCRIPTS["8b"], fake_cluster["env"], FAKE_RAY_STATUS="0")
    assert result.returncode == 0, result.stderr
    calls = _ray_calls(fake_cluster)
    assert [c.split()[:2] for c in calls] == [["status", "--address"], ["job", "submit"]]
    assert "already running" in result.stderr


def test_real_run_reports_a_failed_job(fake_cluster):
    result = run(MODEL_SCRIPTS["8b"], fake_cluster["env"], FAKE_JOB_RC="3")
    assert result.returncode != 0
    assert "failed (exit 3)" in result.stderr and "ray job logs" in result.stderr
    assert _ray_calls(fake_cluster)[-1] == "stop"  # the head it started is stopped; the job is not re-stopped


@pytest.mark.parametrize("recipe", sorted(MODEL_SCRIPTS))
def test_dry_run_says_which_model_args_once(sandbox, recipe):
    """Nothing prepared: the recipe converts the checkpoint (a helper that reads the model args too) and then
    trains; which model-args file both read is said once, naming why it is the bundled copy."""
    result = run(MODEL_SCRIPTS[recipe], sandbox["env"], DRY_RUN="1")
    assert "converting" in result.stderr, result.stderr  # the conversion helper ran
    said = [line for line in result.stderr.splitlines() if "model args" in line]
    slime_copy = Path(sandbox["env"]["SLIME_DIR"]) / "scripts" / "models"
    assert len(said) == 1, said
    assert said[0].startswith(f"[slime-strands] model args from {REPO / 'scripts' / 'models'}/"), said
    assert f"({slime_copy}/" in said[0] and "not found: the bundled copy)" in said[0], said
