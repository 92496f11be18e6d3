"""Which model family a tokenizer belongs to: the tool parser ``auto`` picks and the ``check-template`` report.

The parser is chosen by what the chat template DOES, not by a model name: the template renders a known tool
call, and the parser that reads exactly that call back is the family's format. Only when the template renders
no call a parser can read do the tokenizer's special tokens decide, and only when one format's tokens are
there. Otherwise the answer is a :class:`~slime_strands.errors.ConfigurationError` naming the choices.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError
from ..tool_parsers import AUTO, ToolCall, ToolCallError, ToolParser, get_tool_parser, registered_tool_parsers
from .render import ChatRenderer, TemplateError

__all__ = [
    "TemplateReport",
    "check_template",
    "detect_tool_parser",
    "render_assistant_turn",
    "select_tool_parser",
]

_QUESTION = "Which format 6d0b?"
_ARGUMENTS = {"x": 7, "note": "probe text 31f"}
_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "A probe tool.",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "note": {"type": "string"}},
            "required": ["x", "note"],
        },
    },
}
_SCHEMAS = {"probe_tool": _TOOL["function"]["parameters"]}
_CALL = {
    "id": "functions.probe_tool:0",
    "type": "function",
    "function": {"name": "probe_tool", "arguments": _ARGUMENTS},
}
_DETECTED: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[str, str]]] = (
    weakref.WeakKeyDictionary()
)
"""What :func:`detect_tool_parser` found, per tokenizer object (and forgotten with it): the detection renders
the template several times and every episode's ``SGLangModel`` asks for it."""


def select_tool_parser(renderer: ChatRenderer, choice: ToolParser | str | None = AUTO) -> ToolParser:
    """The parser for ``choice``: an instance as is, a registered name, or ``auto`` (detected)."""
    if isinstance(choice, ToolParser):
        return choice
    if choice is None or choice == AUTO:
        return get_tool_parser(detect_tool_parser(renderer)[0])
    return get_tool_parser(choice)


def detect_tool_parser(renderer: ChatRenderer) -> tuple[str, str]:
    """``(parser name, how it was decided)`` for the renderer's tokenizer; ConfigurationError if it cannot tell."""
    tokenizer = renderer.tokenizer
    found = _DETECTED.setdefault(tokenizer, {})
    key = (tokenizer.chat_template, renderer.enable_thinking, tuple(registered_tool_parsers()))
    if key not in found:
        found[key] = _detect(renderer)
    return found[key]


def _detect(renderer: ChatRenderer) -> tuple[str, str]:
    names = registered_tool_parsers()
    turn = _rendered_call_turn(renderer)
    if turn is not None:
        for name in names:
            if _why_unread(name, turn) is None:
                return name, "the chat template renders tool calls in this format"
    vocabulary = set(renderer.special_tokens)
    fitting = [n for n in names if (m := get_tool_parser(n).markers) and all(t in vocabulary for t in m)]
    most = max((len(get_tool_parser(n).markers) for n in fitting), default=0)
    best = [n for n in fitting if len(get_tool_parser(n).markers) == most]
    if len(best) == 1:
        return best[0], f"the tokenizer's special tokens {list(get_tool_parser(best[0]).markers)}"
    name = getattr(tokenizer := renderer.tokenizer, "name_or_path", tokenizer)
    why = (
        "its chat template renders no tool call that a registered parser reads back"
        if turn is not None
        else "its chat template does not render tool calls"
    )
    tokens = (
        f"its special tokens fit {best}" if best else "no parser's special tokens are all in its vocabulary"
    )
    raise ConfigurationError(
        f"tool_parser: auto cannot tell the tool-call format of tokenizer {name!r}: {why}, and {tokens}; "
        f"set tool_parser to one of {names}"
    )


def _why_unread(name: str, turn: tuple[str, bool]) -> str | None:
    """None when parser ``name`` reads the probe call back from ``turn`` (the template's rendering of it and
    whether it starts in reasoning), else what it read instead."""
    text, starts_in_reasoning = turn
    parsed = get_tool_parser(name).parse(text, starts_in_reasoning=starts_in_reasoning, tools=_SCHEMAS)
    read = [(c.name, c.input) for c in parsed.calls if isinstance(c, ToolCall)]
    if read == [("probe_tool", _ARGUMENTS)] and len(parsed.calls) == 1:
        return None
    errors = [c for c in parsed.calls if isinstance(c, ToolCallError)]
    if errors:
        return f"{errors[0].kind}: {errors[0].message}"
    if parsed.reasoning_calls:
        return "it reads the call as drafted inside reasoning"
    return f"it reads {read} instead of {[('probe_tool', _ARGUMENTS)]}" if read else "it finds no tool call"


def _explicit_parser(renderer: ChatRenderer, name: str) -> tuple[str, str | None]:
    """``(evidence, why the parser cannot read the template's tool calls or None)`` for a parser set by name."""
    turn = _rendered_call_turn(renderer)
    if turn is None:
        return "set explicitly; the chat template renders no tool call to check it against", None
    why = _why_unread(name, turn)
    if why is None:
        return "set explicitly; it reads the tool call the chat template renders", None
    problem = f"{name} cannot read the tool call the chat template renders ({why}); rendered: {turn[0]!r}"
    return f"set explicitly, but {problem}", problem


