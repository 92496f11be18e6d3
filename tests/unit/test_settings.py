"""The plugin settings loader: defaults, strict validation, reading from slime's args."""

from __future__ import annotations

import dataclasses
import gc
import re
from pathlib import Path

import pytest
from slime_helpers import slime_args

from slime_strands._slime.config import SlimeConfig
from slime_strands.agent.runtime import raise_gc_threshold
from slime_strands.errors import ConfigurationError
from slime_strands.settings import PluginSettings, RayPoolSettings, SandboxSettings, SettingsError

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_the_math_agent():
    settings = PluginSettings()
    assert settings.tools == ("slime_strands.sandbox.execute_python_code",)
    assert settings.max_tool_iters == 5 and settings.max_tool_calls is None
    assert "\\boxed" in settings.system_prompt
    assert settings.sandbox == SandboxSettings() and settings.sandbox.effective_concurrency >= 1
    assert settings.tool_parser == "auto", "the parser is chosen from the tokenizer unless set"
    assert PluginSettings.from_mapping({"tool_parser": "glm47"}).tool_parser == "glm47"


def test_mapping_is_coerced_and_nested():
    settings = PluginSettings.from_mapping(
        {
            "max_tool_iters": 3,
            "tools": ["a.b"],
            "sandbox": {"timeout_s": 5, "preload_modules": []},
            "reward": {},
        }
    )
    assert settings.max_tool_iters == 3 and settings.tools == ("a.b",)
    assert settings.sandbox.timeout_s == 5.0 and isinstance(settings.sandbox.timeout_s, float)
    assert settings.sandbox.preload_modules == ()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"max_tool_iter": 3}, "unknown setting(s) max_tool_iter (did you mean 'max_tool_iters'"),
        ({"sandbox": {"timeout": 3}}, "unknown setting(s) sandbox.timeout (did you mean 'timeout_s'"),
        ({"sandbox": {"timout_s": 3}}, "unknown setting(s) sandbox.timout_s (did you mean 'timeout_s'"),
        ({"zzz": 1, "systemprompt": ""}, "systemprompt (did you mean 'system_prompt'.), zzz; known: "),
        ({"max_tool_iters": "5"}, "max_tool_iters: expected int"),
        ({"max_tool_iters": True}, "expected int, got a boolean"),
        ({"enable_thinking": "yes"}, "enable_thinking: expected bool"),
        ({"tools": "slime_strands.sandbox.execute_python_code"}, "tools: expected a list"),
        ({"sandbox": {"backend": "docker"}}, "unknown backend 'docker'"),
        ({"sandbox": {"memory_mb": 0}}, "sandbox.memory_mb must be > 0"),
        ({"sandbox": "fast"}, "^sandbox: expected a mapping, got str"),
        ({"sandbox": 0}, "^sandbox: expected a mapping, got int"),  # not taken for "the defaults"
        ({"compaction": []}, "^compaction: expected a mapping, got list"),
        ({"max_tool_iters": -1}, "max_tool_iters must be >= 0"),
        ({"reward": {"math_verify_timeout_s": 0}}, "math_verify_timeout_s must be > 0"),
        ({"tool_parser": "qwen25_xml"}, "tool_parser: unknown parser 'qwen25_xml'; choose 'auto' or one of"),
        ({"gc_young_threshold": 0}, "gc_young_threshold must be > 0 or null, got 0"),
        ({"tool_rounds_per_invocation": 0}, "tool_rounds_per_invocation must be >= 1 or null, got 0"),
        ({"sandbox": {"placement": "k8s"}}, "sandbox.placement: unknown placement 'k8s' (local, ray)"),
        ({"sandbox": {"ray": {"workers": 4}}}, "sandbox.ray.workers is set but sandbox.placement is 'local'"),
        (
            {"sandbox": {"placement": "ray", "concurrency": 8}},
            "set sandbox.ray.workers and sandbox.ray.slots",
        ),
        (
            {"sandbox": {"placement": "ray", "ray": {"slots_per_worker": 0}}},
            "sandbox.ray.slots_per_worker must be > 0",
        ),
        (
            {"sandbox": {"placement": "ray", "ray": {"cpus_per_worker": -1}}},
            "cpus_per_worker must be >= 0, got -1.0",
        ),
        (
            {"sandbox": {"placement": "ray", "ray": {"custom_resource": " "}}},
            "custom_resource must be a resource name",
        ),
        ({"sandbox": {"placement": "ray", "ray": {"pool": 4}}}, "unknown setting(s) sandbox.ray.pool"),
    ],
)
def test_invalid_settings_name_the_problem(data, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PluginSettings.from_mapping(data)


def test_the_ray_placement_and_one_workers_own_settings():
    sandbox = PluginSettings.from_mapping(
        {
            "sandbox": {
                "placement": "ray",
                "backend": "limits",
                "timeout_s": 3,
                "ray": {"workers": 3, "cpus_per_worker": 2},
            }
        }
    ).sandbox
    assert (
        sandbox.ray.workers == 3 and sandbox.ray.cpus_per_worker == 2.0 and sandbox.ray.slots_per_worker == 4
    )
    worker = sandbox.in_one_worker()  # what each worker's own sandbox runs: the same backend and limits
    assert (worker.placement, worker.concurrency, worker.ray) == ("local", 4, RayPoolSettings())
    assert (worker.backend, worker.timeout_s) == ("limits", 3.0)
    assert dataclasses.replace(worker, placement="ray", concurrency=None, ray=sandbox.ray) == sandbox


def settings_from_args(args):
    return SlimeConfig.of(args).settings


def test_from_args_reads_the_strands_key():
    assert settings_from_args(slime_args()) == PluginSettings()
    assert settings_from_args(slime_args(strands=None)) == PluginSettings()
    assert settings_from_args(slime_args(strands={"max_tool_calls": 7})).max_tool_calls == 7
    explicit = PluginSettings(max_tool_iters=1)
    assert settings_from_args(slime_args(strands=explicit)) is explicit


def test_from_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("strands:\n  enable_thinking: false\nrollout_stuff: 1\n")
    assert PluginSettings.from_yaml(path).enable_thinking is False
    path.write_text("- a list\n")
    with pytest.raises(SettingsError, match="mapping at top level"):
        PluginSettings.from_yaml(path)


def test_a_yaml_file_that_does_not_parse_is_a_settings_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text('strands:\n  system_prompt: "unterminated\n  tools: [\n')
    with pytest.raises(SettingsError, match=f"^{path}: not valid YAML: "):
        PluginSettings.from_yaml(path)


def test_what_the_settings_guard_is_checked_again_where_it_is_used():
    """Built by hand (not through the settings), the pieces reject bad values with a ConfigurationError too."""
    from slime_strands.agent.compaction import ContextCompactor
    from slime_strands.agent.limits import ToolLimiter
    from slime_strands.agent.segment_collector import SegmentCollector
    from slime_strands.sandbox._backends import command
    from slime_strands.settings import CompactionSettings

    with pytest.raises(ConfigurationError, match="max_tool_calls must be >= 0 or None, got -1"):
        ToolLimiter(max_tool_calls=-1)
    with pytest.raises(ConfigurationError, match="unknown compaction strategy 'trim'"):
        ContextCompactor("trim", CompactionSettings(), SegmentCollector(collect_subagents=False), pinned=1)
    with pytest.raises(ConfigurationError, match="unknown sandbox backend 'docker'"):
        command("docker", root=False)


@pytest.fixture
def gc_state():
    saved, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*saved)
    (gc.enable if enabled else gc.disable)()


