"""The README and docs/ against the code: the README's opening commands are what CI runs, and every name, link,
command-line flag, setting, exit status and metric the pages show exists."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import itertools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "slime_strands"
README = ROOT.joinpath("README.md").read_text()
PAGES = {path: path.read_text() for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]}
ALL_TEXT = "\n".join(PAGES.values())
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def _doc(name: str) -> str:
    return PAGES[DOCS / name]


def _section(text: str, title: str) -> str:
    """The text of the section whose heading line starts with ``title``, up to the next heading of its level."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    level = len(title) - len(title.lstrip("#"))
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines)
    )
    return "\n".join(lines[start:end])


def _prose(text: str) -> str:
    """``text`` without its fenced blocks and inline code: what a reader sees as words, links and headings."""
    return re.sub(r"`[^`]*`", "", FENCE.sub("", text))


# -- the README's top: the two set-up commands, and CI runs the second as written ---------------------------


def _opening_commands() -> tuple[list[str], list[str]]:
    """The README's first two fenced blocks, which must both be bash and come before its first section."""
    first_section = README.index("\n## ")
    blocks = [m for m in FENCE.finditer(README) if m.start() < first_section]
    assert [m.group(1) for m in blocks] == ["bash", "bash"], (
        "two bash blocks before the README's first section"
    )
    run, test = (m.group(2).splitlines() for m in blocks)
    return run, test


def test_readme_is_one_screen_that_opens_with_the_two_commands():
    assert len(README.splitlines()) < 150
    run, test = _opening_commands()
    # 1: set up and run the main job on its embedded default (the demo server; a machine without GPUs):
    # tests/integration/test_readme_laptop.py runs it as written
    assert run[:3] == ["python3 -m venv .venv", ". .venv/bin/activate", run[2]] and "'.[demo]'" in run[2]
    assert any(line.startswith("slime-strands eval ") for line in run)
    assert any(line.startswith("pip install") and "'.[test]'" in line for line in test)
    for command in ("ruff check .", "ruff format --check .", "mypy", "pytest -q"):
        assert command in test, command
    assert "bash scripts/strands_qwen3_8b.sh" in _section(README, "### Train in slime"), "the GPU recipe"
    long = [line for line in run + test if len(line) > 110]
    assert long == [], "one short command a line: no long one-liners"


