"""The cached continuation (template pieces found once per shape, bodies substituted per turn) gives exactly
the text and ids of rendering it with jinja, for every family's template; templates that alter bodies fall
back to jinja for that shape."""

from __future__ import annotations

import copy

import pytest
from family_kit import SUPPORTED, family_tokenizer
from helpers import TEMPLATE_TOOLS as TOOLS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime_strands.template.render import ChatRenderer

# Shapes whose template alters the bodies: Llama 3.2's template JSON-encodes tool results and trims user turns.
JINJA_ONLY = {"llama3": {"tool", "user"}}


def _jinja(renderer: ChatRenderer, new, system, tools, after):
    """The continuation rendered with jinja every time (what encode_continuation did before the cache)."""
    text = renderer.render_continuation(new, system=system, tools=tools)
    ids = renderer._encode_bodies_literally(new, text, system, tools)
    if after is not None and ids and ids[0] == after:
        lead = renderer.decode(ids[:1])
        if text.startswith(lead):
            return text[len(lead) :], ids[1:]
    return text, ids


def _cached_shapes(renderer: ChatRenderer) -> list[bool]:
    """For every shape rendered so far: True when it is served from cached pieces, False for jinja."""
    return [pieces is not None for pieces in renderer._continuations._pieces.values()]


def _body(tok):
    specials = sorted(tok.added_tokens_decoder.values(), key=lambda t: t.content)
    piece = st.sampled_from(
        [t.content for t in specials[:40]]
        + [
            "",
            " ",
            "  ",
            "\n",
            "\n\n",
            "\t",
            " \n ",
            "é中🙂",
            "{{ x }}",
            "{% if %}",
            '"q"',
            "\\",
            "<",
            "&amp;",
        ]
    )
    return st.lists(st.one_of(piece, st.text(max_size=8)), max_size=10).map("".join)


@st.composite
def _conversation(draw, tok):
    body = _body(tok)
    ids = st.sampled_from([None, "", "call_0a1b", "functions.add:0", "functions.add:1"])
    tools = [
        {"role": "tool", "content": draw(body), **({} if (i := draw(ids)) is None else {"tool_call_id": i})}
        for _ in range(draw(st.integers(0, 3)))
    ]
    user = [{"role": "user", "content": draw(body)}] if draw(st.booleans()) or not tools else []
    return tools + user


@pytest.mark.parametrize("name", SUPPORTED)
def test_cached_continuation_equals_jinja_for_every_family(name):
    tok = family_tokenizer(name)
    renderer = ChatRenderer(tok)
    stops = [*renderer.stop_token_ids, None]

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        new=_conversation(tok),
        system=st.sampled_from([None, "Sys."]),
        with_tools=st.booleans(),
        data=st.data(),
    )
    def check(new, system, with_tools, data):
        tools = TOOLS if with_tools else None
        after = data.draw(st.sampled_from(stops))
        expected = _jinja(renderer, new, system, tools, after)
        assert renderer.encode_continuation(new, system=system, tools=tools, after=after) == expected
        # again, from the cache (the first call may have found the shape)
        assert renderer.encode_continuation(new, system=system, tools=tools, after=after) == expected

    check()
    cached = _cached_shapes(renderer)
    if name not in JINJA_ONLY:
        assert cached and all(cached), "every shape of this template is served from its cached pieces"


@pytest.mark.parametrize("name", SUPPORTED)
def test_the_cache_serves_tool_results_and_follow_ups(name):
    renderer = ChatRenderer(family_tokenizer(name))
    renderer._continuations._pieces.clear()  # shapes are shared by every renderer of this template
    for new in (
        [{"role": "tool", "content": "first result", "tool_call_id": "functions.add:0"}],
        [{"role": "user", "content": "A follow-up?"}],
    ):
        for body in ("one", "two <|im_end|> three"):
            changed = [{**m, "content": f"{m['content']} {body}"} for m in new]
            assert renderer.encode_continuation(changed, tools=TOOLS) == _jinja(
                renderer, changed, None, TOOLS, None
            )
    expected = [role not in JINJA_ONLY.get(name, set()) for role in ("tool", "user")]
    assert _cached_shapes(renderer) == expected


@pytest.fixture
def altered(tokenizer):
    """Qwen3's template with its tool-result body rendered through a filter."""

    def make(expression: str):
        tok = copy.deepcopy(tokenizer)
        original = "{{- message.content }}\n        {{- '\\n</tool_response>' }}"
        assert original in tok.chat_template
        tok.chat_template = tok.chat_template.replace(
            original, "{{- " + expression + " }}\n        {{- '\\n</tool_response>' }}"
        )
        return tok

    return make


@pytest.mark.parametrize(
    "expression",
    [
        "message.content | trim",
        "message.content | e",
        "message.content | tojson",
        "message.content[:500]",
        "message.content | replace('\\n', ' ')",
        "message.content if message.content | length < 500 else '(dropped)'",
        "message.content ~ message.content",
    ],
    ids=["strip", "escape", "json", "truncate", "rewrite", "drop", "twice"],
)
def test_templates_that_alter_bodies_are_rendered_with_jinja(altered, expression):
    renderer = ChatRenderer(altered(expression), probe=False)
    for body in ('  padded <b>&"x" \n', "plain", "x<|im_end|>y " * 3):
        new = [{"role": "tool", "content": body}, {"role": "user", "content": "next?"}]
        assert renderer.encode_continuation(new) == _jinja(renderer, new, None, None, None)
    assert _cached_shapes(renderer) == [False]


def test_a_shape_is_rendered_once(tokenizer):
    """After a shape's first use the template is not run again for it (bodies, ids and values change)."""
    tok = copy.deepcopy(tokenizer)
    renderer = ChatRenderer(tok)
    renders = 0
    apply = tok.apply_chat_template

    def counting(*args, **kwargs):
        nonlocal renders
        renders += 1
        return apply(*args, **kwargs)

    tok.apply_chat_template = counting
    for i in range(5):
        new = [{"role": "tool", "content": f"result {i}\n" * (i + 1), "tool_call_id": f"call_{i}"}]
        renderer.encode_continuation(new, system="Sys.", tools=TOOLS)
    assert renders == 3, "one real rendering and two placeholder renderings, once"
