"""The ``slime-strands`` command: run and evaluate the agent without slime, look at what the trainer would
see, and check a setup before launching a multi-GPU job.

    slime-strands eval --base-url http://127.0.0.1:30000 --tokenizer Qwen/Qwen3-8B --data aime-2024.jsonl --out traj.jsonl
    slime-strands inspect traj.jsonl --index 3:1 [--html traj.html]
    slime-strands drift traj.jsonl
    slime-strands check-template /root/models/Qwen/Qwen3-8B
    slime-strands validate-config configs/strands_math.yaml
    slime-strands check-server http://127.0.0.1:30000

This module only parses arguments and dispatches; the work lives in ``cli/eval/``, ``cli/inspect/`` (over
``trajectories/view.py``), ``cli/drift.py``, ``template/`` and ``settings``. Errors are one line with a
hint, never a traceback; exit statuses are listed in :mod:`slime_strands.cli.errors`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, InputError
from ..settings import SANDBOX_PLACEMENTS
from .errors import (
    EXIT_FAILURES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SERVER,
    EXIT_USAGE,
    CommandError,
)

__all__ = ["main"]

_EXIT_CODES = f"""exit status:
  {EXIT_OK}    done
  {EXIT_FAILURES}    a check of a template or a config failed, or some eval trajectories FAILED (grouped by cause)
  {EXIT_USAGE}    usage or input error (arguments, data / config / trajectory file, tokenizer, template, tool)
  {EXIT_SERVER}    the SGLang server or router cannot be reached or is not healthy (check-server, eval's start), or
       stopped answering during an eval
  {EXIT_INTERRUPTED}  interrupted (an eval with --out resumes where it stopped)"""

_INTERRUPTED = (EXIT_INTERRUPTED, "interrupted (Ctrl-C)")
_USAGE = "usage or input error"
_STATUSES: dict[str, tuple[tuple[int, str], ...]] = {
    "eval": (
        (EXIT_OK, "done"),
        (EXIT_FAILURES, "some trajectories FAILED (the end of the run groups them by cause)"),
        (EXIT_USAGE, f"{_USAGE} (arguments, data / config / --out file, tokenizer, template, tool, wandb)"),
        (EXIT_SERVER, "the SGLang server or router cannot be reached or is not healthy at the start, or stopped "
         "answering during the run"),
        (EXIT_INTERRUPTED, "interrupted (Ctrl-C; with --out a rerun resumes where it stopped)"),
    ),
    "inspect": ((EXIT_OK, "done"), (EXIT_USAGE, f"{_USAGE} (arguments, trajectory file, --index, tokenizer)"),
                _INTERRUPTED),
    "drift": ((EXIT_OK, "done"), (EXIT_USAGE, f"{_USAGE} (arguments, trajectory file, --index, tokenizer)"),
              _INTERRUPTED),
    "check-template": (
        (EXIT_OK, "done: usable in every thinking mode checked"),
        (EXIT_FAILURES, "NOT usable in a thinking mode checked (the report says why)"),
        (EXIT_USAGE, f"{_USAGE} (arguments, a tokenizer that cannot be loaded)"),
        _INTERRUPTED,
    ),
    "validate-config": (
        (EXIT_OK, "done: the file is valid"),
        (EXIT_FAILURES, "the file is invalid (the line says why)"),
        (EXIT_USAGE, f"{_USAGE} (arguments, no such file)"),
        _INTERRUPTED,
    ),
    "check-server": (
        (EXIT_OK, "done: the server is healthy"),
        (EXIT_USAGE, f"{_USAGE} (arguments)"),
        (EXIT_SERVER, "the SGLang server or router cannot be reached or is not healthy (within --wait)"),
        _INTERRUPTED,
    ),
}  # fmt: skip
"""The exit statuses each command can return, as its ``--help`` lists them (the whole table is the top-level
help's and :mod:`slime_strands.cli.errors`')."""


def _statuses(command: str) -> str:
    lines = [
        f"  {code:<4} {textwrap.fill(text, 92, subsequent_indent=' ' * 7)}"
        for code, text in _STATUSES[command]
    ]
    return "exit status:\n" + "\n".join(lines)


LOW_LOGPROB = -2.3
"""Default low-confidence threshold of ``inspect``: a sampled token with probability below ~0.1."""


# -- eval ---------------------------------------------------------------------------------------------


def _check_server_url(url: str, flag: str) -> None:
    """A server URL is ``http(s)://HOST[:PORT]``: refused here in one line, not deep in the HTTP client as a
    traceback (``http://127.0.0.1:30000:`` has no integer port)."""
    hint = "write it as http://HOST:PORT, e.g. http://127.0.0.1:30000"
    if not url.startswith(("http://", "https://")):
        raise CommandError(f"{flag} {url!r} is not an http(s) URL", hint=hint)
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 - the property is the check: it raises on a port that is no integer
    except ValueError:
        raise CommandError(f"{flag} {url!r} has no valid port", hint=hint) from None
    if not parts.hostname:
        raise CommandError(f"{flag} {url!r} has no host", hint=hint)


def _eval(ns: argparse.Namespace) -> int:
    from .eval.failures import failure_lines
    from .eval.runner import EvalOptions, run_eval
    from .eval.summary import format_table

    _check_server_url(ns.base_url, "--base-url")
    _check_sampling_flags(ns)
    options = EvalOptions(
        base_url=ns.base_url,
        tokenizer=ns.tokenizer,
        data=ns.data,
        n=ns.n,
        concurrency=ns.concurrency,
        limit=ns.limit,
        config=ns.config,
        out=ns.out,
        wandb_project=ns.wandb_project,
        temperature=ns.temperature,
        top_p=ns.top_p,
        max_response_len=ns.max_response_len,
        sampling_params=_sampling_param_flags(ns.sampling_param or []),
        sandbox_placement=ns.sandbox_placement,
        rollout_workers=ns.rollout_workers,
    )
    try:
        report = run_eval(options)
    except KeyboardInterrupt:
        _say_interrupted(ns)
        return EXIT_INTERRUPTED
    print(format_table(report.summaries))
    where = f" in {ns.out}" if ns.out else " (not saved: pass --out FILE.jsonl to keep them)"
    print(f"\n{report.ran} trajectories generated, {report.resumed} resumed{where}")
    for line in failure_lines(report.failure_errors):  # by cause; "rerun" only where a rerun helps
        print(line, file=sys.stderr)
    return report.exit_code


def _say_interrupted(ns: argparse.Namespace) -> None:
    """Ctrl-C in an eval: where the finished trajectories are, or that none finished."""
    from ..trajectories.file import complete_lines

    if not ns.out:
        _say(ns, "interrupted", hint="pass --out FILE.jsonl to keep trajectories and resume")
    elif Path(ns.out).is_file() and next(complete_lines(ns.out), None) is not None:
        _say(
            ns, f"interrupted; finished trajectories are in {ns.out}", hint="rerun the same command to resume"
        )
    else:
        _say(
            ns,
            f"interrupted before any trajectory finished: nothing was written to {ns.out}",
            hint="rerun the same command to start again",
        )


def _check_sampling_flags(ns: argparse.Namespace) -> None:
    """``--temperature`` / ``--top-p`` SGLang would refuse (every request, after the run started): one line now."""
    from ..provider.sampling_ranges import range_problem

    for flag, key in (("--temperature", "temperature"), ("--top-p", "top_p")):
        problem = range_problem(key, getattr(ns, key))
        if problem:
            raise CommandError(f"{flag}: {problem}", hint=f"pass a value SGLang accepts to {flag}")


def _sampling_param_flags(flags: Sequence[str]) -> dict[str, Any]:
    """``--sampling-param KEY=JSON`` flags as a mapping (a later flag for the same key wins); a CommandError
    naming the flag for a missing ``=``, a value that is not JSON or a key SGLang does not accept."""
    from ..provider.sampling import SamplingParamError, SamplingParams
    from ..provider.sampling_ranges import range_problems

    hint = "write KEY=JSON, e.g. --sampling-param top_k=20 --sampling-param 'stop=[\"</answer>\"]'"
    params: dict[str, Any] = {}
    for flag in flags:
        key, sep, text = flag.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--sampling-param {flag!r} is not KEY=JSON", hint=hint)
        try:
            params[key.strip()] = json.loads(text)
        except ValueError as exc:
            raise CommandError(
                f"--sampling-param {flag!r}: the value is not JSON ({exc})",
                hint=hint + " (a string value needs JSON quotes: regex='\"...\"')",
            ) from None
    try:
        SamplingParams(params, where="--sampling-param")
    except SamplingParamError as exc:
        raise CommandError(str(exc), hint="fix or drop that --sampling-param") from None
    problems = range_problems(params)
    if problems:
        key, problem = problems[0]
        raise CommandError(f"--sampling-param {key}: {problem}", hint="fix or drop that --sampling-param")
    return params


# -- inspect ------------------------------------------------------------------------------------------


def _inspect(ns: argparse.Namespace) -> int:
    from .trajectory_keys import find_row

    if ns.list:
        return _list_rows(ns.path)
    _, row = find_row(ns.path, ns.index)
    from ..template.tokenizer_loading import load_tokenizer
    from ..trajectories.view import build_view
    from .inspect.page import render_html
    from .inspect.terminal import render_terminal, render_token_table

    view = build_view(row, load_tokenizer(ns.tokenizer or row.tokenizer))
    if ns.html:
        try:
            Path(ns.html).write_text(render_html(view, low_logprob=ns.low_logprob), encoding="utf-8")
        except OSError as exc:
            raise CommandError(
                f"cannot write {ns.html}: {exc.strerror or exc}", hint="choose a writable path"
            ) from exc
        print(f"wrote {ns.html}: trajectory {row.key}, {sum(s.tokens for s in view.segments)} tokens")
    elif ns.tokens:
        sys.stdout.write(render_token_table(view))
    else:
        sys.stdout.write(render_terminal(view, color=_color(ns.color), low_logprob=ns.low_logprob))
    return EXIT_OK


def _list_rows(path: str) -> int:
    """One line per trajectory, in key order (the later line of a retried key), keyed as --index takes it."""
    from ..trajectories.file import complete_lines
    from .text_table import format_columns
    from .trajectory_keys import latest_rows

    header = ["key", "dataset", "reward", "status", "termination", "turns", "tool_calls", "tokens"]
    latest = latest_rows(path)
    rows = [
        [row.key, row.dataset, f"{row.reward:g}", row.status, row.termination, str(row.record.turns),
         str(row.record.tool_calls), str(sum(len(s) for s in row.segments))]
        for _, row in latest
    ]  # fmt: skip
    print(format_columns(header, rows, left=len(header), rule=False))
    earlier = sum(1 for _ in complete_lines(path)) - len(latest)
    if earlier:
        print(f"({earlier} earlier line(s) of retried keys not shown: a key's later line is its trajectory)")
    return EXIT_OK


def _color(choice: str) -> bool:
    if choice != "auto":
        return choice == "always"
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


# -- drift --------------------------------------------------------------------------------------------


def _drift(ns: argparse.Namespace) -> int:
    from ..template.tokenizer_loading import load_tokenizer
    from .drift import format_reports, measure, report_json
    from .trajectory_keys import find_row, latest_rows

    rows = (
        [find_row(ns.path, ns.index)[1]] if ns.index is not None else [row for _, row in latest_rows(ns.path)]
    )
    if not rows:
        raise CommandError(
            f"{ns.path}: no trajectories", hint="run `slime-strands eval ... --out FILE` first"
        )
    tokenizers: dict[str, Any] = {}
    reports = []
    for row in rows:
        name = ns.tokenizer or row.tokenizer
        if name not in tokenizers:
            tokenizers[name] = load_tokenizer(name)
        reports.append(measure(row, tokenizers[name]))
    if ns.json:
        for report in reports:
            print(report_json(report))
    else:
        print(format_reports(reports))
    return EXIT_OK


# -- checks -------------------------------------------------------------------------------------------


def _check_template(ns: argparse.Namespace) -> int:
    """Per thinking mode: the family, the tool parser, how a turn ends, and whether token-in/token-out is safe."""
    from ..template.tokenizer_loading import load_tokenizer
    from .checks import check_template

    tools: list[Any] | None = [] if ns.config is None else _settings_tools(ns.config)
    if tools is None:
        return EXIT_FAILURES
    tokenizer = load_tokenizer(ns.tokenizer)
    modes = [None, True, False] if ns.enable_thinking == "all" else [_tristate(ns.enable_thinking)]
    reports = [check_template(tokenizer, mode, ns.tool_parser, tools) for mode in modes]
    for report in reports:
        print("\n".join(report.lines()))
    return EXIT_OK if all(r.usable for r in reports) else EXIT_FAILURES


def _settings_tools(path: str) -> list[Any] | None:
    """The template-format tools of the settings file ``path`` (its Python tools imported, its MCP servers
    started, their tools listed and checked, then stopped, as at a run's first sample); None after printing
    why the file is invalid."""
    from ..agent.runtime import import_tools
    from ..settings import PluginSettings
    from ..template.messages import to_template_tools

    if not Path(path).is_file():
        raise CommandError(f"{path}: no such file", hint="pass the YAML given to --custom-config-path")
    try:
        settings = PluginSettings.from_yaml(path)
        tools = import_tools(settings)
        mcp_tools = asyncio.run(_mcp_tools(settings, tools)) if settings.mcp_servers else []
    except (OSError, ConfigurationError) as exc:
        print(f"{path}: invalid: {' '.join(str(exc).split())}")
        return None
    return to_template_tools([tool.tool_spec for tool in [*tools, *mcp_tools]]) or []


def _validate_config(ns: argparse.Namespace) -> int:
    """The file's settings, the tools it names (imported, as a run would) and its sampling values; then what
    it sets, in a few lines."""
    from ..agent.runtime import import_tools
    from ..provider.sampling_ranges import range_problems
    from ..settings import PluginSettings
    from .settings_summary import settings_summary

    if not Path(ns.path).is_file():
        raise CommandError(f"{ns.path}: no such file", hint="pass the YAML given to --custom-config-path")
    try:
        settings = PluginSettings.from_yaml(ns.path, other_keys=ns.allow_other_keys)
        tools = import_tools(settings)
        mcp_tools = asyncio.run(_mcp_tools(settings, tools)) if settings.mcp_servers else []
    except (OSError, ConfigurationError) as exc:
        print(f"{ns.path}: invalid: {' '.join(str(exc).split())}")
        return EXIT_FAILURES
    problems = range_problems(settings.sampling_params)
    if problems:
        key, problem = problems[0]
        print(f"{ns.path}: invalid: strands.sampling_params.{key}: {problem}")
        return EXIT_FAILURES
    summary = settings_summary(settings, tools, mcp_tools)
    print("\n".join([f"{ns.path}: ok", *(f"  {line}" for line in summary)]))
    return EXIT_OK


async def _mcp_tools(settings: Any, tools: list[Any]) -> list[Any]:
    """The MCP servers' tools, as a run's first sample gets them (each server started, its tools listed and
    checked, then stopped)."""
    from ..mcp_tools import McpToolbox

    toolbox = McpToolbox(settings.mcp_servers)
    try:
        await toolbox.preflight([tool.tool_name for tool in tools])
        return toolbox.offered()
    finally:
        await toolbox.aclose()


def _check_server(ns: argparse.Namespace) -> int:
    from ..provider.client import SGLangClient, SGLangError

    _check_server_url(ns.url, "URL")

    async def check() -> int:
        client = SGLangClient(ns.url, max_retries=1, retry_delay=0.5, timeout=10.0)
        try:
            healthy = await _healthy_within(client, ns.wait)
            print(f"{ns.url}/health: {'ok' if healthy else 'NOT healthy'}")
            if not healthy:
                within = f" within {ns.wait:g} s" if ns.wait > 0 else ""
                _say(ns, f"cannot reach a healthy SGLang server at {ns.url}{within}", hint=_SERVER_HINT)
                return EXIT_SERVER
            try:
                print(f"model_info: {await client.model_info()}")
            except SGLangError as exc:
                print(f"model_info: unavailable ({exc})")
            try:
                print(f"context length: {await client.context_length()}")
            except SGLangError as exc:
                print(f"context length: unavailable ({exc})")
            return EXIT_OK
        finally:
            await client.aclose()

    return asyncio.run(check())


async def _healthy_within(client: Any, seconds: float) -> bool:
    """``/health`` until it answers 200 or ``seconds`` pass (0: once): a server started in the background
    answers once it has loaded."""
    deadline = time.monotonic() + seconds
    while not await client.health():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.25)
    return True


_SERVER_HINT = "start it (python -m sglang.launch_server --model-path MODEL --port 30000) or check the URL"


def _tristate(value: str) -> bool | None:
    return {"none": None, "true": True, "false": False}[value]


# -- parsing ------------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slime-strands",
        description="Run, evaluate and inspect token-in/token-out Strands agents on SGLang, without slime; "
        "check a setup before training.",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_eval(commands)
    _add_inspect(commands)
    _add_drift(commands)
    _add_check_template(commands)
    _add_validate_config(commands)
    _add_check_server(commands)
    return parser


def _command(
    commands: Any, name: str, summary: str, description: str, examples: str
) -> argparse.ArgumentParser:
    return commands.add_parser(  # type: ignore[no-any-return]
        name,
        help=summary,
        description=textwrap.fill(description, 100),
        epilog=f"examples:\n{examples}\n\n{_statuses(name)}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_eval(commands: Any) -> None:
    p = _command(
        commands,
        "eval",
        "run the agent on a dataset against a running SGLang server: accuracy, pass@k, trajectories",
        "Run the configured agent (plugin settings: --config) on every prompt of --data, --n times, against a "
        "running SGLang server or router, through the same episode code and eval reward slime uses. Shows a "
        "progress bar (done / running / failed, generated tokens/s, accuracy so far), then a summary table per "
        "dataset: accuracy, unbiased pass@k (k = 1, 2, 4, ... n), mean turns and tool calls, parse-error, "
        "truncation and failure rates. With --out, one JSON line per trajectory (prompt, messages, token ids, "
        "loss mask, logprobs, reward, status, termination, metrics); rerunning with the same --out skips the "
        "finished rows (key: prompt index:sample) and retries FAILED ones.",
        "  slime-strands eval --base-url http://127.0.0.1:30000 --tokenizer Qwen/Qwen3-8B \\\n"
        "      --data /root/data/aime-2024.jsonl --n 16 --config configs/strands_math.yaml --out aime.jsonl\n"
        "  slime-strands eval --base-url http://127.0.0.1:30000 --tokenizer /root/models/Qwen/Qwen3-8B \\\n"
        "      --data dapo.jsonl --limit 50 --n 4 --wandb-project my-evals",
    )
    _add_eval_inputs(p.add_argument_group("what to run"))
    _add_eval_sampling(p.add_argument_group("sampling"))
    _add_eval_outputs(p.add_argument_group("where results go"))
    p.set_defaults(run=_eval)


def _add_eval_inputs(p: argparse._ArgumentGroup) -> None:
    """The server, the tokenizer, the data and how much of it runs at once."""
    p.add_argument(
        "--base-url",
        metavar="URL",
        required=True,
        help="SGLang server or router, e.g. http://127.0.0.1:30000",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH_OR_HUB_ID",
        required=True,
        help="checkpoint folder or hub id of the served model's tokenizer",
    )
    p.add_argument(
        "--data",
        metavar="FILE.jsonl",
        required=True,
        help='JSONL of {"prompt": ..., "label": ...} rows, as python -m data_prep.prepare writes (a "dataset" or '
        '"source" field, top level or in "metadata", gives per-dataset rows)',
    )
    p.add_argument("--n", metavar="N", type=_positive_int, default=4, help="samples per prompt (default: 4)")
    p.add_argument(
        "--concurrency",
        metavar="N",
        type=_positive_int,
        default=256,
        help="episodes running at once (default: 256)",
    )
    p.add_argument("--limit", metavar="N", type=_positive_int, help="only the first N prompts")
    p.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="plugin settings YAML (its strands: section, as configs/strands_math.yaml; default: the built-in math "
        "agent); not slime's --eval-config (configs/eval_aime.yaml)",
    )
    p.add_argument(
        "--sandbox-placement",
        choices=SANDBOX_PLACEMENTS,
        help="where the model's code runs, over the config's sandbox.placement: local (this process) or ray (a "
        "pool of Ray actors, sandbox.ray: joins the cluster at RAY_ADDRESS, else starts a local Ray)",
    )
    p.add_argument(
        "--rollout-workers",
        metavar="N",
        type=int,
        help="run the episodes on N Ray rollout workers, over the config's rollout_workers.count (0: in this "
        "process; joins the cluster at RAY_ADDRESS, else starts a local Ray)",
    )


def _add_eval_outputs(p: argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--out", metavar="FILE.jsonl", help="trajectory JSONL to write (and to resume from when it exists)"
    )
    p.add_argument(
        "--wandb-project",
        metavar="PROJECT",
        help="log the summary and a trajectories table to this wandb project",
    )


def _add_eval_sampling(p: argparse._ArgumentGroup) -> None:
    """What every turn is sent with (as slime's eval sends it), and the response budget."""
    p.add_argument(
        "--temperature", metavar="T", type=float, default=1.0, help="sampling temperature (default: 1.0)"
    )
    p.add_argument("--top-p", metavar="P", type=float, default=1.0, help="nucleus sampling (default: 1.0)")
    p.add_argument(
        "--max-response-len",
        metavar="TOKENS",
        type=_positive_int,
        default=16384,
        help="token budget of the whole response: every turn and tool output (default: 16384, as the AIME eval)",
    )
    p.add_argument(
        "--sampling-param",
        metavar="KEY=JSON",
        action="append",
        help="an SGLang sampling param sent with every turn, the value as JSON (repeat the flag for several): "
        "top_k=20, 'stop=[\"</answer>\"]', 'regex=\"...\"', 'logit_bias={\"151643\": -100}'. Wins over the "
        "config's strands.sampling_params and --temperature / --top-p; max_new_tokens caps each turn "
        "(--max-response-len stays the budget of the whole response)",
    )


def _add_inspect(commands: Any) -> None:
    p = _command(
        commands,
        "inspect",
        "show a trajectory token by token: trained tokens, turns, tool calls, logprobs (terminal or HTML)",
        "Show one trajectory of an eval's --out file token by token: trained tokens (loss mask 1) apart from "
        "prompt and tool / template tokens, turn and segment boundaries, the tool calls of each turn and their "
        "results, and low-confidence sampled tokens. --html writes one self-contained page (hover a token for "
        "its id and logprob).",
        "  slime-strands inspect aime.jsonl --list\n"
        "  slime-strands inspect aime.jsonl --index 3:1\n"
        "  slime-strands inspect aime.jsonl --index -1 --html last.html\n"
        "  slime-strands inspect aime.jsonl --index 3 --tokens | grep -P '\\t1\\t-[3-9]'",
    )
    p.add_argument("path", help="trajectory JSONL written by slime-strands eval --out")
    p.add_argument(
        "--index",
        metavar="KEY",
        help="which trajectory, by row key as --list shows it: P:S is sample S of prompt P (its position in "
        "--data), P alone is P:0, -K the K-th from the end in key order (default: the first key). Not the line "
        "order: lines are written as episodes finish",
    )
    p.add_argument(
        "--list", action="store_true", help="list the trajectories in key order (key, reward, status, ...)"
    )
    p.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML page instead of printing")
    p.add_argument(
        "--tokens",
        action="store_true",
        help="one tab-separated line per token (segment, index, block, mask, ...)",
    )
    p.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="colours in the terminal (auto: when stdout is a terminal and NO_COLOR is unset)",
    )
    p.add_argument(
        "--low-logprob",
        metavar="LOGPROB",
        type=float,
        default=LOW_LOGPROB,
        help=f"highlight trained tokens sampled with a logprob below this (default: {LOW_LOGPROB}, p < 0.1)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH_OR_HUB_ID",
        help="tokenizer to decode with (default: the one the row names)",
    )
    p.set_defaults(run=_inspect)