def test_ci_runs_the_readme_test_command_as_written():
    _, test = _opening_commands()
    printed = subprocess.run(
        ["bash", ".ci/readme-command", "--print"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert printed.splitlines() == test
    ci = ROOT.joinpath(".ci", "run").read_text().splitlines()
    commands = [line for line in ci if line.strip() and not line.lstrip().startswith("#")]
    # The README's test command is the last thing CI runs: after it, only the end of the slime-train smoke (which
    # ran beside it) is waited for and its status checked; no other test, install or lint.
    assert commands.count("bash .ci/readme-command") == 1, "CI runs the README's test command once"
    after = commands[commands.index("bash .ci/readme-command") + 1 :]
    ran = [
        line
        for line in after
        for word in ("pytest", "pip", "ruff", "mypy", "python", ".venv")
        if word in line
    ]
    assert ran == [], "the last thing CI runs is the README's test command"


def _run_block(tmp_path: Path, *lines: str) -> subprocess.CompletedProcess[str]:
    """.ci/readme-command on a README whose test block is ``lines``, run in ``tmp_path``."""
    readme = tmp_path / "README.md"
    marker = "<!-- .ci/run runs the next block exactly as written -->"
    readme.write_text("\n".join(["# x", "", marker, "```bash", *lines, "```", "", "## Next", ""]))
    return subprocess.run(
        ["bash", str(ROOT / ".ci" / "readme-command"), str(readme)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )


def test_the_readme_command_stops_at_the_first_line_that_fails(tmp_path):
    # `false && true` as a line: bash's `set -e` does not stop on a failure left of `&&`, a runner must.
    result = _run_block(tmp_path, "touch first", "false && true", "touch after")
    assert result.returncode != 0
    assert (tmp_path / "first").exists()
    assert not (tmp_path / "after").exists()
    assert "README $ false && true" in result.stdout


def test_the_readme_command_runs_its_lines_in_one_shell_with_their_own_stdin(tmp_path):
    # A variable set (or a virtualenv activated) on one line holds on the next; a line reading its stdin
    # gets the runner's stdin, not the rest of the block.
    result = _run_block(tmp_path, "# a comment", "", "value=42", "cat > swallowed", 'echo "$value" > kept')
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "kept").read_text() == "42\n"
    assert (tmp_path / "swallowed").read_text() == ""


def test_the_readme_command_refuses_a_readme_without_its_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n```bash\npytest -q\n```\n")
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "readme-command"), str(readme)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "has no test command" in result.stderr


# -- every page against the code and against each other ------------------------------------------------------


def test_public_api_names():
    import slime_strands
    from slime_strands.tool_parsers import HermesToolParser

    for name in ("SGLangClient", "SGLangModel", "TokenManager", "ToolLimiter", "ToolIterationLimiter"):
        assert hasattr(slime_strands, name), name
    assert HermesToolParser.name == "hermes"


def test_every_dotted_slime_strands_name_exists():
    names = set(re.findall(r"\bslime_strands(?:\.\w+)+", ALL_TEXT))
    assert len(names) > 10, names
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                target = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                assert hasattr(target, attr), f"the docs name {name}: {target.__name__} has no {attr!r}"
                target = getattr(target, attr)
            break
        else:
            raise AssertionError(f"the docs name {name}, which does not import")


def _anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a page: lower case, punctuation dropped, spaces to hyphens,
    ``-1``, ``-2`` ... for repeats."""
    seen: collections.Counter[str] = collections.Counter()
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return anchors


def test_every_link_between_the_pages_resolves():
    checked = 0
    for page, text in PAGES.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(text)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name}: link to {target}: no such file"
            if anchor:
                assert anchor in _anchors(file.read_text()), f"{page.name}: link to {target}: no such heading"
            checked += 1
    assert checked > 30, checked


def test_the_readme_links_every_docs_page():
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", README))
    assert linked == {path.name for path in DOCS.glob("*.md")}


def test_the_documentation_table_links_the_code_environment():
    """issue 43: the README's table of pages names the code environment, linked to the section that documents it
    (its settings file, its data set and its reward)."""
    table = _section(README, "## Documentation")
    links = re.findall(r"\[([^\]]*code environment[^\]]*)\]\(docs/([\w-]+\.md)#([\w-]+)\)", table)
    assert links, "the documentation table links no code environment"
    for _, page, anchor in links:
        heading = next(line for line in _doc(page).splitlines() if _anchors(line) == {anchor})
        section = _section(_doc(page), heading)
        for name in ("configs/strands_code.yaml", "--dataset humaneval", "slime_strands.reward.code_reward"):
            assert name in section, (page, anchor, name)


def test_benchmark_tables_live_only_in_performance_md():
    figure = re.compile(r"\d[\d,.]*\s?(?:ms|µs|/s)\b|\b\d+\.\d+x\b")
    assert figure.search(_doc("performance.md"))
    for page, text in PAGES.items():
        if page.name == "performance.md":
            continue
        rows = [line for line in FENCE.sub("", text).splitlines() if line.startswith("|")]
        measured = [row for row in rows if figure.search(row)]
        assert measured == [], f"{page.name}: a table of measured figures belongs in docs/performance.md"


def _layout_paths(block: str) -> set[str]:
    """The paths the Layout block lists: the names that start each line (``a.py b.py  what they do``), under
    the folders that the lines above them open (``name/`` at a smaller indentation)."""
    listed, folders = set(), []  # folders: (indentation, name) of the open ones
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while folders and folders[-1][0] >= indent:
            folders.pop()
        names = list(itertools.takewhile(lambda word: re.fullmatch(r"\w+(\.py|/)", word), line.split()))
        if not names:
            continue  # a description carried over from the line above
        prefix = "".join(f"{name}/" for _, name in folders)
        listed |= {prefix + name for name in names}
        if len(names) == 1 and names[0].endswith("/"):
            folders.append((indent, names[0].rstrip("/")))
    return listed


def test_layout_lists_every_module_and_nothing_else():
    block = _section(_doc("architecture.md"), "## Layout").split("```")[1]
    listed = {path for path in _layout_paths(block) if path.startswith("slime_strands/")}
    modules = {
        path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts
    }
    folders = {path.parent.relative_to(ROOT).as_posix() + "/" for path in PACKAGE.rglob("__init__.py")}
    inits = {f"{folder}__init__.py" for folder in folders if folder != "slime_strands/"}
    assert (modules | folders) - inits - listed == set(), (
        "modules missing from the Layout in docs/architecture.md"
    )
    assert listed - modules - folders == set(), "the Layout lists modules that do not exist"


def test_the_settings_table_lists_every_setting():
    from slime_strands.settings import PluginSettings

    table = _section(_doc("slime.md"), "## Plugin settings")
    keys = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            keys |= {k.removesuffix(".*") for k in re.findall(r"`([\w.*]+)`", row.split("|")[1])}
    assert keys == {f.name for f in dataclasses.fields(PluginSettings)}


def _command_lines() -> list[str]:
    """Every ``slime-strands ...`` command written on the pages: in bash blocks (continuation lines joined)
    and in inline code."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", ALL_TEXT, re.S):
        joined = re.sub(r"\\\n\s*|\n\s+\[", " [", block).replace(" [ ", " ")
        found += [line.split(" #")[0] for line in joined.splitlines() if line.startswith("slime-strands ")]
    found += re.findall(r"`(slime-strands [^`]+)`", ALL_TEXT.replace("\n", " "))
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
    from slime_strands.cli import errors as command_errors

    table = _section(_doc("cli.md"), "## Errors and exit statuses")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == {value for name, value in vars(command_errors).items() if name.startswith("EXIT_")}


