"""Incremental chat-template rendering: render only what is new, never re-render an assistant turn.

The first model call renders system prompt + tool specs + messages with the tokenizer's own chat template.
Later calls render ONLY the messages added since (tool results, user follow-ups) plus the generation prompt,
by rendering them after a small fixed base conversation and keeping what follows the base assistant's turn.
Cost per turn is O(new messages), not O(history), and assistant tokens stay exactly what the server
generated. ``ChatRenderer.probe`` checks at construction that this reproduces the template's full rendering
for a conversation with tool calls, parallel results and a follow-up user turn.

Templates end an assistant turn in one of two ways, found by rendering (never by model name):

* a CLOSING token after every assistant turn (``<|im_end|>``, ``<|eot_id|>``, ``<｜end▁of▁sentence｜>``);
* the NEXT message's role tag (GLM: ``<|observation|>`` before tool results, ``<|user|>`` before a user turn).

Either way those tokens are the stop tokens, and a continuation is rendered starting AT the stop token: when
the model's own last token is that token it is not appended twice (counted once), otherwise (the model
stopped on another stop token, e.g. ``<|endoftext|>``) the template's closing / role token follows it. The
model's end-of-sequence tokens (what SGLang stops on by itself, see ``end_of_sequence_ids``) end a turn too; Llama 3's
``<|eom_id|>`` closes it in place of the template's ``<|eot_id|>``, which then does not follow it.

Template quirks handled by detection: tool-call ``arguments`` as a mapping (GLM iterates it) or a JSON string
(DeepSeek-V3.1 concatenates it); tool results as role ``tool``, ``ipython`` or ``observation`` (or wrapped in a
user turn by the template); default system prompts, BOS text and dropped reasoning in earlier turns (only the
base conversation sees them); no generation prompt after tool results (DeepSeek-V3.1).
"""

from __future__ import annotations

import difflib
import functools
import itertools
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ._per_tokenizer import PerTokenizer
from .chat_template import ChatTemplate, TemplateError, template_key
from .facts import (
    BASE_ASSISTANT,
    BASE_NOTE,
    BASE_TOOL,
    PROBE_SYSTEM,
    PROBE_TOOL,
    TemplateFacts,
    base_conversation,
    detect_facts,
    json_arguments,
    leading_results,
    probe_call,
    probe_conversation,
    turn_variants,
)

__all__ = [
    "ChatRenderer",
    "IncrementalVerdict",
    "TemplateError",
    "check_images",
    "check_incremental",
    "probe_incremental",
    "render_after_base",
]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_LITERAL = "\ue000{}\ue001"  # private-use placeholder for a message body during literal encoding
logger = logging.getLogger(__name__)


_SHAPES_PER_TEMPLATE = 1024
"""Continuation shapes kept per template (a shape includes the system prompt and tools: bounded, LRU)."""
_SLOT = "\t\n <{}{}\ue000&\"'\\\u00e9\u4e2d/>" + "slot text 0123456789 ,.;:!?-\n" * 40 + "\n\t "
"""A placeholder body: whitespace at both ends (caught if a template strips it), markup, quotes and a backslash
(escaped or JSON-encoded), non-ASCII (ASCII-escaped), and over 1k characters (cut to a length, or dropped
above one). A template that changes it in any way, or drops it, is rendered with jinja for that shape."""
_BODY_KEYS = frozenset({"role", "content", "tool_call_id"})

Shape = tuple[Any, ...]
_Pieces = tuple[tuple[str, ...], tuple[int, ...]]
"""A shape's rendering: its fixed pieces, and which slot (see ``_slots``) goes between each two."""


