"""What a chat template does, found by rendering it (never by model name): the probe.

* :func:`detect_facts`: how the template ends an assistant turn (a CLOSING token after every turn, or the NEXT
  message's role tag, as GLM), its generation prompt, the role it renders tool results for, whether tool-call
  ``arguments`` must be a JSON string, and the model's end-of-sequence tokens (:func:`end_of_sequence_ids`);
* :func:`check_incremental`: that rendering only the new messages reproduces the full rendering, token for token,
  for a conversation with parallel tool calls, their results, a second round of calls right after them and a
  follow-up user turn, and that nothing already rendered is rendered differently once later messages follow;
* :func:`detect_tool_parser`: which registered tool parser reads back a known call as the template renders it
  (``tool_parser: auto``), else (a template that renders no call) the one whose special tokens the tokenizer
  has, else a ConfigurationError naming the choices. A template that renders a call no parser reads is refused.

Every check renders the way the agent does: with tools (the probe tool, :data:`PROBE_TOOL`), call ids of the
agent's shape, and every tool result after an assistant turn that called it (templates such as MiniMax-M2's and
gpt-oss's raise on a result no call precedes). A tokenizer whose ``chat_template`` is a dict of named templates
is rendered by transformers' rule: ``tool_use`` when tools are given (the agent's case), else ``default``.
:class:`~slime_strands.template.render.ChatRenderer` asks for the facts once per tokenizer, template and
variables; the detected parser is kept per tokenizer the same way (``_per_tokenizer.py``).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigurationError
from ..tool_parsers import AUTO, MalformedCall, ToolCall, ToolParser, get_tool_parser, registered_tool_parsers
from ._per_tokenizer import PerTokenizer

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
    "render_after_base",
    "render_assistant_turn",
    "rendered_call_turn",
    "select_tool_parser",
    "template_key",
    "why_unread",
]

logger = logging.getLogger(__name__)

_BASE_USER = "Base question for incremental rendering."
BASE_ASSISTANT = "Base answer 7f3a9c for incremental rendering."
"""The content of the base conversation's assistant turn: a continuation is what the template renders after it."""
_BASE_TOOL = "base_tool_5b2e"
"""The name of the base turn's calls (a template that shows it with the results cannot be rendered incrementally)."""
_BASE_NOTE = "base call 5b2e"
_TOOL_ROLES = ("tool", "ipython", "observation")
_PROBE_SYSTEM = "You are a probe."
_QUESTION = "Which format 6d0b?"


class TemplateError(ConfigurationError):
    """The tokenizer's chat template cannot be rendered incrementally (or at all) as required."""


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


def template_key(tokenizer: Any) -> Hashable:
    """The tokenizer's chat template as a cache key: the text, or the items of a dict of named templates."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        return tuple(sorted((str(name), str(text)) for name, text in template.items()))
    return template


# -- the base conversation: what new messages are rendered after ------------------------------------------


def base_conversation(
    system: str | None, results: Sequence[Mapping[str, Any]] = (), *, as_json: bool = False
) -> list[dict[str, Any]]:
    """A user question and an assistant answer (after ``system`` when given): the fixed conversation new
    messages are rendered after, so that only what follows its assistant turn is new. With tool ``results`` to
    follow, the answer calls one tool per result (the ids the results name; ``as_json``: arguments as a JSON
    string), as in any real conversation."""
    answer: dict[str, Any] = {"role": "assistant", "content": BASE_ASSISTANT}
    if results:
        calls = [_base_call(result, i) for i, result in enumerate(results)]
        answer["tool_calls"] = [json_arguments(c) for c in calls] if as_json else calls
    base: list[dict[str, Any]] = [{"role": "user", "content": _BASE_USER}, answer]
    return [{"role": "system", "content": system}, *base] if system else base


def _base_call(result: Mapping[str, Any], index: int) -> dict[str, Any]:
    call_id = result.get("tool_call_id")
    name = result.get("name")
    return {
        "id": call_id if isinstance(call_id, str) and call_id else f"call_base{index}",
        "type": "function",
        "function": {
            "name": name if isinstance(name, str) and name else _BASE_TOOL,
            "arguments": {"note": _BASE_NOTE},
        },
    }


def _leading_results(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The tool results ``messages`` start with (the ones an assistant turn's calls are answered by)."""
    results = []
    for message in messages:
        if message.get("role") not in _TOOL_ROLES:
            break
        results.append(message)
    return results