def _add_drift(commands: Any) -> None:
    p = _command(
        commands,
        "drift",
        "count the tokens a text pipeline would change: re-tokenized text, re-rendered chat template",
        "Per trajectory: how many of its tokens would differ if the conversation were re-tokenized from its "
        "text, and if it were re-rendered with the chat template (Qwen3 drops empty and earlier reasoning, tool "
        "calls are re-serialised): counts, trained tokens among them, share, and the first difference. The "
        "number that shows why token-in/token-out matters.",
        "  slime-strands drift aime.jsonl\n  slime-strands drift aime.jsonl --index 3:1 --json",
    )
    p.add_argument("path", help="trajectory JSONL written by slime-strands eval --out")
    p.add_argument(
        "--index",
        metavar="KEY",
        help="only this trajectory: its row key P:S (P alone is P:0, -K the K-th from the end in key order)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per trajectory instead of the table")
    p.add_argument(
        "--tokenizer", metavar="PATH_OR_HUB_ID", help="tokenizer to use (default: the one each row names)"
    )
    p.set_defaults(run=_drift)


def _add_check_template(commands: Any) -> None:
    template = _command(
        commands,
        "check-template",
        "report a tokenizer's family, tool parser, end of turn and whether token-in/token-out is safe",
        "Probe a tokenizer's chat template per thinking mode: the model family, the tool parser auto picks (or "
        "whether the one named reads the tool call the template renders), how a turn ends, and whether "
        "incremental token-in/token-out rendering reproduces the template.",
        "  slime-strands check-template /root/models/Qwen/Qwen3-8B\n"
        "  slime-strands check-template Qwen/Qwen3-8B --enable-thinking false --tool-parser hermes\n"
        "  slime-strands check-template Qwen/Qwen3-8B --config configs/strands_mcp.yaml",
    )
    template.add_argument("tokenizer", help="local folder or hub id of the tokenizer / checkpoint")
    template.add_argument(
        "--enable-thinking",
        choices=["all", "none", "true", "false"],
        default="all",
        help="thinking modes to check (default: all; none = the template's default)",
    )
    template.add_argument(
        "--tool-parser",
        default="auto",
        help="auto (default) or a parser name, as in the plugin settings: NOT usable (exit 1) when it cannot "
        "read the tool call the template renders",
    )
    template.add_argument(
        "--config",
        metavar="FILE",
        help="a plugin settings file: its tools (Python tools imported, MCP servers started and their tools "
        "listed) are offered in the probe, each checked to be shown and its call read back by the parser",
    )
    template.set_defaults(run=_check_template)


