"""Every verdict of the template probe is true: for each template the family kit ships (every family's and
every variant's, ``family_kit.VARIANTS``), what ``check-template`` says against what an episode with that
template actually sends.

A refused template: building the model raises the verdict's reason. A usable one: an episode (a call, its
result, an answer, a follow-up question, an answer) runs, and at every generated turn the trajectory so far is
the template's rendering of the conversation with that turn (it is the last message), except where the verdict
says the template renders a prompt differently once later messages follow, and inside the model's own tokens
(never re-rendered; templates drop reasoning from them). A generation prompt no rendering with the turn holds,
or a rewrite the verdict does not name, fails.
"""

from __future__ import annotations

import difflib
from typing import Any

import pytest
from family_kit import (
    FAMILIES,
    TEMPLATES,
    VARIANTS,
    Call,
    Family,
    Turn,
    family_tokenizer,
    server_turns,
    stop_tokens,
    variant_tokenizer,
)
from helpers import make_agent, make_model, openai_tools
from strands import tool

from slime_strands import SGLangModel
from slime_strands.cli.checks import TemplateReport, check_template
from slime_strands.errors import ConfigurationError
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_trajectory_invariants

pytestmark = pytest.mark.timeout(180)

SHIPPED = [*(f"family:{name}" for name in FAMILIES), *(f"variant:{name}" for name in VARIANTS)]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _shipped(which: str) -> tuple[Family, Any, bool | None, str | None]:
    kind, name = which.split(":")
    if kind == "family":
        family = FAMILIES[name]
        return family, family_tokenizer(name), None, family.refused
    variant = VARIANTS[name]
    return FAMILIES[variant.family], variant_tokenizer(name), variant.enable_thinking, variant.refused


def test_every_template_file_of_the_kit_is_a_family_or_a_variant():
    from real_sglang.tiny_vl_model import TEMPLATE_FILES  # the vision-language templates (tests/vlm_kit.py)

    used = {f.template for f in FAMILIES.values() if f.template} | {v.template for v in VARIANTS.values()}
    files = {p.name for p in TEMPLATES.glob("*.jinja")}
    assert files - used - set(TEMPLATE_FILES.values()) == set(), (
        "a template of the kit no verdict test renders"
    )


@pytest.mark.parametrize("which", SHIPPED)
async def test_the_verdict_is_what_an_episode_sends(which):
    family, tok, enable_thinking, refused = _shipped(which)
    report = check_template(tok, enable_thinking)
    assert report.usable is (refused is None), report.lines()
    if not report.usable:
        assert refused is not None and refused in str(report.reason), report.lines()
        with pytest.raises(ConfigurationError) as info:
            SGLangModel(tokenizer=tok, base_url="http://127.0.0.1:9", enable_thinking=enable_thinking)
        assert str(report.reason) in str(info.value), "building the model refuses it for the verdict's reason"
        return
    first = [family.call_turn(Call("add", {"a": 2, "b": 3})), family.answer("It is 5.")]
    second = [family.answer("Now 6.")]
    with SGLangTestServer(tok, end_of_turn=stop_tokens(family)) as server:
        server.script(*server_turns(family, tok, [*first, *second]))
        model = make_model(tok, server, enable_thinking=enable_thinking)
        agent = make_agent(model, [add])
        await agent.invoke_async("What is 2+3?")
        await agent.invoke_async("Add one more.")
        assert_trajectory_invariants(model.token_manager, server)
    assert model.tool_parser.name == family.name and not model.parse_errors
    episodes = [("What is 2+3?", first), ("Add one more.", second)]
    for k, conversation in enumerate(_conversations(family, episodes)):
        _assert_sent_is_rendered(tok, model, report, k, conversation, enable_thinking)


def _conversations(family: Family, episodes: list[tuple[str, list[Turn]]]) -> list[list[dict[str, Any]]]:
    """The conversation as the template takes it, up to each assistant turn (the last message)."""
    messages: list[dict[str, Any]] = []
    out, index = [], 0
    for user, turns in episodes:
        messages.append({"role": "user", "content": user})
        for turn in turns:
            messages.append(family.canonical_message(turn, index))
            out.append(list(messages))
            if turn.calls:
                messages += [
                    {"role": "tool", "content": "5", "tool_call_id": f"functions.{c.name}:{index + i}"}
                    for i, c in enumerate(turn.valid_calls)
                ]
            index += len(turn.valid_calls)
    return out


def _assert_sent_is_rendered(
    tok: Any,
    model: SGLangModel,
    report: TemplateReport,
    k: int,
    conversation: list[dict[str, Any]],
    enable_thinking: bool | None,
) -> None:
    """The trajectory through generated turn ``k`` against the template's rendering of the conversation that
    ends with that turn: each difference lies in the model's own tokens or is a rewrite the verdict names."""
    spans = model.token_manager.spans
    generated = [n for n, s in enumerate(spans) if s.kind == "generated"]
    ends, ids = [], []
    for span in spans[: generated[k] + 1]:
        ids += list(span.token_ids)
        ends.append(len(tok.decode(ids)))
    sent = tok.decode(ids)
    own = [(ends[n - 1] if n else 0, ends[n]) for n in range(len(ends)) if spans[n].kind == "generated"]
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    rendered = tok.apply_chat_template(
        conversation, tools=openai_tools(add), tokenize=False, add_generation_prompt=False, **kwargs
    )
    matcher = difflib.SequenceMatcher(None, sent, rendered, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or i1 == len(sent):
            continue  # what the template writes after the turn's end
        shown = [n for n in range(i1, max(i2, i1 + 1)) if not _inside(own, n)]
        if not shown or _named(report, sent, rendered, (shown[0], shown[-1] + 1), j1 - i1):
            continue
        raise AssertionError(
            f"turn {k}: the trajectory has {sent[max(0, i1 - 60) : i2 + 20]!r} where the template renders "
            f"{rendered[max(0, j1 - 60) : j2 + 20]!r}, and the verdict does not say so:\n"
            + "\n".join(report.lines())
        )


def _inside(ranges: list[tuple[int, int]], at: int) -> bool:
    return any(start <= at < end for start, end in ranges)


def _named(report: TemplateReport, sent: str, rendered: str, span: tuple[int, int], shift: int) -> bool:
    """Whether the prompt text ``sent[span]`` that ``rendered`` (``shift`` characters on) has otherwise lies in one
    of the verdict's rewrites, as the model was shown it, with the rendering holding its later form there."""
    start, end = span
    for shown, later in getattr(report, "rewrites", ()):  # (a report that names none says so)
        for p in range(max(0, start - len(shown)), start + 1):
            if p + len(shown) >= end and sent.startswith(shown, p) and rendered.startswith(later, p + shift):
                return True
    return False
