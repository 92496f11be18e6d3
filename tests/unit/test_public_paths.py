"""Every dotted path a user writes still imports, wherever the code behind it lives.

Users write these paths in slime's flags (``--custom-*-path``), in the plugin YAML (``tools:``, a dataset's
``custom_rm_path``), in ``pyproject``'s console script, and in Python (``from slime_strands import ...``).
Internal modules move freely; these do not. Each is resolved the way its user resolves it: slime's
``load_function`` (import the module, getattr the last part), YAML tool paths (the same), Python imports.
"""

from __future__ import annotations

import importlib

import pytest

SLIME_FLAGS = [
    "slime_strands.rollout.generate",  # --custom-generate-function-path
    "slime_strands.reward.math_reward",  # --custom-rm-path
    "slime_strands.reward.accuracy",  # eval configs' custom_rm_path (configs/eval_aime.yaml)
    "slime_strands.reward_norm.post_process_rewards",  # --custom-reward-post-process-path
    "slime_strands.metrics.log_rollout",  # --custom-rollout-log-function-path
    "slime_strands.metrics.log_eval_rollout",  # --custom-eval-rollout-log-function-path
]
YAML_TOOLS = [
    "slime_strands.sandbox.execute_python_code",  # configs/strands_math.yaml tools:
    "slime_strands.subagents.subagent_tool",  # builds tools users name in tools:
]
PYTHON = [
    # slime_strands.__all__ (checked whole below), and the modules users import from
    *(f"slime_strands.reward.{n}" for n in ("extract_answer", "final_answer_text", "grade")),
    *(f"slime_strands.metrics.{n}" for n in ("aggregate", "pass_at_k", "mean_pass_at_k")),
    "slime_strands.reward_norm.CENTERED_ESTIMATORS",
    *(
        f"slime_strands.sandbox.{n}"
        for n in (
            "ExecutionResult",
            "Sandbox",
            "SandboxIsolationError",
            "SandboxUnavailableError",
            "configure_sandbox",
            "ensure_isolation",
            "run_python",
        )
    ),
    *(f"slime_strands.testing.{n}" for n in ("Fault", "RecordedRequest", "SGLangTestServer", "Turn")),
    *(
        f"slime_strands.testing.invariants.{n}"
        for n in (
            "assert_trajectory_invariants",
            "assert_sample_invariants",
            "assert_sample_matches_server",
            "assert_batch_convertible",
        )
    ),
    "slime_strands.testing.slime_types.Sample",
    *(
        f"slime_strands.tool_parsers.{n}"
        for n in (
            "register_tool_parser",
            "registered_tool_parsers",
            "get_tool_parser",
            "ToolParser",
            "TaggedToolParser",
            "ToolCall",
            "ToolCallError",
            "ParseResult",
            "HermesToolParser",
        )
    ),
    *(
        f"slime_strands.settings.{n}"
        for n in (
            "PluginSettings",
            "SandboxSettings",
            "RewardSettings",
            "CompactionSettings",
            "SettingsError",
            "DEFAULT_SYSTEM_PROMPT",  # named in configs/strands_math.yaml
            "DEFAULT_SUMMARY_PROMPT",
        )
    ),
    "slime_strands.errors.ConfigurationError",
    "slime_strands.errors.SlimeStrandsError",
    "slime_strands.subagents.SubagentError",
]
CONSOLE_SCRIPT = "slime_strands.cli:main"  # pyproject [project.scripts]


def _resolve(path: str) -> object:
    """slime's ``load_function``: import the module part, getattr the rest (one attribute)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", SLIME_FLAGS + YAML_TOOLS + PYTHON)
def test_the_path_resolves(path):
    assert _resolve(path) is not None


@pytest.mark.parametrize("path", SLIME_FLAGS)
def test_slime_hooks_are_callables(path):
    assert callable(_resolve(path))


def test_the_yaml_tools_are_strands_tools():
    from slime_strands.settings import PluginSettings

    default = PluginSettings().tools
    assert "slime_strands.sandbox.execute_python_code" in default
    tool = _resolve("slime_strands.sandbox.execute_python_code")
    assert hasattr(tool, "tool_spec"), "a Strands tool"


def test_the_yaml_path_of_subagent_tool_is_the_code_itself():
    # A re-export, not a copy: the object users name in YAML is the one the agent layer defines and tests.
    from slime_strands.agent import subagents

    assert _resolve("slime_strands.subagents.subagent_tool") is subagents.subagent_tool
    assert _resolve("slime_strands.subagents.SubagentError") is subagents.SubagentError


def test_the_older_names_stay_aliases_of_the_new_ones():
    import slime_strands
    from slime_strands.tool_parsers import MalformedCall, ToolCallError

    assert ToolCallError is MalformedCall and slime_strands.Segment is slime_strands.Span


def test_the_console_script_target():
    module, _, name = CONSOLE_SCRIPT.partition(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_every_name_exported_from_the_package():
    import slime_strands

    # The names exported before the package was split into subpackages (issue 25): none may be dropped.
    today = {
        "ConfigurationError",
        "GenerateResult",
        "GenerationAbortedError",
        "ResponseBudgetExhaustedError",
        "SGLangAbortError",
        "SGLangClient",
        "SGLangConnectionError",
        "SGLangContextLengthError",
        "SGLangError",
        "SGLangHTTPError",
        "SGLangModel",
        "SGLangProtocolError",
        "SGLangTimeoutError",
        "Segment",
        "SlimeStrandsError",
        "TokenManager",
        "ToolIterationLimiter",
        "ToolLimiter",
        "TrajectoryError",
        "TurnInfo",
        "build_agent",  # the agent as the plugin builds and runs it: the library's fast path
        "run_agent",
    }
    assert today <= set(slime_strands.__all__)
    for name in slime_strands.__all__:
        assert getattr(slime_strands, name) is not None, name