def render_after_base(
    renderer: ChatRenderer,
    new_messages: Sequence[Mapping[str, Any]],
    system: str | None,
    tools: Sequence[Mapping[str, Any]] | None,
) -> tuple[str, list[str]]:
    """The template's rendering of ``new_messages`` after the base conversation (generation prompt included),
    and the markers of the base assistant turn (what a continuation starts after).

    Tool results follow a base turn that calls them. A template that renders one call per turn (Llama 3.2's)
    refuses a turn with several: it gets them after a turn without calls, as a template that does not tie
    results to calls renders them the same either way."""
    results = _leading_results(new_messages)
    if not results:
        full = renderer.render(
            [*base_conversation(system), *new_messages], tools=tools, add_generation_prompt=True
        )
        return full, [BASE_ASSISTANT]
    try:
        base = base_conversation(system, results)
        full = renderer.render([*base, *new_messages], tools=tools, add_generation_prompt=True)
        return full, [BASE_ASSISTANT, _BASE_NOTE]
    except TemplateError as with_calls:
        try:
            full = renderer.render(
                [*base_conversation(system), *new_messages], tools=tools, add_generation_prompt=True
            )
        except TemplateError:
            raise with_calls from None
        return full, [BASE_ASSISTANT]


# -- the probe tool and conversation: every check renders these ------------------------------------------


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
    """Call ``n`` of the probe, with an id of the agent's shape (``call_`` and 24 hex digits)."""
    return {
        "id": f"call_{n:024x}",
        "type": "function",
        "function": {"name": "probe_tool", "arguments": {"x": n + 1, "note": f"probe call {n} e2c4"}},
    }


def _written_call(n: int) -> dict[str, Any]:
    """Call ``n`` as a model writes it: with its own id where the format has one (Kimi-K2's ``functions.NAME:IDX``,
    which the template shows back), for the turn a parser must read."""
    return {**_probe_call(n), "id": f"functions.probe_tool:{n}"}


def _result(content: str, call: int) -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": _probe_call(call)["id"]}


def _probe_conversation(calls: int) -> list[dict[str, Any]]:
    """A warm-up answer, ``calls`` parallel calls and two results, a second call right after them (an agent's
    next step), an interim answer, a follow-up question and a final answer."""
    second = calls  # the index of the second round's call
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
        _result("probe result one", 0),
        _result("probe result two", calls - 1),
        {"role": "assistant", "content": "Calling again A2.", "tool_calls": [_probe_call(second)]},
        _result("probe result three", second),
        {"role": "assistant", "content": "Interim probe answer A3."},
        {"role": "user", "content": "Second probe question?"},
        {"role": "assistant", "content": "Final probe answer A4."},
    ]


def json_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call whose ``arguments`` is a JSON string (the OpenAI wire shape DeepSeek's template expects)."""
    function = dict(call.get("function") or {})
    if not isinstance(function.get("arguments"), str):
        function["arguments"] = json.dumps(function.get("arguments") or {}, ensure_ascii=False)
    return {**call, "function": function}


_PROBE_ARGUMENTS = _probe_call(0)["function"]["arguments"]
_PROBE_SCHEMAS = {"probe_tool": PROBE_TOOL["function"]["parameters"]}


# -- incremental rendering ---------------------------------------------------------------------------------


def check_incremental(renderer: ChatRenderer) -> bool:
    """Check that incremental rendering reproduces the template's full rendering, else raise TemplateError.

    Walks the probe conversation (:func:`_probe_conversation`): every non-assistant block rendered with
    :meth:`render_continuation` must equal what the full rendering puts after the preceding assistant turn, the
    messages must be shown, the token ids of the pieces must concatenate without boundary drift, and what was
    rendered must stay as it was once later messages follow (the first prompt is how the whole conversation
    starts, each block is what the whole conversation has there, up to its last message's body). Templates may
    rewrite OLDER assistant turns and the markup opening them (Qwen3, GLM and DeepSeek drop earlier reasoning):
    that is allowed, since assistant tokens are never re-rendered. Returns whether the template renders parallel calls (Llama 3.2's refuses them, gpt-oss's shows
    only the first: the probe then uses one call with two results).
    """
    tools = [PROBE_TOOL]
    conversation, parallel = _conversation_rendered(renderer, tools)
    whole = renderer.render(conversation, tools=tools, add_generation_prompt=False)
    assistant_at = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    first = conversation[: assistant_at[0]]
    start = _through_last_body(renderer.render(first, tools=tools, add_generation_prompt=False), first)
    if not whole.startswith(start):
        raise TemplateError(
            "the chat template renders the start of a conversation differently once later messages follow "
            f"(the first prompt is {_around(start, whole)}): the prompt the model saw would not be the template's"
        )
    for i, block_end in itertools.pairwise(assistant_at):
        _check_block(renderer, conversation, (i, block_end), whole, tools)
    return parallel


def _conversation_rendered(
    renderer: ChatRenderer, tools: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], bool]:
    """The probe conversation with parallel calls when the template renders them all, else with one call."""
    conversation = _probe_conversation(calls=2)
    try:
        rendered = renderer.render(conversation, tools=tools, add_generation_prompt=False)
    except TemplateError:
        rendered = ""
    if all(_probe_call(n)["function"]["arguments"]["note"] in rendered for n in range(2)):
        return conversation, True
    conversation = _probe_conversation(calls=1)
    renderer.render(conversation, tools=tools, add_generation_prompt=False)  # raises the template's reason
    return conversation, False


