"""What a chat template does, found by rendering it (never by model name): its facts.

:func:`detect_facts` finds how the template ends an assistant turn (a CLOSING token after every turn, or the
NEXT message's role tag, as GLM), its generation prompt, the role it renders tool results for, whether tool-call
``arguments`` must be a JSON string, and the model's end-of-sequence tokens (:func:`end_of_sequence_ids`).

It renders with a :class:`~slime_strands.template.chat_template.ChatTemplate` (the template as it is), below
the incremental renderer that uses the facts. Every check of the template layer renders the same probe tool
(:data:`PROBE_TOOL`) and base conversation (:func:`base_conversation`, which incremental rendering also renders
after): the facts here, the incremental check (``render.py``) and the tool-parser choice (``probe.py``). Every
check renders the way the agent does: with tools, call ids of the agent's shape, and every tool result after an
assistant turn that called it (templates such as MiniMax-M2's and gpt-oss's raise on a result no call precedes).
A tokenizer whose ``chat_template`` is a dict of named templates is rendered by transformers' rule: ``tool_use``
when tools are given (the agent's case), else ``default``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..strict_reader import is_int
from .chat_template import ChatTemplate, TemplateError
from .messages import tool_message

__all__ = [
    "BASE_ASSISTANT",
    "BASE_NOTE",
    "BASE_TOOL",
    "PROBE_REASONING",
    "PROBE_SYSTEM",
    "PROBE_TOOL",
    "TemplateFacts",
    "base_conversation",
    "detect_facts",
    "end_of_sequence_ids",
    "json_arguments",
    "leading_results",
    "probe_call",
    "probe_conversation",
    "turn_variants",
    "written_call",
]

logger = logging.getLogger(__name__)

_BASE_USER = "Base question for incremental rendering."
BASE_ASSISTANT = "Base answer 7f3a9c for incremental rendering."
"""The content of the base conversation's assistant turn: a continuation is what the template renders after it."""
BASE_TOOL = "base_tool_5b2e"
"""The name of the base turn's calls (a template that shows it with the results cannot be rendered incrementally)."""
BASE_NOTE = "base call 5b2e"
"""The note of the base turn's calls: a continuation after a turn that calls starts after it."""
_TOOL_ROLES = ("tool", "ipython", "observation")
PROBE_SYSTEM = "You are a probe."


TurnEnd = Literal["closing token", "next role tag"]


@dataclass(frozen=True)
class TemplateFacts:
    """What rendering found out about a chat template (cached per tokenizer, template and thinking mode)."""

    stop_tokens: tuple[str, ...]
    """Tokens that end an assistant turn (the closing token, or the role tags that may follow the turn)."""
    stop_token_ids: tuple[int, ...]
    turn_end: TurnEnd
    generation_prompt: str
    """What ``add_generation_prompt`` appends after a user turn and a prompt ends with ("" if it could not be
    isolated): the part of the template's own that its rendering of the next assistant turn starts with."""
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
    dropped_prompt: str = ""
    """What the template's generation prompt adds that its rendering of the next assistant turn does not start
    with, left out of every prompt (:func:`_dropped_prompt`); "" for a template whose turns start with it."""
    rewrites: tuple[tuple[str, str], ...] | None = None
    """What the template renders differently once later messages follow: ``(as the model was shown it, as the
    full rendering has it)`` pairs of token runs (None: not probed). The trajectory keeps what the model saw."""


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
            "name": name if isinstance(name, str) and name else BASE_TOOL,
            "arguments": {"note": BASE_NOTE},
        },
    }


