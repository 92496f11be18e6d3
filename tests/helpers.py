"""Shared scripting helpers for the TITO core tests.

A test scripts the model's turns as :class:`ModelTurn` objects. From the SAME script (never from the
agent's messages or the model's renderer) the helpers build:

* the exact text the scripted server answers (``ModelTurn.text()``, Qwen3's own tool-call format), and
* the canonical chat-template conversation (``canonical_conversation``) that ``apply_chat_template`` renders,

so ``tokenizer.decode(tm.token_ids)`` can be compared with the template's full rendering.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import psutil
from strands import Agent
from strands.agent.conversation_manager import NullConversationManager

from slime_strands import SGLangClient, SGLangModel
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_trajectory_invariants

END_OF_TURN = "<|im_end|>"
# One tool in OpenAI's function format (what chat templates take), for rendering tests.
TEMPLATE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        },
    }
]
EMPTY_THINK = "<think>\n\n</think>\n\n"


def call_text(name: str, arguments: Any) -> str:
    """A tool call exactly as the Qwen3 chat template renders ``tool_calls`` (``json.dumps`` separators)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@dataclass(frozen=True)
class Call:
    """A well-formed call of a known tool."""

    name: str
    arguments: dict[str, Any]

    @property
    def text(self) -> str:
        return call_text(self.name, self.arguments)


@dataclass(frozen=True)
class BadCall:
    """A malformed (or unknown-tool) call: ``raw`` is what the model writes, ``kind`` the expected error kind."""

    raw: str
    kind: str

    @property
    def text(self) -> str:
        return self.raw


# One example of every malformed call kind the strict Hermes parser reports.
BAD_CALLS: dict[str, BadCall] = {
    "bad_json": BadCall('<tool_call>\n{"name": "add", "arguments": {"a": 2}\n</tool_call>', "bad_json"),
    "non_object": BadCall('<tool_call>\n["add", {"a": 1}]\n</tool_call>', "bad_json"),
    "missing_name": BadCall('<tool_call>\n{"arguments": {"a": 1, "b": 2}}\n</tool_call>', "missing_name"),
    "arguments_missing": BadCall('<tool_call>\n{"name": "add"}\n</tool_call>', "bad_arguments"),
    "arguments_string": BadCall(
        '<tool_call>\n{"name": "add", "arguments": "a=1, b=2"}\n</tool_call>', "bad_arguments"
    ),
    "arguments_list": BadCall(
        '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>', "bad_arguments"
    ),
    "unknown_tool": BadCall(call_text("subtract", {"a": 1, "b": 2}), "unknown_tool"),
    "unclosed": BadCall('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}', "unclosed_tag"),
    "stray_close": BadCall("</tool_call>", "unclosed_tag"),
}


@dataclass
class ModelTurn:
    """One scripted model answer: optional reasoning, visible text, then calls (malformed ones first).

    ``reasoning=None`` means no think block; ``""`` an empty one (what Qwen3 renders on a final answer).
    ``reasoning_calls`` are drafted inside the think block (never executed).
    """

    content: str = ""
    calls: Sequence[Call | BadCall] = ()
    reasoning: str | None = None
    reasoning_calls: Sequence[Call] = ()

    def reasoning_text(self) -> str | None:
        if self.reasoning is None and not self.reasoning_calls:
            return None
        return " ".join([self.reasoning or "", *(c.text for c in self.reasoning_calls)]).strip()

    def body(self) -> str:
        return "\n".join([*([self.content] if self.content else []), *(c.text for c in self.calls)])

    def text(self) -> str:
        """The model's output text (the server appends ``<|im_end|>``)."""
        reasoning = self.reasoning_text()
        think = "" if reasoning is None else f"<think>\n{reasoning}\n</think>\n\n"
        return think + self.body()

    @property
    def valid_calls(self) -> list[Call]:
        return [c for c in self.calls if isinstance(c, Call)]

    @property
    def bad_calls(self) -> list[BadCall]:
        return [c for c in self.calls if isinstance(c, BadCall)]

    def canonical_message(self) -> dict[str, Any]:
        """The chat-template assistant message: malformed calls are plain text, valid calls ``tool_calls``."""
        assert all(isinstance(c, BadCall) for c in self.calls[: len(self.bad_calls)]), (
            "script malformed calls before valid ones: the template renders content before tool_calls"
        )
        content = "\n".join([*([self.content] if self.content else []), *(c.text for c in self.bad_calls)])
        reasoning = self.reasoning_text()
        if reasoning is not None:
            content = f"<think>\n{reasoning}\n</think>\n\n" + content
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.valid_calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.valid_calls
            ]
        return message


def final(content: str, reasoning: str = "", reasoning_calls: Sequence[Call] = ()) -> ModelTurn:
    """A final answer in the form Qwen3's template renders the last assistant message (with a think block)."""
    return ModelTurn(content=content, reasoning=reasoning, reasoning_calls=reasoning_calls)


def canonical_conversation(
    user: str | Sequence[tuple[str, Sequence[ModelTurn]]],
    turns: Sequence[ModelTurn] = (),
    results: Sequence[Sequence[str]] = (),
    system: str | None = None,
) -> list[dict[str, Any]]:
    """The chat-template conversation of a script.

    ``results[k]`` are the tool outputs (as the tools returned them) of the k-th turn that has calls, in
    call order. ``user`` may be a list of ``(user_message, turns)`` for multi-invocation conversations;
    ``results`` then runs over all of them.
    """
    episodes = [(user, turns)] if isinstance(user, str) else list(user)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    pending = list(results)
    for user_message, episode_turns in episodes:
        messages.append({"role": "user", "content": user_message})
        for turn in episode_turns:
            messages.append(turn.canonical_message())
            if turn.calls:
                outputs = pending.pop(0)
                assert len(outputs) == len(turn.calls), "one result per call"
                messages += [{"role": "tool", "content": out} for out in outputs]
    assert not pending, "more results than turns with calls"
    return messages