def _check_block(
    renderer: ChatRenderer,
    conversation: list[dict[str, Any]],
    span: tuple[int, int],
    whole: str,
    tools: list[dict[str, Any]],
) -> None:
    """The checks of :func:`check_incremental` for the messages between the assistant turns at ``span``."""
    i, block_end = span
    message = conversation[i]
    markers = [message["content"]] + [
        c["function"]["arguments"]["note"] for c in message.get("tool_calls", [])
    ]
    new = conversation[i + 1 : block_end]
    full = renderer.render(conversation[:block_end], tools=tools, add_generation_prompt=True)
    expected = renderer.continuation_after(full, markers)
    got = renderer.render_continuation(new, system=_PROBE_SYSTEM, tools=tools)
    if got != expected and not _closed_in_place(renderer, expected, got):
        raise TemplateError(_mismatch(expected, got))
    for shown in new:
        if shown["content"] not in got:
            raise TemplateError(f"the chat template does not show the {shown['role']} message {got!r}")
    settled = _through_last_body(
        renderer.continuation_after(
            renderer.render(conversation[:block_end], tools=tools, add_generation_prompt=False), markers
        ),
        new,
    )
    later = renderer.continuation_after(whole, markers)
    if not later.startswith(settled):
        roles = " and ".join(sorted({m["role"] for m in new}))
        raise TemplateError(
            f"the chat template renders {roles} messages differently once a later message follows them "
            f"({_around(settled, later)}): the prompt the model saw would not be the template's"
        )
    cut = len(full) - len(expected)
    if renderer.encode(full[:cut]) + renderer.encode(full[cut:]) != renderer.encode(full):
        raise TemplateError(
            "tokenizing the template's pieces separately differs from tokenizing them together"
        )