class _Continuations:
    """Continuation renderings of one template, by shape: the template's text around the message bodies.

    A shape is what the rendering may depend on besides the bodies: system prompt, tools, and per new message
    its role, whether its content is empty and whether it carries a ``tool_call_id``. Its pieces are found
    once, by rendering the shape with two sets of placeholder bodies, and kept only if both give the same
    pieces and the pieces joined with the real bodies give exactly the real rendering; otherwise the shape is
    marked (None) and always rendered with jinja.
    """

    def __init__(self) -> None:
        self._pieces: OrderedDict[Shape, _Pieces | None] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, shape: Shape) -> _Pieces | bool | None:
        """The shape's pieces, None for a jinja-only shape, False when it was never rendered."""
        with self._lock:
            pieces = self._pieces.get(shape, False)
            if pieces is not False:
                self._pieces.move_to_end(shape)
            return pieces

    def put(self, shape: Shape, pieces: _Pieces | None) -> None:
        with self._lock:
            self._pieces[shape] = pieces
            while len(self._pieces) > _SHAPES_PER_TEMPLATE:
                self._pieces.popitem(last=False)


@dataclass(frozen=True)
class _TemplateState:
    """What is found once per (tokenizer, template, template kwargs): facts and continuation shapes."""

    facts: TemplateFacts
    continuations: _Continuations


_TEMPLATES: PerTokenizer[_TemplateState] = PerTokenizer()
_IMAGES_CHECKED: PerTokenizer[bool] = PerTokenizer()