def test_every_rollout_metric_key_is_logged():
    """The wandb table's ``rollout/strands/*`` keys are what ``metrics.aggregate`` produces from the samples, or
    what the process's client knows of the server (``metrics.SERVER_KEYS``)."""
    from slime_strands.agent.record import EpisodeRecord, SegmentRecord, Termination
    from slime_strands.metrics import SERVER_KEYS, aggregate
    from slime_strands.testing.slime_types import Sample

    segments = [
        SegmentRecord("main", "prompt", "compaction", "COMPLETED", 10, 5, 4, 1),
        SegmentRecord("main", "summarize", "end_turn", "COMPLETED", 8, 5, 4, 1, tokens_saved=7),
    ]
    # continued once: partial rollout's per-continuation keys are logged too
    record = EpisodeRecord(
        Termination.END_TURN, turns=2, tool_calls=1, tool_iters=1, tool_errors=1, parse_errors={"bad_json": 1},
        prompt_tokens=20, cached_tokens=10, response_tokens=10, generated_tokens=8, regenerations=1,
        segments=segments, segment=1, continuations=1, turns_saved=1,
    )  # fmt: skip
    sample = Sample(status=Sample.Status.COMPLETED, metadata={"strands": record.to_metadata()})
    logged = set(aggregate([sample])) | set(SERVER_KEYS)
    cells = [
        row.split("|")[1]
        for row in _section(_doc("training.md"), "## 5. Watch it in wandb").splitlines()
        if "`rollout/strands/" in row
    ]
    keys = [k.removeprefix("rollout/strands/") for cell in cells for k in re.findall(r"`([^`]+)`", cell)]
    assert len(keys) > 20, keys
    for key in keys:
        if key.startswith("_"):  # a suffix list: (`_mean`, `_p50`, ...)
            continue
        stem = re.sub(r"(\*|<\w+>)$", "", key)
        assert any(name == stem or (stem != key and name.startswith(stem)) for name in logged), key


def test_every_readme_block_the_pages_name_is_in_the_readme():
    """A page that sends the reader to the README's "X" block names a block the README has (docs/testing.md
    named "Try it on a laptop" after the README had renamed it)."""
    named = {
        (path.name, name)
        for path, text in PAGES.items()
        for name in re.findall(r"README's (?:first block )?\(?\"([^\"]+)\"", " ".join(text.split()))
    }
    assert named, "the pages name the README's blocks"
    missing = [(page, name) for page, name in sorted(named) if name not in " ".join(README.split())]
    assert missing == [], missing