def _through_last_body(text: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """``text`` up to the end of the last message's body: what follows it opens the next assistant turn, which
    a template may write differently once the turn is history (GLM-4.7's and DeepSeek-V3.2's ``<think>`` becomes
    ``</think>`` when the reasoning is dropped; Hermes-3's newline after a tool result)."""
    body = str(messages[-1].get("content") or "")
    at = text.rfind(body) if body else -1
    return text[: at + len(body)] if at >= 0 else text


def _mismatch(expected: str, got: str) -> str:
    if _BASE_TOOL in got and _BASE_TOOL not in expected:
        return (
            "the chat template shows the name of the called function with each tool result (rendered "
            f"{got!r}, the conversation has {expected!r}): incremental rendering renders new messages after a "
            "fixed conversation and cannot know which function they answer"
        )
    return (
        "incremental rendering does not reproduce the chat template's full rendering: "
        f"expected {expected!r}, rendered {got!r}"
    )


def _around(first: str, second: str) -> str:
    """Where ``second`` stops following ``first``: the text of both from shortly before that point."""
    at = next(
        (n for n, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
        min(len(first), len(second)),
    )
    return f"{first[max(0, at - 40) : at + 40]!r} where the later rendering has {second[max(0, at - 40) : at + 40]!r}"


def _closed_in_place(renderer: ChatRenderer, expected: str, got: str) -> bool:
    """``expected`` is ``got`` with its closing token written as one that closes in its place (Llama 3.1's
    template renders ``<|eom_id|>`` after a tool call in ipython mode; a continuation starts at ``<|eot_id|>``
    and drops it after a turn that ended on ``<|eom_id|>``)."""
    closing = renderer.end_of_turn
    return got.startswith(closing) and any(
        expected.startswith(t) and expected[len(t) :] == got[len(closing) :]
        for t in renderer.closing_in_place_texts
    )


# -- the template's facts --------------------------------------------------------------------------------


def detect_facts(renderer: ChatRenderer) -> TemplateFacts:
    """Stop tokens, generation prompt, tool role and arguments type, found by rendering small conversations
    (with the probe tool, as the agent renders with its tools)."""
    tools = [PROBE_TOOL]
    arguments = _arguments_type(renderer)
    tool_role = _tool_role(renderer, arguments == "json")
    stop_tokens = tuple(
        dict.fromkeys(
            (
                _token_after_base_turn(renderer, [{"role": "user", "content": "Marker follow-up?"}], False),
                _token_after_base_turn(renderer, [{"role": tool_role, "content": "42"}], arguments == "json"),
            )
        )
    )
    user = [{"role": "user", "content": _BASE_USER}]
    bare, prompted = renderer.apply(user, tools, False), renderer.apply(user, tools, True)
    turn_end: TurnEnd = "closing token" if len(stop_tokens) == 1 else "next role tag"
    end_tokens = _end_tokens(renderer, stop_tokens)
    closing = stop_tokens[0] if turn_end == "closing token" else None
    return TemplateFacts(
        stop_tokens=stop_tokens,
        stop_token_ids=tuple(_single_token_id(renderer, t) for t in stop_tokens),
        turn_end=turn_end,
        generation_prompt=prompted[len(bare) :] if prompted.startswith(bare) else "",
        arguments_as=arguments,
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


def _tool_role(renderer: ChatRenderer, as_json: bool) -> str:
    """The first of ``tool`` / ``ipython`` / ``observation`` whose messages the template shows (after a turn
    that called the tool, or without one where the template raises on that)."""
    errors = []
    result = "Tool result 4b7e for detection."
    for role in _TOOL_ROLES:
        try:
            rendered, _ = _after_base(renderer, [{"role": role, "content": result}], as_json)
        except TemplateError as exc:
            errors.append(exc)
            continue
        if result in rendered:
            return role
    if errors:  # raised for a role and showed none of the others
        raise TemplateError(
            f"the chat template cannot render a tool result after the call it answers: {errors[0]}"
        )
    raise TemplateError(f"the chat template does not render tool results (tried roles {list(_TOOL_ROLES)})")


def _after_base(
    renderer: ChatRenderer, follow: list[dict[str, Any]], as_json: bool
) -> tuple[str, list[dict[str, Any]] | None]:
    """``follow`` rendered after the base conversation (the facts are not known yet: messages as they are),
    with the base turn that the template accepts: without calls, else (results a call must precede) calling
    them. Returns the rendering and the base turn's calls (None without)."""
    tools = [PROBE_TOOL]
    try:
        return renderer.apply([*base_conversation(None), *follow], tools, True), None
    except TemplateError:
        results = _leading_results(follow)
        if not results:
            raise
        base = base_conversation(None, results, as_json=as_json)
        return renderer.apply([*base, *follow], tools, True), base


def _token_after_base_turn(renderer: ChatRenderer, follow: list[dict[str, Any]], as_json: bool) -> str:
    """The special token the template writes right after an assistant turn when ``follow`` comes next: right
    after its content, or for a turn that must call the tools (see :func:`_after_base`) the last token of the
    turn as the template renders it last (``[e~[`` of MiniMax-M2, ``<|call|>`` of gpt-oss), else the token
    that follows it."""
    rendered, base = _after_base(renderer, follow, as_json)
    if base is None:
        at = rendered.rfind(BASE_ASSISTANT)
        if at < 0:
            raise TemplateError("the chat template dropped the assistant's content")
        tail = rendered[at + len(BASE_ASSISTANT) :]
    else:
        alone = renderer.apply(base, [PROBE_TOOL], False).rstrip()
        last = next((t for t in renderer.special_tokens if alone.endswith(t)), None)
        if last is not None and rendered.startswith(alone):
            return last
        tail = rendered[len(alone) :] if rendered.startswith(alone) else ""
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
            raise TemplateError(
                f"the chat template refuses an assistant turn that calls a tool (call id {call['id']!r}, the "
                f"shape of the agent's ids; arguments as a mapping or a JSON string): {mapping_error}"
            ) from None
        return "json"


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
            {"role": "assistant", "content": content, "tool_calls": [_written_call(0)]},
            [PROBE_TOOL],
        )
        if turn is not None and note in turn[0]:
            return turn
    return None


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
