"""What a chat template does, found by rendering it (never by model name): the probe.

* :func:`detect_facts`: how the template ends an assistant turn (a CLOSING token after every turn, or the NEXT
  message's role tag, as GLM), its generation prompt, the role it renders tool results for, whether tool-call
  ``arguments`` must be a JSON string, and the model's end-of-sequence tokens (:func:`end_of_sequence_ids`);
* :func:`check_incremental`: that rendering only the new messages reproduces the full rendering, token for token,
  for a conversation with parallel tool calls, their results and a follow-up user turn;
* :func:`detect_tool_parser`: which registered tool parser reads back a known call as the template renders it
  (``tool_parser: auto``), else the one whose special tokens the tokenizer has, else a ConfigurationError naming
  the choices.

Every check renders the same probe tool (:data:`PROBE_TOOL`) and base conversation (:func:`base_conversation`,
which incremental rendering also renders after). :class:`~slime_strands.template.render.ChatRenderer` asks for
the facts once per tokenizer, template and variables; the detected parser is kept per tokenizer the same way
(``_per_tokenizer.py``).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigurationError
from ..tool_parsers import AUTO, MalformedCall, ToolCall, ToolParser, get_tool_parser, registered_tool_parsers
from ._per_tokenizer import PerTokenizer
from .chat_template import TemplateError

if TYPE_CHECKING:
    from .render import ChatRenderer

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

logger = logging.getLogger(__name__)

_BASE_USER = "Base question for incremental rendering."
BASE_ASSISTANT = "Base answer 7f3a9c for incremental rendering."
"""The content of the base conversation's assistant turn: a continuation is what the template renders after it."""
_TOOL_ROLES = ("tool", "ipython", "observation")
_PROBE_SYSTEM = "You are a probe."
_QUESTION = "Which format 6d0b?"


TurnEnd = Literal["closing token", "next role tag"]


@dataclass(frozen=True)
class TemplateFacts:
    """What rendering found out about a chat template (cached per tokenizer, template and thinking mode)."""

    stop_tokens: tuple[str, ...]
    """Tokens that end an assistant turn (the closing token, or the role tags that may follow the turn)."""
    stop_token_ids: tuple[int, ...]
    turn_end: TurnEnd
    generation_prompt: str
    """What ``add_generation_prompt`` appends after a user turn ("" if it could not be isolated)."""
    arguments_as: Literal["mapping", "json"]
    """How the template wants a tool call's ``arguments``: a mapping, or a JSON string (DeepSeek-V3.1)."""
    tool_role: str
    """The role the template renders tool results for (``tool``, ``ipython`` or ``observation``)."""
    parallel_calls: bool | None = None
    """Whether the template renders several calls in one turn (None: not probed). Llama 3.2's refuses."""
    end_tokens: tuple[str, ...] = ()
    """The model's end-of-sequence tokens that are not stop tokens (:func:`end_of_sequence_ids`): a turn may end
    on one."""
    end_token_ids: tuple[int, ...] = ()
    closing_in_place: tuple[int, ...] = ()
    """End tokens that close a turn in place of the template's closing token (Llama 3's ``<|eom_id|>``)."""


def base_conversation(system: str | None) -> list[dict[str, Any]]:
    """A user question and an assistant answer (after ``system`` when given): the fixed conversation new
    messages are rendered after, so that only what follows its assistant turn is new."""
    base: list[dict[str, Any]] = [
        {"role": "user", "content": _BASE_USER},
        {"role": "assistant", "content": BASE_ASSISTANT},
    ]
    return [{"role": "system", "content": system}, *base] if system else base


# -- the probe tool: every check renders this one --------------------------------------------------------


