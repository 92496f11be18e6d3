"""Rewards (``--custom-rm-path``): math for dapo-math-17k training and AIME-2024 eval; code against unit tests.

Only the FINAL assistant turn is graded (after its reasoning): tool output and earlier turns never count,
so code that prints ``Answer: 42`` earns nothing. The answer is the last ``Answer:`` line, else the last
balanced ``\\boxed{}``. Integer labels (all of dapo-math-17k and AIME) are compared as integers after
normalisation: fast, deterministic and cheap. Other labels go to math-verify in a separate worker process
with a wall-clock limit (its own signal-based timeouts raise off the main thread, and some inputs hang).

In training a wrong answer is shaped by tool use (the seeds' recipe, :class:`RewardSettings`); in eval (the
episode record's ``evaluation``) the reward is plain 1.0 / 0.0 so ``eval/<name>`` is accuracy and slime's
pass@k works. Reward functions never raise for a sample (one that cannot be graded scores 0.0), never return
None and never block the event loop; invalid plugin settings raise ``SettingsError`` (a ``ConfigurationError``:
it would score every sample wrong). Given a list of samples (slime's batch mode: it calls ``--custom-rm-path``
with a list when generate returns ``list[Sample]``) they return a list of rewards.

``code_reward`` grades the LAST fenced Python block of the final answer (``code_grading.program``: strict, no
repair) against the row's tests (the label data_prep writes) in the sandbox, with ``reward.code``'s limits:
1.0 when every test passes (the share with ``reward.code.pass_fraction``), else 0.0; the verdict (status, the
failing test's first lines) goes to the sample's metadata under ``code_reward``. Whatever the program does, it
scores 0 and the step goes on; only a sandbox that cannot isolate here raises (a configuration error).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._slime.config import SlimeConfig
from ._verify_worker import verify_in_worker
from .agent.record import EpisodeRecord
from .code_grading import CodeLabelError, CodeTests, CodeVerdict, extract_program, grade_program
from .errors import ConfigurationError
from .settings import PluginSettings, RewardSettings
from .tool_parsers import get_tool_parser, registered_tool_parsers

__all__ = [
    "CODE_METADATA_KEY",
    "EVAL_GRADES",
    "EvalGrade",
    "accuracy",
    "code_reward",
    "eval_grade",
    "extract_answer",
    "final_answer_text",
    "grade",
    "math_reward",
]

logger = logging.getLogger(__name__)

_ANSWER_LINE = re.compile(r"answer\s*\**\s*:(.*)$", re.IGNORECASE)
_BOX = re.compile(r"\\(?:boxed|fbox)\b")
_INTEGER = re.compile(r"[+-]?\d+(?:\.0*)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))|\{,\}")
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|displaystyle)\s*\{([^{}]*)\}")
_NOISE = re.compile(r"\\[!,;: ]|~|\\left|\\right|\^\s*\{?\\circ\}?|\\%|%|\\degree|\$|\\\(|\\\)|\\\[|\\\]")
_ASSIGNMENT = re.compile(r"^[A-Za-z]\w*\s*=\s*")
# Tool-call and tool-result markup of every family: Hermes / Qwen3-Coder / GLM <tool_call>, <tool_response>,
# Kimi-K2's and DeepSeek's sections, DeepSeek-V3.2's DSML calls and <function_results>, MiniMax-M2's calls and
# <response>, Mistral's [TOOL_CALLS] (to the end of the turn) and [TOOL_RESULTS], Llama 3's <|python_tag|>.
_TOOL_BLOCKS = re.compile(
    r"<tool_call>.*?(?:</tool_call>|$)|<tool_response>.*?(?:</tool_response>|$)"
    r"|<\|tool_calls_section_begin\|>.*?(?:<\|tool_calls_section_end\|>|$)"
    r"|<｜tool▁calls▁begin｜>.*?(?:<｜tool▁calls▁end｜>|$)|<｜tool▁outputs?▁begin｜>.*?(?:<｜tool▁outputs?▁end｜>|$)"
    r"|<｜DSML｜function_calls>.*?(?:</｜DSML｜function_calls>|$)|<function_results>.*?(?:</function_results>|$)"
    r"|<minimax:tool_call>.*?(?:</minimax:tool_call>|$)|<response>.*?(?:</response>|$)"
    r"|\[TOOL_RESULTS\].*?(?:\[/TOOL_RESULTS\]|$)|\[TOOL_CALLS\].*$|<\|python_tag\|>.*$",
    re.S,
)
# End-of-turn / special tokens of common templates (Qwen/ChatML, GLM, Kimi, Llama 3, DeepSeek, MiniMax, Mistral,
# Gemma).
_SPECIAL = re.compile(
    r"<\|[^|<>]{1,40}\|>|<｜[^｜<>]{1,40}｜>|</?s>|<eos>|<end_of_turn>|\[gMASK\]|<sop>|\[e~\[|\]~!?b[\[\]]"
    r"|\[/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|THINK)\]"
)


@functools.cache
def _turn_start(parsers: tuple[str, ...]) -> re.Pattern[str]:
    """Where the last assistant turn starts when the rollout did not record it: the turn starts each registered
    tool parser's family declares (``ToolParser.turn_starts``), longest first."""
    starts = {start for name in parsers for start in get_tool_parser(name).turn_starts}
    return re.compile("|".join(re.escape(s) for s in sorted(starts, key=lambda s: (-len(s), s))))