def openai_tools(*tools: Any) -> list[dict[str, Any]]:
    """Strands ``@tool`` functions -> the OpenAI-style tool list chat templates take."""
    out = []
    for t in tools:
        spec = t.tool_spec
        out.append(
            {
                "type": "function",
                "function": {
                    "name": spec["name"],
                    "description": spec["description"],
                    "parameters": spec["inputSchema"]["json"],
                },
            }
        )
    return out


def render_canonical(
    tokenizer: Any, conversation: list[dict[str, Any]], tools: Sequence[Any] = (), **kwargs: Any
) -> str:
    return tokenizer.apply_chat_template(
        conversation,
        tools=openai_tools(*tools) or None,
        tokenize=False,
        add_generation_prompt=False,
        **kwargs,
    )


def assert_canonical(
    tokenizer: Any,
    tm: Any,
    conversation: list[dict[str, Any]],
    tools: Sequence[Any] = (),
    *,
    rewritten: Sequence[str] = (),
    **kwargs: Any,
) -> None:
    """``decode(trajectory)`` equals the template's full rendering of ``conversation``.

    The full rendering ends with ``<|im_end|>\\n`` where the trajectory ends on the model's ``<|im_end|>``;
    that separator is the only allowed difference, plus ``rewritten``: pieces of the trajectory the template
    drops when it re-renders history (each must be present and is removed once, in order, before comparing).
    """
    decoded = tokenizer.decode(tm.token_ids)
    expected = render_canonical(tokenizer, conversation, tools, **kwargs)
    assert decoded.endswith(END_OF_TURN), "the trajectory must end on the model's end-of-turn token"
    pos = 0
    for piece in rewritten:
        at = decoded.find(piece, pos)
        assert at >= 0, f"expected the template rewrite to drop {piece!r}, not found in the trajectory"
        decoded = decoded[:at] + decoded[at + len(piece) :]
        pos = at
    assert decoded + "\n" == expected, _diff(decoded + "\n", expected)


def _diff(got: str, expected: str) -> str:
    n = next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        min(len(got), len(expected)),
    )
    return (
        f"trajectory differs from the canonical rendering at char {n}:\n"
        f"trajectory: {got[max(0, n - 120) : n + 120]!r}\ncanonical:  {expected[max(0, n - 120) : n + 120]!r}"
    )


def tool_results(agent: Agent) -> list[list[dict[str, Any]]]:
    """The toolResult blocks of every tool-result message of the agent, per message, in order."""
    out = []
    for message in agent.messages:
        results = [b["toolResult"] for b in message.get("content", []) if "toolResult" in b]
        if results:
            out.append(results)
    return out


def result_texts(agent: Agent) -> list[list[str]]:
    return [
        ["\n".join(c.get("text", "") for c in r["content"]) for r in batch] for batch in tool_results(agent)
    ]


def make_agent(model: SGLangModel, tools: Sequence[Any] = (), **kwargs: Any) -> Agent:
    kwargs.setdefault("conversation_manager", NullConversationManager())
    return Agent(model=model, tools=list(tools), callback_handler=None, **kwargs)


def make_model(
    tokenizer: Any,
    server: SGLangTestServer,
    *,
    retry_delay: float = 0.01,
    max_retries: int = 5,
    **kwargs: Any,
) -> SGLangModel:
    kwargs.setdefault("params", {"max_new_tokens": 512})
    client = SGLangClient(server.base_url, retry_delay=retry_delay, max_retries=max_retries)
    return SGLangModel(tokenizer=tokenizer, client=client, **kwargs)


@contextmanager
def server_for(tokenizer: Any, *turns: Any, **kwargs: Any) -> Iterator[SGLangTestServer]:
    with SGLangTestServer(tokenizer, **kwargs) as server:
        server.script(*[t.text() if isinstance(t, ModelTurn) else t for t in turns])
        yield server


def check(model: SGLangModel, server: SGLangTestServer, **kwargs: Any) -> None:
    """Trajectory invariants 1-3 and 6 against the server's records."""
    assert_trajectory_invariants(model.token_manager, server, **kwargs)


def with_generation_prompt(tokenizer: Any, prefix: str) -> Any:
    """A copy of ``tokenizer`` whose template opens ``prefix`` (e.g. ``<think>\\n``) in the generation prompt,
    like the Qwen3 thinking-2507 templates."""
    from transformers import AutoTokenizer

    copy = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    head, sep, tail = tokenizer.chat_template.rpartition("{{- '<|im_start|>assistant\\n' }}")
    assert sep, "unexpected Qwen3 template layout"
    copy.chat_template = head + "{{- '<|im_start|>assistant\\n" + prefix.replace("\n", "\\n") + "' }}" + tail
    return copy


def verify_workers() -> set[int]:
    """The pids of this process's math-verify workers still alive (``slime_strands._verify_worker``)."""
    found = set()
    for process in psutil.Process().children(recursive=True):
        with suppress(psutil.Error):
            if (
                process.status() != psutil.STATUS_ZOMBIE
                and "slime_strands._verify_worker" in process.cmdline()
            ):
                found.add(process.pid)
    return found


__all__ = [
    "BAD_CALLS",
    "EMPTY_THINK",
    "BadCall",
    "Call",
    "ModelTurn",
    "assert_canonical",
    "call_text",
    "canonical_conversation",
    "check",
    "final",
    "make_agent",
    "make_model",
    "openai_tools",
    "render_canonical",
    "result_texts",
    "server_for",
    "tool_results",
    "verify_workers",
    "with_generation_prompt",
]