def _add_validate_config(commands: Any) -> None:
    config = _command(
        commands,
        "validate-config",
        "validate a --custom-config-path YAML (strands: section), import its tools",
        "Validate the plugin settings in a YAML file's strands: section (unknown keys, a top-level key other than "
        "strands and bad values are errors), import the tools it names, and print what it sets: the tools and "
        "every setting that differs from its default.",
        "  slime-strands validate-config configs/strands_math.yaml\n"
        "  slime-strands validate-config my-custom-config.yaml --allow-other-keys",
    )
    config.add_argument("path", help="the YAML file")
    config.add_argument(
        "--allow-other-keys",
        action="store_true",
        help="accept top-level keys besides strands: (a --custom-config-path file that also holds keys for "
        "slime's args or another plugin); a near-miss of strands (strand, Strands) stays an error",
    )
    config.set_defaults(run=_validate_config)


def _add_check_server(commands: Any) -> None:
    server = _command(
        commands,
        "check-server",
        "check an SGLang server or router is reachable",
        "Check an SGLang server or router: /health, its model info and context window. --wait waits for a "
        "server still starting (in the background) to answer.",
        "  slime-strands check-server http://127.0.0.1:30000\n"
        "  slime-strands check-server http://127.0.0.1:30000 --wait 600   # until it has loaded",
    )
    server.add_argument("url", help="e.g. http://127.0.0.1:30000")
    server.add_argument(
        "--wait",
        metavar="SECONDS",
        type=float,
        default=0.0,
        help="keep asking /health for up to this long (default: 0, ask once)",
    )
    server.set_defaults(run=_check_server)