PROBE_TOOL: dict[str, Any] = {
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


def _probe_call(n: int) -> dict[str, Any]:
    return {
        "id": f"functions.probe_tool:{n}",
        "type": "function",
        "function": {"name": "probe_tool", "arguments": {"x": n + 1, "note": f"probe call {n} e2c4"}},
    }


def _probe_conversation(calls: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": _PROBE_SYSTEM},
        {"role": "user", "content": "Warm-up probe question?"},  # shifts every later block's position
        {"role": "assistant", "content": "Warm-up probe answer A0."},
        {"role": "user", "content": "First probe question?"},
        {
            "role": "assistant",
            "content": "Calling probe A1.",
            "tool_calls": [_probe_call(n) for n in range(calls)],
        },
        {"role": "tool", "content": "probe result one", "tool_call_id": "functions.probe_tool:0"},
        {"role": "tool", "content": "probe result two", "tool_call_id": f"functions.probe_tool:{calls - 1}"},
        {"role": "assistant", "content": "Interim probe answer A2."},
        {"role": "user", "content": "Second probe question?"},
        {"role": "assistant", "content": "Final probe answer A3."},
    ]


def json_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call whose ``arguments`` is a JSON string (the OpenAI wire shape DeepSeek's template expects)."""
    function = dict(call.get("function") or {})
    if not isinstance(function.get("arguments"), str):
        function["arguments"] = json.dumps(function.get("arguments") or {}, ensure_ascii=False)
    return {**call, "function": function}


_PROBE_ARGUMENTS = _probe_call(0)["function"]["arguments"]
_PROBE_SCHEMAS = {"probe_tool": PROBE_TOOL["function"]["parameters"]}


# -- the template's facts --------------------------------------------------------------------------------


def check_incremental(renderer: ChatRenderer) -> bool:
    """Check that incremental rendering reproduces the template's full rendering, else raise TemplateError.

    Walks a conversation (warm-up turn, parallel tool calls, their results, an interim answer, a follow-up
    user turn): every non-assistant block rendered with :meth:`render_continuation` must equal what the
    full rendering puts after the preceding assistant turn, the tool results must be shown, and the token
    ids of the pieces must concatenate without boundary drift. Templates may rewrite OLDER assistant turns
    (Qwen3, GLM and DeepSeek drop earlier reasoning): that is allowed, since assistant tokens are never
    re-rendered. Returns whether the template renders parallel calls (Llama 3.2's refuses them: the probe
    then uses one call with two results).
    """
    tools = [PROBE_TOOL]
    parallel = True
    conversation = _probe_conversation(calls=2)
    try:
        renderer.render(conversation, tools=tools, add_generation_prompt=False)
    except TemplateError:
        parallel = False
        conversation = _probe_conversation(calls=1)
    assistant_at = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    for i, block_end in itertools.pairwise(assistant_at):
        message = conversation[i]
        markers = [message["content"]] + [
            c["function"]["arguments"]["note"] for c in message.get("tool_calls", [])
        ]
        full = renderer.render(conversation[:block_end], tools=tools, add_generation_prompt=True)
        expected = renderer.continuation_after(full, markers)
        got = renderer.render_continuation(conversation[i + 1 : block_end], system=_PROBE_SYSTEM, tools=tools)
        if got != expected and not _closed_in_place(renderer, expected, got):
            raise TemplateError(
                "incremental rendering does not reproduce the chat template's full rendering: "
                f"expected {expected!r}, rendered {got!r}"
            )
        for shown in conversation[i + 1 : block_end]:
            if shown["content"] not in got:
                raise TemplateError(f"the chat template does not show the {shown['role']} message {got!r}")
        cut = len(full) - len(expected)
        if renderer.encode(full[:cut]) + renderer.encode(full[cut:]) != renderer.encode(full):
            raise TemplateError(
                "tokenizing the template's pieces separately differs from tokenizing them together"
            )
    return parallel


def detect_facts(renderer: ChatRenderer) -> TemplateFacts:
    """Stop tokens, generation prompt, tool role and arguments type, found by rendering small conversations."""
    tool_role = _tool_role(renderer)
    stop_tokens = tuple(
        dict.fromkeys(
            _token_after_base_turn(renderer, follow)
            for follow in (
                {"role": "user", "content": "Marker follow-up?"},
                {"role": tool_role, "content": "42"},
            )
        )
    )
    user = [{"role": "user", "content": _BASE_USER}]
    bare, prompted = renderer.apply(user, None, False), renderer.apply(user, None, True)
    turn_end: TurnEnd = "closing token" if len(stop_tokens) == 1 else "next role tag"
    end_tokens = _end_tokens(renderer, stop_tokens)
    closing = stop_tokens[0] if turn_end == "closing token" else None
    return TemplateFacts(
        stop_tokens=stop_tokens,
        stop_token_ids=tuple(_single_token_id(renderer, t) for t in stop_tokens),
        turn_end=turn_end,
        generation_prompt=prompted[len(bare) :] if prompted.startswith(bare) else "",
        arguments_as=_arguments_type(renderer),
        tool_role=tool_role,
        end_tokens=tuple(end_tokens),
        end_token_ids=tuple(end_tokens.values()),
        closing_in_place=tuple(
            i for t, i in end_tokens.items() if closing and _CLOSES_IN_PLACE_OF.get(t) == closing
        ),
    )


def _end_tokens(renderer: ChatRenderer, stop_tokens: Sequence[str]) -> dict[str, int]:
    """The model's end-of-sequence tokens that are not stop tokens, by text (ids whose text does not encode
    back to them alone are left out: they could not be found in rendered text)."""
    found: dict[str, int] = {}
    for token_id in end_of_sequence_ids(renderer.tokenizer):
        text = renderer.decode([token_id])
        if text not in stop_tokens and renderer.encode(text) == [token_id]:
            found[text] = token_id
    return found


def _tool_role(renderer: ChatRenderer) -> str:
    """The first of ``tool`` / ``ipython`` / ``observation`` whose messages the template shows."""
    errors = []
    result = "Tool result 4b7e for detection."
    for role in _TOOL_ROLES:
        try:
            rendered = renderer.apply(
                [*base_conversation(None), {"role": role, "content": result}], None, True
            )
        except TemplateError as exc:
            errors.append(exc)
            continue
        if result in rendered:
            return role
    if len(errors) == len(_TOOL_ROLES):
        raise errors[0]
    raise TemplateError(f"the chat template does not render tool results (tried roles {list(_TOOL_ROLES)})")


def _token_after_base_turn(renderer: ChatRenderer, follow: Mapping[str, Any]) -> str:
    """The special token the template writes right after an assistant turn when ``follow`` comes next."""
    rendered = renderer.apply([*base_conversation(None), follow], None, True)
    at = rendered.rfind(BASE_ASSISTANT)
    if at < 0:
        raise TemplateError("the chat template dropped the assistant's content")
    tail = rendered[at + len(BASE_ASSISTANT) :]
    lead = next((t for t in renderer.special_tokens if tail.startswith(t)), None)
    if lead is None:
        raise TemplateError(
            f"cannot find the end-of-turn token after an assistant turn (template renders {tail[:80]!r})"
        )
    return lead


def _arguments_type(renderer: ChatRenderer) -> Literal["mapping", "json"]:
    user: dict[str, Any] = {"role": "user", "content": _BASE_USER}
    call = _probe_call(0)
    try:
        renderer.apply(
            [user, {"role": "assistant", "content": "", "tool_calls": [call]}], [PROBE_TOOL], False
        )
        return "mapping"
    except TemplateError as mapping_error:
        as_json = {"role": "assistant", "content": "", "tool_calls": [json_arguments(call)]}
        try:
            renderer.apply([user, as_json], [PROBE_TOOL], False)
        except TemplateError:
            raise mapping_error from None
        return "json"


def _closed_in_place(renderer: ChatRenderer, expected: str, got: str) -> bool:
    """``expected`` is ``got`` with its closing token written as one that closes in its place (Llama 3.1's
    template renders ``<|eom_id|>`` after a tool call in ipython mode; a continuation starts at ``<|eot_id|>``
    and drops it after a turn that ended on ``<|eom_id|>``)."""
    closing = renderer.end_of_turn
    return got.startswith(closing) and any(
        expected.startswith(t) and expected[len(t) :] == got[len(closing) :]
        for t in renderer.closing_in_place_texts
    )


def _single_token_id(renderer: ChatRenderer, text: str) -> int:
    ids = renderer.encode(text)
    if len(ids) != 1:
        raise TemplateError(f"end-of-turn text {text!r} is not a single token ({ids})")
    return ids[0]


# -- the model's end-of-sequence tokens ----------------------------------------------------------
#
# SGLang ends a generation on the stop_token_ids a request sends AND, whatever the request says, on the model's own
# end-of-sequence ids: the tokenizer's eos_token, the eos_token_id of the checkpoint's config.json and
# generation_config.json (one id or a list), and Llama 3's <|eom_id|> for a tokenizer that has it. So a turn can end
# on a token the chat template never writes (GLM's <|endoftext|>, Llama's <|eom_id|> after a tool call): they are
# added to the template's stop tokens (TemplateFacts.end_tokens), sent as stop ids, and stripped from the turn's text.
# The JSON files are read from the tokenizer's folder (name_or_path), or for a hub id from the local Hugging Face
# cache (never downloaded); a model whose files are elsewhere puts its ids in the sampling params' stop_token_ids.
#
# Closing in place: <|eom_id|> (end of message: the model called a tool and waits for its result) ends a turn where
# the template writes <|eot_id|> (Meta's prompt format; Llama 3.1's template renders it there in ipython mode), so a
# continuation after it does not repeat <|eot_id|>. Any other end token is followed by the template's own closing
# token or role tag.

_ALWAYS_STOP = ("<|eom_id|>",)
"""Tokens SGLang stops on for every tokenizer that has them (its ``additional_stop_token_ids``)."""
_CLOSES_IN_PLACE_OF = {"<|eom_id|>": "<|eot_id|>"}
"""End tokens that close a turn in place of the template's closing token (see the comment above)."""
_CONFIG_FILES = ("config.json", "generation_config.json")


def end_of_sequence_ids(tokenizer: Any) -> tuple[int, ...]:
    """The model's end-of-sequence token ids (within the tokenizer's vocabulary), in a stable order."""
    vocabulary = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    ids = [getattr(tokenizer, "eos_token_id", None)]
    ids += [vocabulary[token] for token in _ALWAYS_STOP if token in vocabulary]
    ids += _configured_eos_ids(str(getattr(tokenizer, "name_or_path", "") or ""))
    size = len(tokenizer)
    return tuple(
        dict.fromkeys(i for i in ids if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size)
    )


def _configured_eos_ids(name: str) -> list[int]:
    """``eos_token_id`` of the checkpoint's config files found next to the tokenizer (see the comment above)."""
    ids: list[int] = []
    for filename in _CONFIG_FILES:
        path = _local_file(name, filename)
        if path is None:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                value = json.load(f).get("eos_token_id")
        except (OSError, ValueError, AttributeError) as exc:
            logger.warning("cannot read eos_token_id from %s: %s", path, exc)
            continue
        values = value if isinstance(value, list) else [value]
        ids += [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return ids


def _local_file(name: str, filename: str) -> str | None:
    """``filename`` of the checkpoint ``name`` on this machine: in its folder, else in the hub cache."""
    if not name:
        return None
    if os.path.isdir(name):
        path = os.path.join(name, filename)
        return path if os.path.isfile(path) else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, filename)
    except Exception:  # not a hub id (a path that does not exist), or no huggingface_hub
        return None
    return cached if isinstance(cached, str) else None


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
        {"role": "assistant", "content": "", "tool_calls": [_probe_call(0)]},
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