def test_the_young_gc_threshold_is_raised_never_lowered(gc_state):
    """Process-wide, so it only raises generation 0 and leaves the older generations and a disabled GC alone."""
    gc.set_threshold(700, 10, 10)
    raise_gc_threshold(PluginSettings.from_mapping({"gc_young_threshold": 20_000}))
    assert gc.get_threshold() == (20_000, 10, 10)
    raise_gc_threshold(PluginSettings.from_mapping({"gc_young_threshold": 5_000}))
    assert gc.get_threshold() == (20_000, 10, 10), "a higher threshold (the process's own) is kept"
    gc.set_threshold(700, 5, 3)
    raise_gc_threshold(PluginSettings.from_mapping({"gc_young_threshold": None}))
    assert gc.get_threshold() == (700, 5, 3)
    gc.disable()
    raise_gc_threshold(PluginSettings())
    assert gc.get_threshold() == (700, 5, 3) and not gc.isenabled()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("strand:\n  max_tool_iters: 3\n", "unknown top-level key 'strand': did you mean 'strands'?"),
        ("STRANDS: {}\n", "unknown top-level key 'STRANDS': did you mean 'strands'?"),
        ("srtands: {}\n", "unknown top-level key 'srtands': did you mean 'strands'?"),
        ("tools: [a.b]\n", "unknown top-level key 'tools': it is a plugin setting: indent it under strands:"),
        (
            "strands: {}\nrollout_stuff: 1\n",
            "unknown top-level key 'rollout_stuff': the plugin's settings file holds only a strands:",
        ),
    ],
)
def test_the_plugins_own_file_holds_only_strands(tmp_path, text, message):
    path = tmp_path / "plugin.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError, match=f"^{path}: " + re.escape(message)):
        PluginSettings.from_yaml(path, other_keys=False)


def test_slimes_eval_config_given_as_the_plugins_says_what_each_file_is_for():
    """configs/eval_aime.yaml sits beside configs/strands_math.yaml; given where the plugin's settings go, the
    line says which file is which and where each goes."""
    path = ROOT / "configs" / "eval_aime.yaml"
    with pytest.raises(SettingsError) as raised:
        PluginSettings.from_yaml(path, other_keys=False)
    assert str(raised.value) == (
        f"{path}: unknown top-level key 'eval': this is slime's --eval-config (the datasets slime evaluates, as "
        "configs/eval_aime.yaml), not the plugin's settings file (a strands: section, as configs/strands_math.yaml): "
        "slime-strands eval takes the plugin's settings with --config and the prompts with --data"
    )
    assert (
        PluginSettings.from_yaml(ROOT / "configs" / "strands_math.yaml", other_keys=False) == PluginSettings()
    )


def test_a_custom_config_file_may_hold_other_keys_but_no_near_miss_of_strands(tmp_path):
    path = tmp_path / "custom.yaml"
    path.write_text("strands: {max_tool_iters: 2}\nrollout_batch_size: 8\ntrends: 1\nstranded: 2\n")
    assert PluginSettings.from_yaml(path).max_tool_iters == 2
    path.write_text("strands: {max_tool_iters: 2}\nstrands_: {max_tool_iters: 3}\n")
    with pytest.raises(SettingsError, match="unknown top-level key 'strands_': did you mean 'strands'"):
        PluginSettings.from_yaml(path)


def test_slimes_args_with_a_near_miss_of_strands_are_refused():
    """slime copies --custom-config-path keys onto args: a misspelt section would silently train the defaults."""
    slime_like = {"rollout_batch_size": 8, "custom_rm_path": "x", "trends": 1}
    assert settings_from_args(slime_args(**slime_like)) == PluginSettings()
    for name in ("strand", "Strands", "stands", "strnads"):
        args = slime_args(**slime_like, **{name: {"max_tool_iters": 1}})
        with pytest.raises(SettingsError, match=f"slime's args have '{name}' .*did you mean 'strands'"):
            settings_from_args(args)