# -- entry point --------------------------------------------------------------------------------------


def _say(ns: argparse.Namespace, message: str, *, hint: str | None = None) -> None:
    """One line on stderr: ``slime-strands <command>: error: <message> -- hint: <hint>``."""
    text = f"slime-strands {ns.command}: error: {message}"
    print(text + (f" -- hint: {hint}" if hint else ""), file=sys.stderr)


def _configuration_hint(exc: ConfigurationError) -> str | None:
    """The command that diagnoses this kind of configuration error, or None where none does: a sandbox or Ray
    pool that cannot start says its own fix (pip install, sandbox.placement: local), which no check helps with."""
    from ..sandbox import SandboxIsolationError, SandboxPoolError
    from ..template.chat_template import TemplateError

    if isinstance(exc, (SandboxPoolError, SandboxIsolationError)):
        return None
    if isinstance(exc, TemplateError):
        return "slime-strands check-template TOKENIZER reports what the chat template can do"
    return (
        "fix the plugin settings or the setup the message names (slime-strands validate-config FILE checks a "
        "settings file and imports its tools; check-template a chat template and its tool parser)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        return int(ns.run(ns))
    except InputError as exc:  # a CommandError, or bad input found below the command (a trajectory file)
        _say(ns, str(exc), hint=exc.hint)
        return exc.exit_code if isinstance(exc, CommandError) else EXIT_USAGE
    except ConfigurationError as exc:
        _say(ns, " ".join(str(exc).split()), hint=_configuration_hint(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say(ns, "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `slime-strands inspect ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