class ChatRenderer(ChatTemplate):
    """Renders a conversation with a tokenizer's chat template, first in full, then incrementally: a
    :class:`~slime_strands.template.chat_template.ChatTemplate` that knows its facts."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        enable_thinking: bool | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        probe: bool = True,
    ) -> None:
        kwargs = dict(template_kwargs or {})
        if enable_thinking is not None:  # ``enable_thinking`` wins over the template variables
            kwargs["enable_thinking"] = enable_thinking
        super().__init__(tokenizer, kwargs)
        self.enable_thinking = self.template_kwargs.get("enable_thinking")
        self._tools_key: tuple[Any, str] | None = None
        # Detection and probing cost ~20 ms of template rendering: done once per (tokenizer, template, mode),
        # not once per trajectory (a rollout step builds hundreds of models).
        key = (template_key(tokenizer), repr(sorted(self.template_kwargs.items())), probe)
        state = _TEMPLATES.get(tokenizer, key, functools.partial(self._find_state, probe))
        self.facts = state.facts
        self._continuations = state.continuations

    def _find_state(self, probe: bool) -> _TemplateState:
        """The template's facts (:func:`~slime_strands.template.facts.detect_facts`), probed when asked."""
        self.facts = detect_facts(self)
        if probe:
            verdict = probe_incremental(self)
            self.facts = replace(self.facts, parallel_calls=verdict.parallel_calls, rewrites=verdict.rewrites)
        return _TemplateState(self.facts, _Continuations())

    def check_images(self, image_text: str) -> None:
        """For a vision-language model: check (once per tokenizer, template and mode) that the template renders
        images incrementally, each as one ``image_text`` (see :func:`check_images`), else raise TemplateError."""
        key = (template_key(self.tokenizer), repr(sorted(self.template_kwargs.items())), image_text)
        _IMAGES_CHECKED.get(self.tokenizer, key, functools.partial(check_images, self, image_text))

    def probe(self) -> bool:
        """Check that incremental rendering reproduces the template's full rendering, else raise TemplateError;
        returns whether the template renders parallel calls (see
        the module's :func:`check_incremental`)."""
        return check_incremental(self)

    def verdict(self, tools: Sequence[Mapping[str, Any]] = ()) -> IncrementalVerdict:
        """What :meth:`probe` finds, with what the template renders differently once later messages follow
        (see :func:`probe_incremental`; ``tools``: an agent's template-format tools, offered beside the probe
        tool); raises TemplateError like it."""
        return probe_incremental(self, tools)

    @property
    def stop_tokens(self) -> tuple[str, ...]:
        return self.facts.stop_tokens

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self.facts.stop_token_ids

    @property
    def turn_end_ids(self) -> tuple[int, ...]:
        """Every token a turn may end on: the template's stop tokens, then the model's end-of-sequence ones."""
        return self.facts.stop_token_ids + self.facts.end_token_ids

    @property
    def end_of_turn(self) -> str:
        """The first stop token (the closing token of templates that have one)."""
        return self.facts.stop_tokens[0]

    @property
    def end_of_turn_id(self) -> int:
        return self.facts.stop_token_ids[0]

    # -- rendering ----------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """Full rendering with the tokenizer's template (template-format messages and tools); a generation
        prompt without what the template's rendering of the next turn does not start with (``dropped_prompt``)."""
        text = self.apply([self._adapt(m) for m in messages], tools, add_generation_prompt)
        dropped = self.facts.dropped_prompt
        if add_generation_prompt and dropped and text.endswith(dropped):
            return text[: -len(dropped)]
        return text

    def _adapt(self, message: Mapping[str, Any]) -> Mapping[str, Any]:
        """A template-format message in the shape this template expects (tool role, arguments type)."""
        facts = self.facts
        adapted = dict(message)
        if adapted.get("role") == "tool":
            adapted["role"] = facts.tool_role
        if facts.arguments_as == "json" and adapted.get("tool_calls"):
            adapted["tool_calls"] = [json_arguments(call) for call in adapted["tool_calls"]]
        return adapted

    def render_continuation(
        self,
        new_messages: Sequence[Mapping[str, Any]],
        *,
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """What follows an assistant turn's content: the stop token that ends it, ``new_messages`` and the
        generation prompt (if the template writes one there)."""
        if not new_messages:
            raise TemplateError("nothing to render: no new messages after the assistant turn")
        full, markers = render_after_base(self, new_messages, system, tools)
        return self.continuation_after(full, markers)

    def encode_continuation(
        self,
        new_messages: Sequence[Mapping[str, Any]],
        *,
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        after: int | None = None,
    ) -> tuple[str, list[int]]:
        """:meth:`render_continuation` and its token ids, message bodies encoded LITERALLY.

        ``after`` is the last token of the trajectory: when it is the stop token the continuation starts
        with, that token is not repeated (text and ids both start after it).

        Tool output is written by the policy's code: text such as ``<|im_end|><|im_start|>assistant`` in it
        must not become control tokens that forge turns. Bodies holding special-token text are encoded with
        the literal encoder; the template's own markup keeps its special tokens. Decoding the ids always
        gives the rendered text.

        The template runs once per shape of the new messages (see ``_Continuations``); afterwards a
        continuation is its cached pieces joined with the bodies, with exactly the text and ids jinja gives.
        """
        if not new_messages:
            raise TemplateError("nothing to render: no new messages after the assistant turn")
        cached = self._cached_segments(new_messages, system, tools)
        if cached is None:
            text = self.render_continuation(new_messages, system=system, tools=tools)
            ids = self._encode_bodies_literally(new_messages, text, system, tools)
        else:
            segments, risky = cached
            text = "".join(segments)
            ids = self._encode_segments(segments, risky, text)
        if after is not None and ids and self._already_closed(after, ids[0]):
            lead = self.token_text(ids[0])
            if text.startswith(lead):
                return text[len(lead) :], ids[1:]
        return text, ids

    def _already_closed(self, last: int, first: int) -> bool:
        """Whether a continuation starting with token ``first`` (the closing token or a role tag) must drop it
        after a turn that ended on ``last``: the model wrote that token, or one that closes in its place."""
        return first == last or (last in self.facts.closing_in_place and first == self.end_of_turn_id)

    def _cached_segments(
        self,
        new_messages: Sequence[Mapping[str, Any]],
        system: str | None,
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> tuple[list[str], set[int]] | None:
        """The continuation as [piece, body, piece, ..., piece] from the shape's cached pieces, and the
        indexes of the bodies to encode literally; None when this shape is rendered with jinja."""
        slots = _slots(new_messages)
        if slots is None:
            return None
        control = self._control_tokens
        if any(key == "tool_call_id" and any(t in value for t in control) for key, value in slots):
            return None
        kinds = tuple(
            (m.get("role"), not m.get("content"), "tool_call_id" in m, repr(m.get("tool_call_id") and 1))
            for m in new_messages
        )
        shape = (system, self._key_of_tools(tools), kinds)
        cached = self._continuations.get(shape)
        if cached is False:
            cached = self._render_shape(new_messages, slots, system, tools)
            self._continuations.put(shape, cached)
        if cached is None or cached is True:
            return None
        pieces, order = cached
        segments, risky = [pieces[0]], set()
        for slot, piece in zip(order, pieces[1:], strict=True):
            key, value = slots[slot]
            if key == "content" and any(t in value for t in control):
                risky.add(len(segments))
            segments += (value, piece)
        return segments, risky

    def _render_shape(
        self,
        new_messages: Sequence[Mapping[str, Any]],
        slots: Sequence[tuple[str, str]],
        system: str | None,
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> _Pieces | None:
        """The pieces of a new shape, or None when the template does not keep the bodies verbatim."""
        found = []
        for placeholder_set in ("A", "B"):
            placeholders = [_SLOT.format(placeholder_set, i) for i in range(len(slots))]
            values = iter(placeholders)
            masked = [
                {k: next(values) if (k, v) in _slot_items(m) else v for k, v in m.items()}
                for m in new_messages
            ]
            found.append(
                _split_on(self.render_continuation(masked, system=system, tools=tools), placeholders, slots)
            )
        real = self.render_continuation(new_messages, system=system, tools=tools)
        if found[0] is None or found[0] != found[1] or _join(found[0], slots) != real:
            logger.debug(
                "a continuation shape is rendered with jinja: the template does not keep bodies verbatim"
            )
            return None
        return found[0]

    def _key_of_tools(self, tools: Sequence[Mapping[str, Any]] | None) -> str:
        """A key for the tools (the same list object as last time reuses its key: no JSON per turn)."""
        if not tools:
            return ""
        memo = self._tools_key
        if memo is not None and memo[0] is tools:
            return memo[1]
        key = json.dumps(tools, sort_keys=True, default=str)
        self._tools_key = (tools, key)
        return key

    def _encode_segments(self, segments: Sequence[str], literal: set[int], text: str) -> list[int]:
        """Ids of ``segments`` joined: those at ``literal`` indexes encoded literally, each run of the others
        encoded together (with no literal segment: the ids of the whole text, as jinja's path gives)."""
        if not literal:
            return self.encode(text)
        ids: list[int] = []
        run: list[str] = []
        for i, segment in enumerate(segments):
            if i in literal:
                ids += self.encode("".join(run)) + self.encode_literal(segment)
                run = []
            else:
                run.append(segment)
        ids += self.encode("".join(run))
        return ids if self.decode(ids) == text else self._plain(text)

    def _encode_bodies_literally(
        self,
        new_messages: Sequence[Mapping[str, Any]],
        text: str,
        system: str | None,
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> list[int]:
        """The jinja path of :meth:`encode_continuation`: the markup around risky bodies from a masked
        rendering, each body from the real one (a template that trims or escapes bodies is encoded exactly)."""
        risky = [
            (i, part)
            for i, m in enumerate(new_messages)
            for part, body in _bodies(m)
            if any(t in body for t in self._control_tokens)
        ]
        if not risky:
            return self.encode(text)
        masked = _masked(new_messages, risky)
        rest = self.render_continuation(masked, system=system, tools=tools)
        markup: list[str] = []
        for k in range(len(risky)):
            before, sep, rest = rest.partition(_LITERAL.format(k))
            if not sep:
                return self._plain(text)
            markup.append(before)
        markup.append(rest)
        segments: list[str] = []
        pos = 0
        for k, piece in enumerate(markup[:-1]):
            if not text.startswith(piece, pos):
                return self._plain(text)
            pos += len(piece)
            last = k + 1 == len(markup) - 1
            end = len(text) - len(markup[-1]) if last else text.find(markup[k + 1], pos)
            if end < pos:
                return self._plain(text)
            segments += (piece, text[pos:end])
            pos = end
        segments.append(markup[-1])
        return self._encode_segments(segments, set(range(1, len(segments), 2)), text)

    def _plain(self, text: str) -> list[int]:
        logger.warning("chat template alters message bodies: tool output encoded with special tokens")
        return self.encode(text)

    @functools.cached_property
    def _control_tokens(self) -> tuple[str, ...]:
        """Special tokens (turn markers, EOS) that plain text must never turn into."""
        return tuple(t for t in self.special_tokens if t)

    def without_stop_token(self, output_ids: Sequence[int], ended_on: int | None = None) -> list[int]:
        """A turn's ``output_ids`` without the token that ended it: its last token when that is one of
        :attr:`turn_end_ids` or ``ended_on`` (the stop token the server reports, e.g. one of the request's own
        stop ids); a turn cut by ``max_new_tokens`` keeps every token."""
        ids = list(output_ids)
        if ids and (ids[-1] in self.turn_end_ids or (ended_on is not None and ids[-1] == ended_on)):
            ids.pop()
        return ids

    def opens_reasoning(self, prompt_text: str) -> bool:
        """True when the generation prompt leaves a ``<think>`` block open (the output starts in reasoning).

        Only the end of ``prompt_text`` counts, where the template appends the generation prompt: the detected
        generation prompt when the text ends with it, else an unclosed ``<think>`` at the very end (a prompt
        that differs after tool results). Text inside a user or tool message never counts, whatever it holds (a
        tool that prints ``<think>`` or a stop token's text: template markup follows every message body), nor
        does a continuation with no generation prompt at all (DeepSeek after tool output).
        """
        prompt = self.facts.generation_prompt
        if prompt and prompt_text.endswith(prompt):
            return prompt.rfind(_THINK_OPEN) > prompt.rfind(_THINK_CLOSE)
        return prompt_text.rstrip().endswith(_THINK_OPEN)

    # -- helpers ---------------------------------------------------------------------------------

    def continuation_after(self, rendered: str, markers: Sequence[str]) -> str:
        """The rendering from the stop token that ends the assistant turn holding ``markers`` on."""
        ends = [rendered.rfind(m) + len(m) for m in markers if m and m in rendered]
        if not ends:
            raise TemplateError(f"the chat template dropped assistant content {markers[0]!r}")
        at = max(ends)
        closers = (*self.stop_tokens, *self.closing_in_place_texts)
        found = [p for p in (rendered.find(t, at) for t in closers) if p >= 0]
        if not found:
            raise TemplateError(f"no end-of-turn token {list(self.stop_tokens)} after an assistant turn")
        return rendered[min(found) :]

    @property
    def closing_in_place_texts(self) -> tuple[str, ...]:
        """The texts of the end tokens that close a turn in place of the template's closing token."""
        return tuple(self.token_text(i) for i in self.facts.closing_in_place)


# -- the incremental check and the base conversation ---------------------------------------


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
    results = leading_results(new_messages)
    if not results:
        full = renderer.render(
            [*base_conversation(system), *new_messages], tools=tools, add_generation_prompt=True
        )
        return full, [BASE_ASSISTANT]
    try:
        base = base_conversation(system, results)
        full = renderer.render([*base, *new_messages], tools=tools, add_generation_prompt=True)
        return full, [BASE_ASSISTANT, BASE_NOTE]
    except TemplateError as with_calls:
        try:
            full = renderer.render(
                [*base_conversation(system), *new_messages], tools=tools, add_generation_prompt=True
            )
        except TemplateError:
            raise with_calls from None
        return full, [BASE_ASSISTANT]


# -- incremental rendering ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class IncrementalVerdict:
    """What :func:`probe_incremental` found about a template that renders incrementally."""

    parallel_calls: bool
    """Whether the template renders several calls in one turn."""
    rewrites: tuple[tuple[str, str], ...]
    """``(as the model was shown it, as the finished conversation's rendering has it)``: token runs (with a
    token of context either side) of a prompt that the template renders differently once later messages follow
    (Hermes-3's ``</tool_response><|im_end|>`` becomes ``</tool_response>\\n<|im_end|>``; GLM-4.7's ``<think>``
    that opened a turn becomes ``</think>``). The trajectory keeps what the model saw."""


def check_incremental(renderer: ChatRenderer) -> bool:
    """:func:`probe_incremental`, for whether the template renders parallel calls."""
    return probe_incremental(renderer).parallel_calls


def probe_incremental(renderer: ChatRenderer, tools: Sequence[Mapping[str, Any]] = ()) -> IncrementalVerdict:
    """Check that incremental rendering reproduces the template's full rendering, else raise TemplateError.

    Walks the probe conversation (:func:`probe_conversation`): every non-assistant block rendered with
    :meth:`render_continuation` must equal what the full rendering puts after the preceding assistant turn, the
    messages must be shown, the token ids of the pieces must concatenate without boundary drift, and what was
    rendered must stay as it was once later messages follow (the first prompt is how the whole conversation
    starts, each block is what the whole conversation has there, up to its last message's body). What follows
    the last body (its closing markup and the next turn's opening) may be rendered differently once the
    conversation goes on: each such rewrite is found and returned, since the trajectory keeps what the model was
    shown. Every prompt must be how the template's rendering with the next assistant turn starts (with or
    without reasoning in that turn), else the model would read text no rendering of a conversation holds.
    Templates may rewrite OLDER assistant turns (Qwen3, GLM and DeepSeek drop earlier reasoning): that is allowed,
    since assistant tokens are never re-rendered. Parallel calls: Llama 3.2's template refuses them, gpt-oss's
    shows only the first (the probe then uses one call with two results). ``tools`` (an agent's template-format
    tools) are offered beside the probe tool in every rendering: the check holds for the prompts of an agent
    with those tools (a template that renders a tool's schema in a way that breaks incremental rendering fails).
    """
    offered: list[dict[str, Any]] = [*(dict(t) for t in tools), PROBE_TOOL]
    conversation, parallel = _conversation_rendered(renderer, offered)
    whole = renderer.render(conversation, tools=offered, add_generation_prompt=False)
    assistant_at = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    first = conversation[: assistant_at[0]]
    start = _through_last_body(renderer.render(first, tools=offered, add_generation_prompt=False), first)
    if not whole.startswith(start):
        raise TemplateError(
            "the chat template renders the start of a conversation differently once later messages follow "
            f"(the first prompt is {_around(start, whole)}): the prompt the model saw would not be the template's"
        )
    sent = renderer.render(first, tools=offered, add_generation_prompt=True)
    rewrites = _rewrites(renderer, sent, _before_turn(whole, conversation[assistant_at[0]]))
    for i, block_end in itertools.pairwise(assistant_at):
        rewrites += _check_block(renderer, conversation, (i, block_end), whole, offered)
    for at in assistant_at:
        _check_turn_opening(renderer, conversation, at, offered)
    return IncrementalVerdict(parallel, tuple(dict.fromkeys(rewrites)))


def _markers(message: Mapping[str, Any]) -> list[str]:
    """What shows an assistant turn in a rendering: its content and the notes of its calls."""
    return [str(message.get("content") or "")] + [
        c["function"]["arguments"]["note"] for c in message.get("tool_calls", [])
    ]


def _before_turn(rendered: str, turn: Mapping[str, Any]) -> str:
    """``rendered`` up to where it first shows ``turn`` (all of it when it does not)."""
    found = [p for p in (rendered.find(m) for m in _markers(turn) if m) if p >= 0]
    return rendered[: min(found)] if found else rendered


def _rewrites(renderer: ChatRenderer, sent: str, later: str) -> list[tuple[str, str]]:
    """The token runs of ``sent`` (a prompt as the model was shown it) that ``later`` (what the rendering of the
    conversation that goes on has there) writes differently, each with a token of context either side."""
    if later.startswith(sent):
        return []
    shown, after = renderer.encode(sent), renderer.encode(later)
    found = []
    matcher = difflib.SequenceMatcher(None, shown, after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "insert" and i1 == len(shown)):
            continue  # what follows the prompt is the next turn's
        lo, hi = max(0, i1 - 1), min(len(shown), i2 + 1)
        found.append((renderer.decode(shown[lo:hi]), renderer.decode(after[j1 - (i1 - lo) : j2 + (hi - i2)])))
    return found


def _check_turn_opening(
    renderer: ChatRenderer, conversation: list[dict[str, Any]], at: int, tools: list[dict[str, Any]]
) -> None:
    """The prompt for the assistant turn at ``at`` must be how the template renders the conversation with that
    turn starts (the turn with or without reasoning), up to the prompt's last token where that is one the
    rendering of the turn writes otherwise (DeepSeek-V3.1's ``<think>`` becomes ``</think>``), or, for a template
    that rewrites the closing of the last message once any message follows it (see :func:`_rewrites`), that
    rendering must hold the generation prompt after the last message's body: else the generation prompt writes
    text that no rendering of the conversation holds, and the model would read it before every turn."""
    before = conversation[:at]
    prompt = renderer.render(before, tools=tools, add_generation_prompt=True)
    bare = renderer.render(before, tools=tools, add_generation_prompt=False)
    opening = prompt[len(bare) :] if prompt.startswith(bare) else ""
    body = str(before[-1].get("content") or "")
    last = renderer.decode(renderer.encode(prompt)[-1:]) if opening else ""
    seen = []
    for turn in turn_variants(conversation[at]):
        try:
            rendered = renderer.render([*before, turn], tools=tools, add_generation_prompt=False)
        except TemplateError:
            continue
        after_body = rendered.rfind(body) + len(body) if body and body in rendered else 0
        if (
            rendered.startswith(prompt)
            or rendered.startswith(prompt[: len(prompt) - len(last)])
            or (opening and rendered.find(opening, after_body) >= 0)
        ):
            return
        seen.append(rendered)
    apart = _around(prompt, seen[0]) if seen else "no rendering with the turn"
    raise TemplateError(
        "the chat template's prompt for an assistant turn is not how it renders the conversation with that turn "
        f"({apart}): its generation prompt writes text no rendering of the conversation holds, which the model "
        "would read before every turn"
    )


def check_images(renderer: ChatRenderer, image_text: str) -> bool:
    """Check that a conversation with images (in the first question, in a tool result, in a follow-up question)
    renders each image as exactly one ``image_text`` and renders incrementally: each block after an assistant
    turn rendered alone equals what the whole conversation has there. Templates that number images across
    the conversation (Qwen-VL's ``add_vision_id``: "Picture 3:") or drop the images of tool results fail, with
    the reason. Returns True (the value cached)."""
    tools = [PROBE_TOOL]
    conversation = probe_conversation(calls=2 if renderer.facts.parallel_calls else 1)
    with_images = {3, 5, len(conversation) - 2}  # the first question, the first result, the follow-up
    conversation = [
        {**m, "content": [{"type": "image", "image": None}, {"type": "text", "text": m["content"]}]}
        if i in with_images
        else m
        for i, m in enumerate(conversation)
    ]
    try:
        whole = renderer.render(conversation, tools=tools, add_generation_prompt=False)
    except TemplateError as exc:
        raise TemplateError(
            f"the chat template cannot render images (list content with image items): {exc}"
        ) from exc
    if whole.count(image_text) != len(with_images):
        raise TemplateError(
            f"the chat template renders {whole.count(image_text)} image placeholders {image_text!r} for "
            f"{len(with_images)} images (in a user turn, a tool result and a later user turn): each image must "
            "render as one placeholder, in tool results too, for the server to see it"
        )
    assistant_at = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    for i, block_end in itertools.pairwise(assistant_at):
        message = conversation[i]
        markers = [message["content"]] + [
            c["function"]["arguments"]["note"] for c in message.get("tool_calls", [])
        ]
        full = renderer.render(conversation[:block_end], tools=tools, add_generation_prompt=True)
        expected = renderer.continuation_after(full, markers)
        got = renderer.render_continuation(conversation[i + 1 : block_end], system=PROBE_SYSTEM, tools=tools)
        if got != expected and not _closed_in_place(renderer, expected, got):
            raise TemplateError(
                "the chat template renders messages with images differently alone than in the whole "
                f"conversation ({_around(expected, got)}; a template that numbers images across the "
                "conversation, such as add_vision_id, does): images cannot be rendered incrementally"
            )
    return True


def _conversation_rendered(
    renderer: ChatRenderer, tools: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], bool]:
    """The probe conversation with parallel calls when the template renders them all, else with one call."""
    conversation = probe_conversation(calls=2)
    try:
        rendered = renderer.render(conversation, tools=tools, add_generation_prompt=False)
    except TemplateError:
        rendered = ""
    if all(probe_call(n)["function"]["arguments"]["note"] in rendered for n in range(2)):
        return conversation, True
    conversation = probe_conversation(calls=1)
    renderer.render(conversation, tools=tools, add_generation_prompt=False)  # raises the template's reason
    return conversation, False


def _check_block(
    renderer: ChatRenderer,
    conversation: list[dict[str, Any]],
    span: tuple[int, int],
    whole: str,
    tools: list[dict[str, Any]],
) -> list[tuple[str, str]]:
    """The checks of :func:`probe_incremental` for the messages between the assistant turns at ``span``; the
    block's rewrites once the conversation goes on."""
    i, block_end = span
    markers = _markers(conversation[i])
    new = conversation[i + 1 : block_end]
    full = renderer.render(conversation[:block_end], tools=tools, add_generation_prompt=True)
    expected = renderer.continuation_after(full, markers)
    got = renderer.render_continuation(new, system=PROBE_SYSTEM, tools=tools)
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
    return _rewrites(renderer, expected, _before_turn(later, conversation[block_end]))


def _through_last_body(text: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """``text`` up to the end of the last message's body: what follows it opens the next assistant turn, which
    a template may write differently once the turn is history (GLM-4.7's and DeepSeek-V3.2's ``<think>`` becomes
    ``</think>`` when the reasoning is dropped; Hermes-3's newline after a tool result)."""
    body = str(messages[-1].get("content") or "")
    at = text.rfind(body) if body else -1
    return text[: at + len(body)] if at >= 0 else text


def _mismatch(expected: str, got: str) -> str:
    if BASE_TOOL in got and BASE_TOOL not in expected:
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


def _bodies(message: Mapping[str, Any]) -> list[tuple[int | None, str]]:
    """A message's text bodies: its string content (part None), or each text item of list content (by index)."""
    content = message.get("content")
    if isinstance(content, str):
        return [(None, content)]
    if isinstance(content, list):
        return [
            (j, str(item.get("text", ""))) for j, item in enumerate(content) if item.get("type") == "text"
        ]
    return []


def _masked(messages: Sequence[Mapping[str, Any]], bodies: Sequence[tuple[int, int | None]]) -> list[Any]:
    """``messages`` with the k-th of ``bodies`` replaced by the k-th literal placeholder."""
    out: list[Any] = [dict(m) for m in messages]
    for k, (i, part) in enumerate(bodies):
        if part is None:
            out[i]["content"] = _LITERAL.format(k)
        else:
            items = out[i]["content"] = list(out[i]["content"])
            items[part] = {**items[part], "text": _LITERAL.format(k)}
    return out


def _slot_items(message: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A message's substitutable fields, in order: its content and its ``tool_call_id`` when not empty."""
    return [
        (k, message[k]) for k in ("content", "tool_call_id") if isinstance(message.get(k), str) and message[k]
    ]


def _slots(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]] | None:
    """Every substitutable field of ``messages``, or None when a message has anything else to render."""
    slots = []
    for message in messages:
        call_id = message.get("tool_call_id")
        if (
            not _BODY_KEYS.issuperset(message)
            or not isinstance(message.get("content"), str)
            or not (call_id is None or isinstance(call_id, str))
        ):
            return None
        slots += _slot_items(message)
    return slots


def _split_on(text: str, placeholders: Sequence[str], slots: Sequence[tuple[str, str]]) -> _Pieces | None:
    """``text`` cut at the placeholders, in the order it shows them: every content placeholder exactly once,
    a ``tool_call_id`` one once or not at all (templates that do not show ids); None otherwise."""
    at = []
    for i, (placeholder, (key, _)) in enumerate(zip(placeholders, slots, strict=True)):
        count = text.count(placeholder)
        if count > 1 or (count == 0 and key == "content"):
            return None
        if count:
            at.append((text.index(placeholder), i))
    at.sort()
    pieces, pos = [], 0
    for start, i in at:
        if start < pos:
            return None
        pieces.append(text[pos:start])
        pos = start + len(placeholders[i])
    pieces.append(text[pos:])
    return tuple(pieces), tuple(i for _, i in at)


def _join(cached: _Pieces, slots: Sequence[tuple[str, str]]) -> str:
    pieces, order = cached
    return pieces[0] + "".join(slots[i][1] + piece for i, piece in zip(order, pieces[1:], strict=True))
