"""README's opening commands are what CI runs; the public API it documents exists."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    lines = ROOT.joinpath("README.md").read_text().splitlines()
    start = lines.index("```bash")
    block = lines[start + 1 : lines.index("```", start + 1)]
    return [line for line in block if line and not line.startswith("#")]


def test_readme_starts_with_two_commands_and_ci_runs_the_test_one():
    train, test = _readme_commands()
    assert "scripts/strands_qwen3_8b.sh" in train
    ci_lines = ROOT.joinpath(".ci", "run").read_text().splitlines()
    assert test in ci_lines, "the README's test command must appear verbatim in .ci/run"
    assert "pytest" in test and "pip install" in test


def test_public_api_names():
    import slime_strands
    from slime_strands.tool_parsers import HermesToolParser

    for name in ("SGLangClient", "SGLangModel", "TokenManager", "ToolLimiter", "ToolIterationLimiter"):
        assert hasattr(slime_strands, name), name
    assert HermesToolParser.name == "hermes"
