"""Which tool parser reads the calls a chat template renders: ``tool_parser: auto``, the probe.

:func:`detect_tool_parser` renders a known call (the probe tool) with the incremental renderer and picks the
registered parser that reads it back, else (a template that renders no call) the one whose special tokens the
tokenizer has, else a ConfigurationError naming the choices; a template that renders a call no parser reads is
refused. A parser set by name must read that call too (:func:`select_tool_parser`). Both are kept per tokenizer
(``_per_tokenizer.py``).

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
from .chat_template import TemplateError, template_key
from .facts import (
    BASE_ASSISTANT,
    PROBE_TOOL,
    TemplateFacts,
    base_conversation,
    detect_facts,
    end_of_sequence_ids,
    json_arguments,
    probe_call,
    written_call,
)
from .render import ChatRenderer, check_incremental, render_after_base

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
    "render_after_base",
    "render_assistant_turn",
    "rendered_call_turn",
    "select_tool_parser",
    "template_key",
    "tool_problems",
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
    """The parser for ``choice``: ``auto`` (detected), a registered name or an instance, which must read back
    the call the chat template renders (ConfigurationError otherwise: every call would fail to parse)."""
    if choice is None or choice == AUTO:
        return get_tool_parser(detect_tool_parser(renderer)[0])
    parser = choice if isinstance(choice, ToolParser) else get_tool_parser(choice)
    turn = _CALL_TURNS.get(
        renderer.tokenizer,
        (template_key(renderer.tokenizer), repr(sorted(renderer.template_kwargs.items()))),
        lambda: rendered_call_turn(renderer),
    )
    why = None if turn is None else why_unread(parser, turn)
    if why is not None:
        raise ConfigurationError(
            f"tool_parser {parser.name!r} cannot read the tool call the chat template renders ({why}); rendered: "
            f"{turn[0] if turn else ''!r}; set tool_parser to {AUTO!r} or to the parser of this format"
        )
    return parser


_CALL_TURNS: PerTokenizer[tuple[str, bool] | None] = PerTokenizer()
"""What :func:`rendered_call_turn` found, for checking a parser set by name (every episode's model does)."""


def detect_tool_parser(renderer: ChatRenderer) -> tuple[str, str]:
    """``(parser name, how it was decided)`` for the renderer's tokenizer; ConfigurationError if it cannot tell."""
    tokenizer = renderer.tokenizer
    key = (template_key(tokenizer), renderer.enable_thinking, tuple(registered_tool_parsers()))
    return _PARSERS.get(tokenizer, key, lambda: _detect_parser(renderer))


def _detect_parser(renderer: ChatRenderer) -> tuple[str, str]:
    """The parser that reads back the call the template renders. Only a template that renders no call at all
    falls back on special tokens: one that renders a call no parser reads is never given a parser."""
    names = registered_tool_parsers()
    name_of = getattr(tokenizer := renderer.tokenizer, "name_or_path", tokenizer)
    turn = rendered_call_turn(renderer)
    if turn is not None:
        for name in names:
            if why_unread(name, turn) is None:
                return name, "the chat template renders tool calls in this format"
        unread = "; ".join(f"{name}: {why_unread(name, turn)}" for name in names)
        raise ConfigurationError(
            f"tool_parser: auto found no parser for tokenizer {name_of!r}: its chat template renders a tool call "
            f"as {turn[0]!r}, which no registered parser reads back ({unread}); register a parser for this "
            "format (slime_strands.tool_parsers.register_tool_parser)"
        )
    vocabulary = set(renderer.special_tokens)
    fitting = [n for n in names if (m := get_tool_parser(n).markers) and all(t in vocabulary for t in m)]
    most = max((len(get_tool_parser(n).markers) for n in fitting), default=0)
    best = [n for n in fitting if len(get_tool_parser(n).markers) == most]
    if len(best) == 1:
        return best[0], (
            "the chat template renders no tool call to check it against; the tokenizer's special tokens "
            f"{list(get_tool_parser(best[0]).markers)}"
        )
    tokens = (
        f"its special tokens fit {best}" if best else "no parser's special tokens are all in its vocabulary"
    )
    raise ConfigurationError(
        f"tool_parser: auto cannot tell the tool-call format of tokenizer {name_of!r}: its chat template does "
        f"not render tool calls, and {tokens}; set tool_parser to one of {names}"
    )


def why_unread(parser: ToolParser | str, turn: tuple[str, bool]) -> str | None:
    """None when ``parser`` (or the one registered under that name) reads the probe call back from ``turn`` (the
    template's rendering of it and whether it starts in reasoning), else what it read instead."""
    text, starts_in_reasoning = turn
    reader = parser if isinstance(parser, ToolParser) else get_tool_parser(parser)
    parsed = reader.parse(text, starts_in_reasoning=starts_in_reasoning, tools=_PROBE_SCHEMAS)
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
    """The text of an assistant turn holding one known call, as the template renders it, and whether it starts
    in reasoning; None when the template renders no call. The turn has the agent's empty content; a template
    that shows calls only for a null content (the OpenAI wire shape: DeepSeek-R1's) is rendered with that."""
    note = _PROBE_ARGUMENTS["note"]
    for content in ("", None):
        turn = render_assistant_turn(
            renderer,
            _QUESTION,
            {"role": "assistant", "content": content, "tool_calls": [written_call(0)]},
            [PROBE_TOOL],
        )
        if turn is not None and note in turn[0]:
            return turn
    return None


def tool_problems(
    renderer: ChatRenderer, parser: str | None, tools: Sequence[Mapping[str, Any]]
) -> list[str]:
    """What keeps an agent's tools (template-format, e.g. an MCP server's) from working with the template: a
    tool the template's prompt does not show, or a call of it (arguments made from its schema) that ``parser``
    does not read back from the template's rendering of it, each as one line; empty when none."""
    if not tools:
        return []
    question = {"role": "user", "content": _QUESTION}
    try:
        prompt = renderer.render([question], tools=tools, add_generation_prompt=True)
    except TemplateError as exc:
        return [f"the chat template cannot render the tools: {exc}"]
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    problems = [f"{name}: not shown by the chat template's prompt" for name in schemas if name not in prompt]
    if parser is None:
        return problems
    for n, (name, schema) in enumerate(schemas.items()):
        arguments = _example_arguments(schema)
        call = {
            "id": f"call_{n:024x}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        turn = None
        for content in ("", None):
            turn = render_assistant_turn(
                renderer, _QUESTION, {"role": "assistant", "content": content, "tool_calls": [call]}, tools
            )
            if turn is not None and name in turn[0]:
                break
        if turn is None or name not in turn[0]:
            problems.append(f"{name}: the chat template renders no call of it")
            continue
        parsed = get_tool_parser(parser).parse(turn[0], starts_in_reasoning=turn[1], tools=schemas)
        read = [(c.name, c.input) for c in parsed.calls if isinstance(c, ToolCall)]
        if read != [(name, arguments)]:
            errors = [f"{c.kind}: {c.message}" for c in parsed.calls if isinstance(c, MalformedCall)]
            got = errors[0] if errors else f"it reads {read}"
            problems.append(
                f"{name}: {parser} does not read back the call {arguments} the chat template renders as "
                f"{turn[0]!r} ({got})"
            )
    return problems


def _example_arguments(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments of a call that fit ``schema`` (a JSON schema of an object): a value for each required property."""
    properties = schema.get("properties") or {}
    return {key: _example_value(properties.get(key) or {}) for key in schema.get("required") or []}


def _example_value(schema: Mapping[str, Any]) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind is None:
        options = schema.get("anyOf") or schema.get("oneOf") or []
        return _example_value(options[0]) if options else "probe"
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "array":
        return [_example_value(schema.get("items") or {})]
    examples = {"integer": 2, "number": 1.5, "boolean": True, "object": {}, "null": None}
    return examples.get(kind, "probe")


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
        text, starts_in_reasoning = rendered[_where_apart(renderer, rendered, prompt) :], False
    ends = [p for p in (text.find(t) for t in (*renderer.stop_tokens, *renderer.facts.end_tokens)) if p >= 0]
    return (text[: min(ends)] if ends else text), starts_in_reasoning


def _where_apart(renderer: ChatRenderer, rendered: str, prompt: str) -> int:
    """Where ``rendered`` stops following ``prompt``, moved back to the start of a special token it cuts."""
    at = next((n for n, (a, b) in enumerate(zip(rendered, prompt, strict=False)) if a != b), len(prompt))
    for token in renderer.special_tokens:
        start = rendered.find(token, max(0, at - len(token) + 1))
        if 0 <= start < at < start + len(token):
            return start
    return at
