"""One cache policy for what is found per tokenizer (issue 25): the chat template's facts, the detected tool
parser and the token codec are kept per tokenizer OBJECT, weakly, and forgotten with it. Before, the
renderer's facts were kept by ``id(tokenizer)`` in a dict that never shrank (every tokenizer a process built,
and an id reused by the next one), the parser detection by weak key, the codec by weak key with its own lock."""

from __future__ import annotations

import copy
import gc
import weakref

from slime_strands.template import codec, probe, render
from slime_strands.template._per_tokenizer import PerTokenizer
from slime_strands.template.probe import detect_tool_parser
from slime_strands.template.render import ChatRenderer


def _held(cache: PerTokenizer) -> int:
    return len(cache._values)


def test_the_caches_keep_nothing_of_a_tokenizer_once_it_is_gone(tokenizer):
    caches = (render._TEMPLATES, probe._PARSERS, codec._CODECS)
    # Earlier tests' tokenizers may be unreachable but not yet collected (they hold reference cycles): collect
    # them first, and keep the collector from running on its own while the entries are counted.
    gc.collect()
    gc.disable()
    try:
        before = [_held(c) for c in caches]
        tok = copy.deepcopy(tokenizer)
        renderer = ChatRenderer(tok, enable_thinking=False)
        assert detect_tool_parser(renderer)[0] == "hermes"
        assert [_held(c) for c in caches] == [n + 1 for n in before], "one entry each, for this tokenizer"
        again = ChatRenderer(tok, enable_thinking=False)
        assert again.facts is renderer.facts, "found once per tokenizer, template and variables"
        gone = weakref.ref(tok)
        del tok, renderer, again
        gc.collect()
        assert gone() is None, "no cache keeps its tokenizer alive"
        assert [_held(c) for c in caches] == before
    finally:
        gc.enable()


def test_values_are_per_sub_key_and_built_once():
    class Tokenizer:  # hashable and weakly referenceable, like transformers' tokenizers
        pass

    cache: PerTokenizer[list[str]] = PerTokenizer()
    tok, built = Tokenizer(), []

    def build(value: str) -> list[str]:
        built.append(value)
        return [value]

    first = cache.get(tok, "a", lambda: build("a"))
    assert cache.get(tok, "a", lambda: build("again")) is first and built == ["a"]
    assert cache.get(tok, "b", lambda: build("b")) == ["b"] and built == ["a", "b"]
    for n in range(20):  # a bounded number of sub-keys per tokenizer, the most recent kept
        cache.get(tok, n, lambda n=n: build(str(n)))
    assert cache.get(tok, 19, lambda: build("rebuilt")) == ["19"] and "rebuilt" not in built
    assert cache.get(tok, "a", lambda: build("a2")) == ["a2"]


def test_a_tokenizer_that_cannot_be_weakly_referenced_is_never_cached():
    cache: PerTokenizer[object] = PerTokenizer()
    unhashable = {"not": "a tokenizer"}  # a dict: neither hashable nor weakly referenceable
    assert cache.get(unhashable, "k", object) is not cache.get(unhashable, "k", object)
    assert _held(cache) == 0