def final_answer_text(response: str, metadata: dict | None = None) -> str:
    """The text of the last assistant turn after its reasoning; "" while the reasoning is unfinished.

    Uses the episode record's ``final_turn_chars`` (template-agnostic); else the last assistant turn start of a known
    template. A turn whose generation prompt opened ``<think>`` (Qwen3-thinking, GLM-4.7, DeepSeek thinking)
    is reasoning until its ``</think>``.
    """
    record = EpisodeRecord.in_metadata(metadata)
    chars = record.final_turn_chars if record is not None else None
    if isinstance(chars, int) and 0 < chars <= len(response):
        before, text = response[:-chars], response[-chars:]
    else:
        starts = list(_turn_start(tuple(registered_tool_parsers())).finditer(response))
        at = starts[-1].end() if starts else 0
        before, text = response[:at], response[at:]
    if _opens_reasoning(before, text):
        text = "<think>" + text
    closes = [(text.rfind(close), close) for close in _THINK_CLOSES if close in text]
    if closes:
        at, close = max(closes)
        text = text[at + len(close) :]
    elif any(opening in text for opening in _THINK_OPENS):
        return ""  # cut off while reasoning: no final answer
    text = _TOOL_BLOCKS.sub(" ", text)
    return _SPECIAL.sub(" ", text)


_THINK_OPENS = ("<think>", "[THINK]")
_THINK_CLOSES = ("</think>", "[/THINK]")
"""How reasoning is written: ``<think>`` (Qwen3, GLM, DeepSeek, Kimi, MiniMax), ``[THINK]`` (Mistral)."""


def _opens_reasoning(before: str, text: str) -> bool:
    """The generation prompt before the turn left ``<think>`` open (or the turn starts by opening it)."""
    return before.rstrip().endswith("<think>") and not text.lstrip().startswith("<think>")


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index of its ``}``, in one pass (unclosed braces are absent)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for i, char in enumerate(text):
        if char == "{":
            stack.append(i)
        elif char == "}" and stack:
            pairs[stack.pop()] = i
    return pairs