def leading_results(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The tool results ``messages`` start with (the ones an assistant turn's calls are answered by)."""
    results = []
    for message in messages:
        if message.get("role") not in _TOOL_ROLES:
            break
        results.append(message)
    return results


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


def probe_call(n: int) -> dict[str, Any]:
    """Call ``n`` of the probe, with an id of the agent's shape (``call_`` and 24 hex digits)."""
    return {
        "id": f"call_{n:024x}",
        "type": "function",
        "function": {"name": "probe_tool", "arguments": {"x": n + 1, "note": f"probe call {n} e2c4"}},
    }


def written_call(n: int) -> dict[str, Any]:
    """Call ``n`` as a model writes it: with its own id where the format has one (Kimi-K2's ``functions.NAME:IDX``,
    which the template shows back), for the turn a parser must read."""
    return {**probe_call(n), "id": f"functions.probe_tool:{n}"}


def _result(content: str, call: int, role: str = "tool") -> dict[str, Any]:
    """The result of probe call ``call``, in the shape of an episode's (:func:`~.messages.tool_message`)."""
    return tool_message(content, probe_call(call)["id"], role)


def probe_conversation(calls: int) -> list[dict[str, Any]]:
    """A warm-up answer, ``calls`` parallel calls and two results, a second call right after them (an agent's
    next step), an interim answer, a follow-up question and a final answer."""
    second = calls  # the index of the second round's call
    return [
        {"role": "system", "content": PROBE_SYSTEM},
        {"role": "user", "content": "Warm-up probe question?"},  # shifts every later block's position
        {"role": "assistant", "content": "Warm-up probe answer A0."},
        {"role": "user", "content": "First probe question?"},
        {
            "role": "assistant",
            "content": "Calling probe A1.",
            "tool_calls": [probe_call(n) for n in range(calls)],
        },
        _result("probe result one", 0),
        _result("probe result two", calls - 1),
        {"role": "assistant", "content": "Calling again A2.", "tool_calls": [probe_call(second)]},
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


# -- the template's facts --------------------------------------------------------------------------------


def detect_facts(template: ChatTemplate) -> TemplateFacts:
    """Stop tokens, generation prompt, tool role and arguments type, found by rendering small conversations
    (with the probe tool, as the agent renders with its tools)."""
    tools = [PROBE_TOOL]
    arguments = _arguments_type(template)
    tool_role = _tool_role(template, arguments == "json")
    stop_tokens = tuple(
        dict.fromkeys(
            (
                _token_after_base_turn(template, [{"role": "user", "content": "Marker follow-up?"}], False),
                _token_after_base_turn(template, [_result("42", 0, tool_role)], arguments == "json"),
            )
        )
    )
    user = [{"role": "user", "content": _BASE_USER}]
    bare, prompted = template.apply(user, tools, False), template.apply(user, tools, True)
    prompt = prompted[len(bare) :] if prompted.startswith(bare) else ""
    dropped = _dropped_prompt(template, bare, prompt)
    turn_end: TurnEnd = "closing token" if len(stop_tokens) == 1 else "next role tag"
    end_tokens = _end_tokens(template, stop_tokens)
    closing = stop_tokens[0] if turn_end == "closing token" else None
    return TemplateFacts(
        stop_tokens=stop_tokens,
        stop_token_ids=tuple(_single_token_id(template, t) for t in stop_tokens),
        turn_end=turn_end,
        generation_prompt=prompt[: len(prompt) - len(dropped)],
        arguments_as=arguments,
        tool_role=tool_role,
        end_tokens=tuple(end_tokens),
        end_token_ids=tuple(end_tokens.values()),
        closing_in_place=tuple(
            i for t, i in end_tokens.items() if closing and _CLOSES_IN_PLACE_OF.get(t) == closing
        ),
        dropped_prompt=dropped,
    )


PROBE_REASONING = "Probe reasoning 3d1f."


def turn_variants(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant turn as it is and with reasoning, in the two places templates take it from
    (``reasoning_content``, or ``<think>...</think>`` before the content): the forms the rendering of a turn the
    model writes can take (a prompt that opens ``<think>`` is followed by reasoning)."""
    content = str(message.get("content") or "")
    return [
        dict(message),
        {**message, "reasoning_content": PROBE_REASONING},
        {**message, "content": f"<think>{PROBE_REASONING}</think>{content}"},
    ]


def _dropped_prompt(template: ChatTemplate, bare: str, prompt: str) -> str:
    """The end of the generation prompt ``prompt`` (appended to ``bare``, a user turn) that the template's own
    rendering of the next assistant turn, with or without reasoning, does not start with: "" when one starts
    with the whole prompt or none starts with ``bare``. DeepSeek-V3.2's llama.cpp port ends a user turn with the
    assistant opening already and adds a stray user tag and a second opening after it, which no rendering of a
    conversation holds: a prompt keeps the opening the rendering with the turn reproduces (the token runs of the
    prompt it starts with), when that ends with the same token as the template's prompt (the model continues
    after the same opening). A prompt whose last token the rendering writes otherwise (DeepSeek-V3.1's
    ``<think>``, ``</think>`` once its reasoning is dropped) is kept whole."""
    if not prompt:
        return ""
    user: dict[str, Any] = {"role": "user", "content": _BASE_USER}
    kept = -1
    for turn in turn_variants({"role": "assistant", "content": BASE_ASSISTANT}):
        try:
            rendered = template.apply([user, turn], [PROBE_TOOL], False)
        except TemplateError:
            continue
        if rendered.startswith(bare + prompt):
            return ""
        if rendered.startswith(bare):
            kept = max(kept, _token_prefix(template, prompt, rendered[len(bare) :]))
    if kept < 0:
        return ""
    last = template.decode(template.encode(prompt)[-1:])
    return prompt[kept:] if (bare + prompt[:kept]).endswith(last) else ""


def _token_prefix(template: ChatTemplate, text: str, other: str) -> int:
    """The length of the longest run of ``text``'s tokens, from its start, that ``other`` starts with."""
    ids, kept = template.encode(text), 0
    for n in range(1, len(ids) + 1):
        head = template.decode(ids[:n])
        if not (text.startswith(head) and other.startswith(head)):
            break
        kept = len(head)
    return kept


def _end_tokens(template: ChatTemplate, stop_tokens: Sequence[str]) -> dict[str, int]:
    """The model's end-of-sequence tokens that are not stop tokens, by text (ids whose text does not encode
    back to them alone are left out: they could not be found in rendered text)."""
    found: dict[str, int] = {}
    for token_id in end_of_sequence_ids(template.tokenizer):
        text = template.decode([token_id])
        if text not in stop_tokens and template.encode(text) == [token_id]:
            found[text] = token_id
    return found


def _tool_role(template: ChatTemplate, as_json: bool) -> str:
    """The first of ``tool`` / ``ipython`` / ``observation`` whose messages the template shows (after a turn
    that called the tool, or without one where the template raises on that)."""
    errors = []
    result = "Tool result 4b7e for detection."
    for role in _TOOL_ROLES:
        try:
            rendered, _ = _after_base(template, [_result(result, 0, role)], as_json)
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
    template: ChatTemplate, follow: list[dict[str, Any]], as_json: bool
) -> tuple[str, list[dict[str, Any]] | None]:
    """``follow`` rendered after the base conversation (the facts are not known yet: messages as they are),
    with the base turn that the template accepts: without calls, else (results a call must precede) calling
    them. Returns the rendering and the base turn's calls (None without)."""
    tools = [PROBE_TOOL]
    try:
        return template.apply([*base_conversation(None), *follow], tools, True), None
    except TemplateError:
        results = leading_results(follow)
        if not results:
            raise
        base = base_conversation(None, results, as_json=as_json)
        return template.apply([*base, *follow], tools, True), base


def _token_after_base_turn(template: ChatTemplate, follow: list[dict[str, Any]], as_json: bool) -> str:
    """The special token the template writes right after an assistant turn when ``follow`` comes next: right
    after its content, or for a turn that must call the tools (see :func:`_after_base`) the last token of the
    turn as the template renders it last (``[e~[`` of MiniMax-M2, ``<|call|>`` of gpt-oss), else the token
    that follows it."""
    rendered, base = _after_base(template, follow, as_json)
    if base is None:
        at = rendered.rfind(BASE_ASSISTANT)
        if at < 0:
            raise TemplateError("the chat template dropped the assistant's content")
        tail = rendered[at + len(BASE_ASSISTANT) :]
    else:
        alone = template.apply(base, [PROBE_TOOL], False).rstrip()
        last = next((t for t in template.special_tokens if alone.endswith(t)), None)
        if last is not None and rendered.startswith(alone):
            return last
        tail = rendered[len(alone) :] if rendered.startswith(alone) else ""
    lead = next((t for t in template.special_tokens if tail.startswith(t)), None)
    if lead is None:
        raise TemplateError(
            f"cannot find the end-of-turn token after an assistant turn (template renders {tail[:80]!r})"
        )
    return lead


def _arguments_type(template: ChatTemplate) -> Literal["mapping", "json"]:
    user: dict[str, Any] = {"role": "user", "content": _BASE_USER}
    call = probe_call(0)
    try:
        template.apply(
            [user, {"role": "assistant", "content": "", "tool_calls": [call]}], [PROBE_TOOL], False
        )
        return "mapping"
    except TemplateError as mapping_error:
        as_json = {"role": "assistant", "content": "", "tool_calls": [json_arguments(call)]}
        try:
            template.apply([user, as_json], [PROBE_TOOL], False)
        except TemplateError:
            raise TemplateError(
                f"the chat template refuses an assistant turn that calls a tool (call id {call['id']!r}, the "
                f"shape of the agent's ids; arguments as a mapping or a JSON string): {mapping_error}"
            ) from None
        return "json"


def _single_token_id(template: ChatTemplate, text: str) -> int:
    ids = template.encode(text)
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
    return tuple(dict.fromkeys(i for i in ids if is_int(i) and 0 <= i < size))


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
        ids += [v for v in values if is_int(v)]
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
