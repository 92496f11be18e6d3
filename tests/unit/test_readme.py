"""README's opening commands are what CI runs; the public API it documents exists."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
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


# -- the README against the code --------------------------------------------------------------------

README = ROOT.joinpath("README.md").read_text()
PACKAGE = ROOT / "slime_strands"


def _section(title: str) -> str:
    """The text of the section whose heading line starts with ``title``, up to the next heading of its level."""
    lines = README.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    level = len(title) - len(title.lstrip("#"))
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines)
    )
    return "\n".join(lines[start:end])


def test_every_dotted_slime_strands_name_exists():
    names = set(re.findall(r"\bslime_strands(?:\.\w+)+", README))
    assert len(names) > 10, names
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                target = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                assert hasattr(target, attr), f"README names {name}: {target.__name__} has no {attr!r}"
                target = getattr(target, attr)
            break
        else:
            raise AssertionError(f"README names {name}, which does not import")


def test_layout_lists_every_module_and_nothing_else():
    block = _section("## Layout").split("```")[1]
    listed = set(re.findall(r"\b(\w+\.py|\w+/)", block))
    modules = {p.name for p in PACKAGE.glob("*.py")} | {
        f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }
    for package in (p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        modules |= {p.name for p in package.glob("*.py")}
    assert modules - listed == set(), "modules missing from the README's Layout"
    stale = {name for name in listed - modules if name.endswith(".py")}
    assert stale == set(), "the Layout lists modules that do not exist"


def test_the_settings_table_lists_every_setting():
    from slime_strands.settings import PluginSettings

    table = _section("### Plugin settings")
    keys = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            keys |= {k.removesuffix(".*") for k in re.findall(r"`([\w.*]+)`", row.split("|")[1])}
    assert keys == {f.name for f in dataclasses.fields(PluginSettings)}


def _command_lines() -> list[str]:
    """Every ``slime-strands ...`` command written in the README: in bash blocks (continuation lines joined)
    and in inline code."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        joined = re.sub(r"\\\n\s*|\n\s+\[", " [", block).replace(" [ ", " ")
        found += [line.split(" #")[0] for line in joined.splitlines() if line.startswith("slime-strands ")]
    found += re.findall(r"`(slime-strands [^`]+)`", README.replace("\n", " "))
    return [line for line in found if re.fullmatch(r"[a-z-]+", line.split()[1])]  # not error messages


def test_every_command_line_flag_exists():
    from slime_strands.cli import _parser

    subcommands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    lines = _command_lines()
    assert {line.split()[1] for line in lines} == set(subcommands), "every command is shown"
    for line in lines:
        command = subcommands[line.split()[1]]
        for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", line):
            assert flag in command._option_string_actions, f"{line!r}: no option {flag}"


def test_the_exit_status_table_is_the_code():
    from slime_strands import command_errors

    table = _section("## The command line")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == {value for name, value in vars(command_errors).items() if name.startswith("EXIT_")}


def test_every_rollout_metric_key_is_logged():
    """The wandb table's ``rollout/strands/*`` keys are what ``metrics.aggregate`` produces."""
    from slime_strands.metrics import aggregate
    from slime_strands.record import EpisodeRecord, SegmentRecord, Termination
    from slime_strands.testing.slime_types import Sample

    segments = [
        SegmentRecord("main", "prompt", "compaction", "COMPLETED", 10, 5, 4, 1),
        SegmentRecord("main", "summarize", "end_turn", "COMPLETED", 8, 5, 4, 1, tokens_saved=7),
    ]
    record = EpisodeRecord(
        Termination.END_TURN, turns=2, tool_calls=1, tool_iters=1, tool_errors=1, parse_errors={"bad_json": 1},
        prompt_tokens=20, cached_tokens=10, response_tokens=10, generated_tokens=8, regenerations=1,
        segments=segments, segment=1,
    )  # fmt: skip
    sample = Sample(status=Sample.Status.COMPLETED, metadata={"strands": record.to_metadata()})
    logged = set(aggregate([sample]))
    cells = [
        row.split("|")[1]
        for row in _section("### 5. Watch it in wandb").splitlines()
        if "`rollout/strands/" in row
    ]
    keys = [k.removeprefix("rollout/strands/") for cell in cells for k in re.findall(r"`([^`]+)`", cell)]
    assert len(keys) > 20, keys
    for key in keys:
        if key.startswith("_"):  # a suffix list: (`_mean`, `_p50`, ...)
            continue
        stem = re.sub(r"(\*|<\w+>)$", "", key)
        assert any(name == stem or (stem != key and name.startswith(stem)) for name in logged), key
