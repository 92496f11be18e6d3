"""Which tool parser reads the calls a chat template renders: ``tool_parser: auto``, the probe.

:func:`detect_tool_parser` renders a known call (the probe tool) with the incremental renderer and picks the
registered parser that reads it back, else the one whose special tokens the tokenizer has, else a
ConfigurationError naming the choices; the choice is kept per tokenizer (``_per_tokenizer.py``).

The top of the template layer: it renders through :class:`~slime_strands.template.render.ChatRenderer`, which
finds the template's facts (``facts.py``: turn ends, tool role, end tokens) and checks incremental rendering
(:func:`~slime_strands.template.render.check_incremental`) below it. Those names are importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigurationError
from ..tool_parsers import AUTO, MalformedCall, ToolCall, ToolParser, get_tool_parser, registered_tool_parsers
from ._per_tokenizer import PerTokenizer
from .chat_template import TemplateError
from .facts import (
    BASE_ASSISTANT,
    PROBE_TOOL,
    TemplateFacts,
    base_conversation,
    detect_facts,
    end_of_sequence_ids,
    json_arguments,
    probe_call,
)
from .render import ChatRenderer, check_incremental

__all__ = [
    "BASE_ASSISTANT",
    "PROBE_TOOL",
    "TemplateError",
    "TemplateFacts",
    "base_conversation",
    "check_incremental",
    "detect_facts",
    "detect_tool_parser",
    "end_of_sequence_ids",
    "json_arguments",
    "render_assistant_turn",
    "rendered_call_turn",
    "select_tool_parser",
    "why_unread",
]

_QUESTION = "Which format 6d0b?"
_PROBE_ARGUMENTS = probe_call(0)["function"]["arguments"]
_PROBE_SCHEMAS = {"probe_tool": PROBE_TOOL["function"]["parameters"]}


# -- the tool parser -------------------------------------------------------------------------------------

_PARSERS: PerTokenizer[tuple[str, str]] = PerTokenizer()
"""What :func:`detect_tool_parser` found: the detection renders the template several times and every
episode's ``SGLangModel`` asks for it."""


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
    key = (tokenizer.chat_template, renderer.enable_thinking, tuple(registered_tool_parsers()))
    return _PARSERS.get(tokenizer, key, lambda: _detect_parser(renderer))


def _detect_parser(renderer: ChatRenderer) -> tuple[str, str]:
    names = registered_tool_parsers()
    turn = rendered_call_turn(renderer)
    if turn is not None:
        for name in names:
            if why_unread(name, turn) is None:
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


def why_unread(name: str, turn: tuple[str, bool]) -> str | None:
    """None when parser ``name`` reads the probe call back from ``turn`` (the template's rendering of it and
    whether it starts in reasoning), else what it read instead."""
    text, starts_in_reasoning = turn
    parsed = get_tool_parser(name).parse(text, starts_in_reasoning=starts_in_reasoning, tools=_PROBE_SCHEMAS)
    read = [(c.name, c.input) for c in parsed.calls if isinstance(c, ToolCall)]
    if read == [("probe_tool", _PROBE_ARGUMENTS)] and len(parsed.calls) == 1:
        return None
    errors = [c for c in parsed.calls if isinstance(c, MalformedCall)]
    if errors:
        return f"{errors[0].kind}: {errors[0].message}"
    if parsed.reasoning_calls:
        return "it reads the call as drafted inside reasoning"
    return (
        f"it reads {read} instead of {[('probe_tool', _PROBE_ARGUMENTS)]}"
        if read
        else "it finds no tool call"
    )


def rendered_call_turn(renderer: ChatRenderer) -> tuple[str, bool] | None:
    """The text of an assistant turn holding one known call, as the template renders it (None: it cannot)."""
    return render_assistant_turn(
        renderer,
        _QUESTION,
        {"role": "assistant", "content": "", "tool_calls": [probe_call(0)]},
        [PROBE_TOOL],
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
