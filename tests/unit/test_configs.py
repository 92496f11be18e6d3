"""configs/: the plugin settings file and slime's --eval-config for AIME-2024."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest
import yaml

from slime_strands.settings import (
    CodeRewardSettings,
    CompactionSettings,
    PluginSettings,
    RayPoolSettings,
    RewardSettings,
    RolloutWorkersSettings,
    SandboxSettings,
    StalenessSettings,
)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
PLUGIN_CONFIG = CONFIGS / "strands_math.yaml"
EVAL_CONFIG = CONFIGS / "eval_aime.yaml"

# Keys of one dataset entry of slime's --eval-config: the fields of `EvalDatasetConfig` in
# THUDM/slime slime/utils/eval_config.py (0.3.x; `custom_rm_path` is copied onto every eval sample by
# slime/rollout/sglang_rollout.py and wins over --custom-rm-path in slime/rollout/rm_hub/__init__.py).
# slime rejects unknown keys, so the config must stay inside this set.
SLIME_EVAL_DATASET_KEYS = frozenset(
    {
        "name",
        "path",
        "rm_type",
        "custom_rm_path",
        "custom_generate_function_path",
        "input_key",
        "label_key",
        "tool_key",
        "metadata_key",
        "n_samples_per_eval_prompt",
        "temperature",
        "top_p",
        "top_k",
        "max_response_len",
        "min_new_tokens",
        "stop",
        "stop_token_ids",
        "metadata_overrides",
    }
)
# `eval.defaults` takes the same keys except the identity of a dataset.
SLIME_EVAL_DEFAULTS_KEYS = SLIME_EVAL_DATASET_KEYS - {"name", "path"}

# The plugin's slime entry points, as the launch scripts and the eval config name them.
ENTRY_POINTS = {
    "slime_strands.rollout.generate",
    "slime_strands.reward.math_reward",
    "slime_strands.reward.accuracy",
    "slime_strands.reward.code_reward",
    "slime_strands.reward_norm.post_process_rewards",
    "slime_strands.metrics.log_rollout",
    "slime_strands.metrics.log_eval_rollout",
}


# --------------------------------------------------------------------------------------------------
# configs/strands_math.yaml
# --------------------------------------------------------------------------------------------------


def test_plugin_config_loads():
    settings = PluginSettings.from_yaml(PLUGIN_CONFIG)
    assert settings.tool_parser == "auto"
    assert settings.tools == ("slime_strands.sandbox.execute_python_code",)
    assert "Answer: \\boxed{" in settings.system_prompt


def test_plugin_config_has_only_the_strands_key():
    # slime copies every top-level key onto its args: anything but `strands` could clobber a flag.
    doc = yaml.safe_load(PLUGIN_CONFIG.read_text())
    assert set(doc) == {"strands"}


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_plugin_config_spells_out_every_setting():
    section = yaml.safe_load(PLUGIN_CONFIG.read_text())["strands"]
    assert set(section) == _fields(PluginSettings)
    assert set(section["sandbox"]) == _fields(SandboxSettings)
    assert set(section["sandbox"]["ray"]) == _fields(RayPoolSettings)
    assert set(section["reward"]) == _fields(RewardSettings)
    assert set(section["reward"]["code"]) == _fields(CodeRewardSettings)
    assert set(section["compaction"]) == _fields(CompactionSettings)
    assert set(section["staleness"]) == _fields(StalenessSettings)
    assert set(section["rollout_workers"]) == _fields(RolloutWorkersSettings)
    assert PluginSettings.from_yaml(PLUGIN_CONFIG) == PluginSettings(), "the defaults, spelled out"


def _comment_blocks(text: str) -> dict[str, str]:
    """Map 'section.key' -> the comment block right above that key's line."""
    blocks: dict[str, str] = {}
    comments: list[str] = []
    parents: list[tuple[int, str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comments.append(stripped.lstrip("# "))
            continue
        match = re.match(r"^( *)([A-Za-z_]\w*):", line)
        if match:
            indent, key = len(match.group(1)), match.group(2)
            while parents and parents[-1][0] >= indent:
                parents.pop()
            path = ".".join([p for _, p in parents] + [key])
            blocks[path] = " ".join(comments)
            parents.append((indent, key))
        if stripped and not stripped.startswith("-"):
            comments = []
    return blocks


def _defaults(cls, prefix: str) -> dict[str, object]:
    out = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type) or f.name in (
            "sandbox",
            "reward",
            "compaction",
            "ray",
            "code",
            "staleness",
            "rollout_workers",
        ):
            continue
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out[f"{prefix}{f.name}"] = list(value) if isinstance(value, tuple) else value
    return out


def test_every_key_is_commented_with_its_true_default():
    blocks = _comment_blocks(PLUGIN_CONFIG.read_text())
    defaults = {
        **_defaults(PluginSettings, "strands."),
        **_defaults(SandboxSettings, "strands.sandbox."),
        **_defaults(RayPoolSettings, "strands.sandbox.ray."),
        **_defaults(RewardSettings, "strands.reward."),
        **_defaults(CodeRewardSettings, "strands.reward.code."),
        **_defaults(CompactionSettings, "strands.compaction."),
        **_defaults(StalenessSettings, "strands.staleness."),
        **_defaults(RolloutWorkersSettings, "strands.rollout_workers."),
    }
    for key, default in defaults.items():
        comment = blocks.get(key, "")
        assert len(comment) > 20, f"{key} has no explanatory comment"
        if key in ("strands.system_prompt", "strands.compaction.summary_prompt"):
            continue  # described in words
        match = re.search(r"Default: (.+?)(?:$|\s{2}|(?<=[^\d])\.\s)", comment)
        assert match, f"{key}: comment does not state its default: {comment!r}"
        documented = yaml.safe_load(match.group(1).rstrip("."))
        assert documented == default, (
            f"{key}: comment says default {documented!r}, settings.py has {default!r}"
        )


# --------------------------------------------------------------------------------------------------
# configs/eval_aime.yaml
# --------------------------------------------------------------------------------------------------


def test_eval_config_uses_only_keys_slime_accepts():
    doc = yaml.safe_load(EVAL_CONFIG.read_text())
    assert set(doc) == {"eval"}
    assert set(doc["eval"]) <= {"defaults", "datasets"}
    assert set(doc["eval"].get("defaults") or {}) <= SLIME_EVAL_DEFAULTS_KEYS
    datasets = doc["eval"]["datasets"]
    assert isinstance(datasets, list) and datasets
    for ds in datasets:
        assert set(ds) <= SLIME_EVAL_DATASET_KEYS, set(ds) - SLIME_EVAL_DATASET_KEYS
        assert {"name", "path"} <= set(ds)


def test_eval_config_reports_aime_accuracy():
    (aime,) = yaml.safe_load(EVAL_CONFIG.read_text())["eval"]["datasets"]
    assert aime["name"] == "aime"
    assert aime["path"] == "/root/data/aime-2024.jsonl"  # the scripts re-root it onto DATA_DIR
    assert aime["custom_rm_path"] == "slime_strands.reward.accuracy"  # plain 1/0, not the shaped reward
    assert aime["n_samples_per_eval_prompt"] == 16
    assert isinstance(aime["max_response_len"], int) and aime["max_response_len"] >= 8192
    assert isinstance(aime["temperature"], float) and isinstance(aime["top_p"], float)


def test_no_4b_specific_plugin_config_is_needed():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == [
        "eval_aime.yaml",
        "eval_geo3k.yaml",
        "eval_humaneval.yaml",
        "strands_code.yaml",
        "strands_geo3k.yaml",
        "strands_math.yaml",
        "strands_mcp.yaml",  # the MCP example: the same math agent, its tools MCP servers (docs/mcp.md)
    ]


def test_the_code_agent_grades_with_code_reward_and_asks_for_a_fenced_program():
    """configs/strands_code.yaml and eval_humaneval.yaml: the code environment's agent, reward and eval."""
    code = PluginSettings.from_yaml(CONFIGS / "strands_code.yaml", other_keys=False)
    assert code.reward.kind == "code" and code.reward.code == CodeRewardSettings()
    assert "```python" in code.system_prompt and "last" in code.system_prompt
    assert code.tools == ("slime_strands.sandbox.execute_python_code",)
    (humaneval,) = yaml.safe_load((CONFIGS / "eval_humaneval.yaml").read_text())["eval"]["datasets"]
    assert set(humaneval) <= SLIME_EVAL_DATASET_KEYS
    assert humaneval["custom_rm_path"] == "slime_strands.reward.code_reward"
    assert humaneval["path"] == "/root/data/humaneval.jsonl"


def test_the_geometry_agent_differs_from_the_math_agent_only_where_it_says():
    """configs/strands_geo3k.yaml (the VLM recipe): its prompt, and the Python tool's figures returned."""
    geo = PluginSettings.from_yaml(CONFIGS / "strands_geo3k.yaml")
    math = PluginSettings.from_yaml(PLUGIN_CONFIG)
    assert geo.sandbox.return_figures and not math.sandbox.return_figures
    assert "figure" in geo.system_prompt and geo.tools == math.tools
    assert dataclasses.replace(geo, system_prompt=math.system_prompt, sandbox=math.sandbox) == math
    (geo3k,) = yaml.safe_load((CONFIGS / "eval_geo3k.yaml").read_text())["eval"]["datasets"]
    assert (
        set(geo3k) <= SLIME_EVAL_DATASET_KEYS and geo3k["custom_rm_path"] == "slime_strands.reward.accuracy"
    )


# --------------------------------------------------------------------------------------------------
# the dotted paths the scripts and configs hand to slime
# --------------------------------------------------------------------------------------------------


def test_scripts_and_configs_name_the_same_entry_points():
    text = (REPO / "scripts" / "lib" / "common.sh").read_text() + EVAL_CONFIG.read_text()
    named = set(re.findall(r"slime_strands\.(?:rollout|reward|reward_norm|metrics)\.\w+", text))
    assert named == ENTRY_POINTS


@pytest.mark.parametrize("path", sorted(ENTRY_POINTS | set(PluginSettings.from_yaml(PLUGIN_CONFIG).tools)))
def test_entry_points_resolve(path: str):
    module_name, _, attr = path.rpartition(".")
    module = importlib.import_module(module_name)
    assert getattr(module, "__file__", None), f"{module_name} is not a real module"
    assert callable(getattr(module, attr)), f"{path} is not callable"


def test_the_tool_parsers_the_config_lists_are_the_registered_ones():
    """The comment above ``tool_parser:`` names every registered parser, in the order auto tries them, and no
    other: a parser added to (or dropped from) the registry fails here until the comment says so."""
    from slime_strands.tool_parsers import registered_tool_parsers

    lines = PLUGIN_CONFIG.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("tool_parser:"))
    start = max(i for i in range(at) if not lines[i].lstrip().startswith("#")) + 1
    comment = " ".join(line.strip().lstrip("#").strip() for line in lines[start:at])
    listed = re.search(r"--tool-call-parser values \(([^)]*)\)", comment)
    assert listed, comment
    assert [name.strip() for name in listed.group(1).split(",")] == registered_tool_parsers()