def _rendered_call_turn(renderer: ChatRenderer) -> tuple[str, bool] | None:
    """The text of an assistant turn holding one known call, as the template renders it (None: it cannot)."""
    return render_assistant_turn(
        renderer, _QUESTION, {"role": "assistant", "content": "", "tool_calls": [_CALL]}, [_TOOL]
    )


def render_assistant_turn(
    renderer: ChatRenderer,
    question: str,
    assistant: Mapping[str, Any],
    tools: Sequence[Mapping[str, Any]],
) -> tuple[str, bool] | None:
    """What a model of the template's family writes for ``assistant`` (a template-format message, e.g. with
    ``tool_calls``) after the user's ``question``: the template's rendering of that turn up to its end token,
    and whether the turn starts inside reasoning. None when the template cannot render it."""
    user = {"role": "user", "content": question}
    try:
        rendered = renderer.render([user, assistant], tools=tools, add_generation_prompt=False)
        prompt = renderer.render([user], tools=tools, add_generation_prompt=True)
    except TemplateError:
        return None
    if rendered.startswith(prompt):
        text, starts_in_reasoning = rendered[len(prompt) :], renderer.opens_reasoning(prompt)
    else:  # the template rewrites the turn's opening (GLM-4.7: "<think>" prompt, "</think>" in history)
        text, starts_in_reasoning = rendered[rendered.rfind(question) + len(question) :], False
    ends = [p for p in (text.find(t) for t in (*renderer.stop_tokens, *renderer.facts.end_tokens)) if p >= 0]
    return (text[: min(ends)] if ends else text), starts_in_reasoning


@dataclass(frozen=True)
class TemplateReport:
    """What ``slime-strands check-template`` prints for one tokenizer and thinking mode."""

    tokenizer: str
    enable_thinking: bool | None
    tito_safe: bool
    reason: str | None = None
    """Why token-in/token-out is not safe (the template error), when it is not."""
    parser: str | None = None
    family: str | None = None
    parser_evidence: str | None = None
    turn_end: str | None = None
    stop_tokens: Sequence[str] = field(default_factory=tuple)
    generation_prompt: str | None = None
    arguments_as: str | None = None
    tool_role: str | None = None
    parallel_calls: bool | None = None
    parser_problem: str | None = None
    """Why the parser set by name cannot read what the template renders (None: it can, or it was detected)."""
    end_tokens: Sequence[str] = field(default_factory=tuple)
    """The model's end-of-sequence tokens that also end a turn (``render.end_of_sequence_ids``)."""

    @property
    def usable(self) -> bool:
        """Token-in/token-out is safe AND a tool parser is known that reads the template's tool calls."""
        return self.tito_safe and self.parser is not None and self.parser_problem is None

    def lines(self) -> list[str]:
        head = f"enable_thinking={self.enable_thinking}"
        if self.turn_end is None:
            return [f"{head}: NOT usable token-in/token-out: {self.reason}"]
        out = [f"{head}: {'ok' if self.usable else 'NOT usable'}"]
        out.append(f"  family: {self.family or 'unknown'}")
        out.append(f"  tool parser: {self.parser or 'none'} ({self.parser_evidence})")
        stops = ", ".join(repr(t) for t in self.stop_tokens)
        out.append(f"  end of turn: {self.turn_end} ({stops})")
        if self.end_tokens:
            out.append(f"  end of sequence: {', '.join(repr(t) for t in self.end_tokens)} (also end a turn)")
        out.append(f"  generation prompt: {self.generation_prompt!r}")
        out.append(
            f"  tool results as role {self.tool_role!r}; tool-call arguments as "
            f"{'a mapping' if self.arguments_as == 'mapping' else 'a JSON string'}; "
            f"parallel calls: {'yes' if self.parallel_calls else 'no'}"
        )
        if self.tito_safe:
            out.append("  token-in/token-out: safe (incremental rendering reproduces the full rendering)")
        else:
            out.append(f"  token-in/token-out: NOT safe: {self.reason}")
        return out


def check_template(tokenizer: Any, enable_thinking: bool | None, tool_parser: str = AUTO) -> TemplateReport:
    """Detect and probe everything token-in/token-out needs from ``tokenizer``; never raises on a bad template."""
    name = str(getattr(tokenizer, "name_or_path", tokenizer))
    try:
        renderer = ChatRenderer(tokenizer, enable_thinking=enable_thinking, probe=False)
    except TemplateError as exc:
        return TemplateReport(name, enable_thinking, tito_safe=False, reason=str(exc))
    facts = renderer.facts
    reason = None
    try:
        parallel: bool | None = renderer.probe()
    except TemplateError as exc:
        parallel, reason = None, str(exc)
    problem = None
    try:
        if tool_parser == AUTO:
            parser, evidence = detect_tool_parser(renderer)
        else:
            parser = get_tool_parser(tool_parser).name
            evidence, problem = _explicit_parser(renderer, parser)
        family: str | None = get_tool_parser(parser).family
    except ConfigurationError as exc:
        parser, evidence, family = None, str(exc), None
    return TemplateReport(
        tokenizer=name,
        enable_thinking=enable_thinking,
        tito_safe=reason is None,
        reason=reason,
        parser=parser,
        family=family,
        parser_evidence=evidence,
        turn_end=facts.turn_end,
        stop_tokens=facts.stop_tokens,
        generation_prompt=facts.generation_prompt,
        arguments_as=facts.arguments_as,
        tool_role=facts.tool_role,
        parallel_calls=parallel,
        parser_problem=problem,
        end_tokens=facts.end_tokens,
    )