def _last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` (or ``\\boxed 5``); nested boxes are unwrapped.

    Linear in ``len(text)``: the policy can emit thousands of unclosed boxes.
    """
    closing: dict[int, int] | None = None
    for match in reversed(list(_BOX.finditer(text))):
        i = match.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] != "{":
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                return token.group(0)
            continue
        closing = _closing_braces(text) if closing is None else closing
        if i in closing:
            inner = text[i + 1 : closing[i]]
            return (_last_boxed(inner) or inner) if _BOX.search(inner) else inner
    return None


def extract_answer(final_text: str) -> str | None:
    """The last non-empty ``Answer:`` line (its box if boxed), else the last balanced box; None if neither."""
    for line in reversed(final_text.splitlines()):
        match = _ANSWER_LINE.search(line)
        if match:
            value = match.group(1).strip().strip("*").strip()
            if value:
                return _last_boxed(value) or value
    return _last_boxed(final_text)


def _normalize(answer: str) -> str:
    text = answer.strip()
    for _ in range(3):  # nested wrappers: \text{\textbf{5}}
        text = _WRAPPERS.sub(r"\1", text)
    text = _NOISE.sub("", text)
    text = _THOUSANDS.sub("", text).strip().rstrip(".").strip()
    return _ASSIGNMENT.sub("", text).strip()


def _as_int(text: str) -> int | None:
    text = _normalize(text).replace(" ", "")
    if not _INTEGER.fullmatch(text):
        return None
    return int(text.split(".")[0])


def grade(response: str, label: Any, *, metadata: dict | None = None) -> bool | None:
    """Grade without math-verify: True / False for integer labels (or no answer), None = needs math-verify."""
    return _grade(response, label, metadata)[0]


def _grade(response: str, label: Any, metadata: dict | None) -> tuple[bool | None, str | None]:
    """:func:`grade`'s verdict and the answer it extracted (what math-verify checks when the verdict is None)."""
    answer = extract_answer(final_answer_text(response, metadata))
    if answer is None:
        return False, None
    gold = _as_int(str(label))
    if gold is None:
        return None, answer
    pred = _as_int(answer)
    return (pred == gold if pred is not None else None), answer


async def _is_correct(sample: Any, settings: RewardSettings) -> bool:
    response = str(getattr(sample, "response", "") or "")
    label = getattr(sample, "label", None)
    if label is None or not str(label).strip():
        logger.warning("slime-strands reward: sample %s has no label", getattr(sample, "index", "?"))
        return False
    # Regex work over the whole response: off the event loop (responses reach hundreds of kB).
    verdict, answer = await asyncio.to_thread(_grade, response, label, getattr(sample, "metadata", None))
    if verdict is not None:
        return verdict
    return await verify_in_worker(str(answer), str(label), timeout_s=settings.math_verify_timeout_s)


async def math_reward(args: Any, sample: Any, **kwargs: Any) -> float | list[float]:
    """dapo-style reward: ``correct`` / ``incorrect``, shaped by tool use on failures in training only."""
    settings = SlimeConfig.of(
        args
    ).settings.reward  # invalid settings raise: every sample would be scored wrong
    if isinstance(sample, list):
        return list(await asyncio.gather(*(_math_reward(settings, s) for s in sample)))
    return await _math_reward(settings, sample)


async def _math_reward(settings: RewardSettings, sample: Any) -> float:
    try:
        correct = await _is_correct(sample, settings)
        record = EpisodeRecord.of(sample)
        if record is not None and record.evaluation:
            return 1.0 if correct else 0.0
        if correct:
            return float(settings.correct)
        score = float(settings.incorrect)
        if settings.tool_shaping and record is not None:
            shaped = score + (record.tool_iters - settings.shaping_baseline_iters) * settings.shaping_per_iter
            score = min(settings.shaping_cap, shaped)
        return score
    except Exception:  # a grading bug must not kill slime's rollout step
        logger.exception("slime-strands reward: grading failed for sample %s", getattr(sample, "index", "?"))
        return 0.0


async def accuracy(args: Any, sample: Any, **kwargs: Any) -> float | list[float]:
    """Plain accuracy (1.0 / 0.0), for eval configs: what pass@k and ``eval/<name>`` should count."""
    settings = SlimeConfig.of(args).settings.reward
    if isinstance(sample, list):
        return list(await asyncio.gather(*(_accuracy(settings, s) for s in sample)))
    return await _accuracy(settings, sample)


async def _accuracy(settings: RewardSettings, sample: Any) -> float:
    try:
        return 1.0 if await _is_correct(sample, settings) else 0.0
    except Exception:
        logger.exception("slime-strands reward: grading failed for sample %s", getattr(sample, "index", "?"))
        return 0.0


CODE_METADATA_KEY = "code_reward"
"""Where ``code_reward`` leaves its verdict in the sample's metadata (``inspect`` shows it)."""


async def code_reward(args: Any, sample: Any, **kwargs: Any) -> float | list[float]:
    """The program of the final answer against the row's tests, in the sandbox (see the module docstring)."""
    settings = SlimeConfig.of(args).settings  # invalid settings raise: every sample would be scored wrong
    if isinstance(sample, list):
        return list(await asyncio.gather(*(_code_reward(settings, s) for s in sample)))
    return await _code_reward(settings, sample)


async def _code_reward(settings: PluginSettings, sample: Any) -> float:
    return (await _code_graded(settings, sample))[0]


async def _code_graded(settings: PluginSettings, sample: Any) -> tuple[float, CodeVerdict]:
    """The score and the verdict of one sample (the verdict also goes to its metadata)."""
    try:
        verdict = await _grade_code(settings, sample)
    except ConfigurationError:
        raise  # no isolation here (or no pool): no sample could be graded, the run stops with the fix
    except Exception as exc:  # a grading bug must not kill slime's rollout step
        logger.exception(
            "slime-strands code reward: grading failed for sample %s", getattr(sample, "index", "?")
        )
        verdict = CodeVerdict("harness_error", detail=f"{type(exc).__name__}: {exc}"[:500])
    metadata = getattr(sample, "metadata", None)
    if isinstance(metadata, dict):
        metadata[CODE_METADATA_KEY] = verdict.to_metadata()
    record = EpisodeRecord.of(sample)
    pass_fraction = settings.reward.code.pass_fraction and not (record is not None and record.evaluation)
    return verdict.score(pass_fraction), verdict


async def _grade_code(settings: PluginSettings, sample: Any) -> CodeVerdict:
    try:
        tests = CodeTests.from_label(getattr(sample, "label", None))
    except CodeLabelError as exc:
        return CodeVerdict("bad_label", detail=str(exc))
    response = str(getattr(sample, "response", "") or "")
    final = await asyncio.to_thread(final_answer_text, response, getattr(sample, "metadata", None))
    program = extract_program(final)
    if program is None:
        return CodeVerdict(
            "no_program", total=len(tests.tests), detail="the final answer has no closed ```python block"
        )
    return await grade_program(program, tests, settings.reward.code, settings.sandbox)


@dataclass(frozen=True)
class EvalGrade:
    """One eval sample's grading: its reward and, under ``reward.kind: code``, the code verdict (what the
    trajectory row keeps for ``inspect``)."""

    reward: float
    code: CodeVerdict | None = None


async def _math_eval_grade(args: Any, sample: Any) -> EvalGrade:
    score = await accuracy(args, sample)
    assert isinstance(score, float), "one sample gets one score"
    return EvalGrade(score)


async def _code_eval_grade(args: Any, sample: Any) -> EvalGrade:
    reward, verdict = await _code_graded(SlimeConfig.of(args).settings, sample)
    return EvalGrade(reward, verdict)


EVAL_GRADES: dict[str, Callable[[Any, Any], Awaitable[EvalGrade]]] = {
    "math": _math_eval_grade,
    "code": _code_eval_grade,
}
"""``reward.kind`` -> how ``slime-strands eval`` grades one sample (plain 1.0 / 0.0 in eval), with what the row
keeps of it."""


async def eval_grade(args: Any, sample: Any) -> EvalGrade:
    """The eval command's grading of one sample under the settings' ``reward.kind``."""
    return await EVAL_GRADES[SlimeConfig.of(args).settings.reward.kind](args, sample)
