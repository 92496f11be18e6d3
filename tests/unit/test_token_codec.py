"""TokenCodec gives exactly transformers' ids and text, through Rust siblings of the tokenizer's backend.

Properties over random text (special-token strings, unicode, whitespace runs, long inputs that take the
GIL-releasing path) for the real Qwen3 tokenizer and every family's tokenizer (tests/family_kit.py).
"""

from __future__ import annotations

import pytest
from family_kit import FAMILIES, family_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime_strands.template.codec import GIL_RELEASE_CHARS, TokenCodec, _encode

TOKENIZERS = ["qwen3", *sorted(FAMILIES)]


def _tokenizer(name: str, qwen3):
    return qwen3 if name == "qwen3" else family_tokenizer(name)


@pytest.fixture(params=TOKENIZERS)
def tok(request, tokenizer):
    return _tokenizer(request.param, tokenizer)


_PIECES = st.sampled_from(
    [
        "<|im_end|>", "<|im_start|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|eot_id|>",
        "<|start_header_id|>", "<|observation|>", "[gMASK]", "<｜end▁of▁sentence｜>", "<｜tool▁sep｜>",
        "<|im_middle|>", "<|tool_call_begin|>", "<|im_end", "|>", "<", " ", "  ", "\n", "\n\n", "\t", "\r\n",
        " \n ", "   \n\n\t ", "é", "中文", "🙂", "\u200b", "\ufeff", "e\u0301", "ｆｕｌｌ", "'s", "'LL", "123456",
        "0.5", "def f(x):\n    return x", '{"a": [1, 2]}', "Hello", " world", "\\n",
    ]
)  # fmt: skip
TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=12)), max_size=24).map("".join)


def _special_ids(tok) -> list[int]:
    return sorted(tok.added_tokens_decoder)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT)
def test_encode_and_literal_encode_give_transformers_ids(tok, text):
    codec = TokenCodec.of(tok)
    assert codec.fast
    assert codec.encode(text) == tok.encode(text, add_special_tokens=False, split_special_tokens=False)
    assert codec.encode_literal(text) == tok.encode(text, add_special_tokens=False, split_special_tokens=True)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_decode_gives_transformers_text(tok, data):
    codec = TokenCodec.of(tok)
    vocabulary = len(tok)
    ids = data.draw(
        st.lists(
            st.one_of(st.integers(0, vocabulary - 1), st.sampled_from(_special_ids(tok))),
            max_size=40,
        )
    )
    assert codec.decode(ids) == tok.decode(ids, skip_special_tokens=False)
    assert codec.decode(tuple(ids)) == tok.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_long_inputs_take_the_gil_releasing_path_with_the_same_ids(name, tokenizer):
    tok = _tokenizer(name, tokenizer)
    codec = TokenCodec.of(tok)
    text = ("Tool output line é中 <|im_end|> <think>x</think>\n\n  " * (GIL_RELEASE_CHARS // 40 + 5))[:-3]
    assert len(text) > GIL_RELEASE_CHARS
    ids = tok.encode(text, add_special_tokens=False)
    assert codec.encode(text) == ids
    assert codec.encode_literal(text) == tok.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert len(ids) > GIL_RELEASE_CHARS // 4
    long_ids = (ids * (GIL_RELEASE_CHARS // len(ids) + 2))[: GIL_RELEASE_CHARS + 7]
    assert codec.decode(long_ids) == tok.decode(long_ids, skip_special_tokens=False)


class _WithoutFastBatch:
    """A Rust tokenizer as tokenizers < 0.21 has it: no ``encode_batch_fast``."""

    def __init__(self, rust) -> None:
        self.encode, self.encode_batch = rust.encode, rust.encode_batch


@pytest.mark.parametrize("name", TOKENIZERS)
def test_tokenizers_without_encode_batch_fast_give_the_same_ids(name, tokenizer):
    tok = _tokenizer(name, tokenizer)
    codec = TokenCodec.of(tok)
    if codec._plain is None:
        pytest.skip("no Rust sibling for this tokenizer: it encodes through transformers")
    short = "Tool output é中 <|im_end|> <think>x</think>\n\n  42 apples"
    for text in (short, short * (GIL_RELEASE_CHARS // len(short) + 2)):
        for rust in (codec._plain, codec._literal):
            assert _encode(_WithoutFastBatch(rust), text) == _encode(rust, text)
        assert _encode(codec._plain, text) == tok.encode(text, add_special_tokens=False)


def test_literal_encoding_does_not_depend_on_the_shared_backend_flag(tokenizer):
    """transformers' split_special_tokens flips encode_special_tokens on the ONE shared Rust tokenizer during
    a call; the codec's siblings never read it, so a concurrent literal encode elsewhere cannot change ids."""
    codec = TokenCodec.of(tokenizer)
    text = "a<|im_end|>b"
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = tokenizer.backend_tokenizer
    # transformers leaves the flag as its LAST call set it: True after a split_special_tokens=True call
    backend.encode_special_tokens = True
    try:
        assert im_end in codec.encode(text)
        assert im_end not in codec.encode_literal(text)
        backend.encode_special_tokens = False
        assert im_end not in codec.encode_literal(text)
        assert backend.encode_special_tokens is False, "the codec never sets the shared flag"
    finally:
        backend.encode_special_tokens = False


def test_one_codec_per_tokenizer_rebuilt_when_tokens_are_added(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    codec = TokenCodec.of(tok)
    assert TokenCodec.of(tok) is codec
    tok.add_special_tokens({"additional_special_tokens": ["<|codec_test|>"]})
    rebuilt = TokenCodec.of(tok)
    assert rebuilt is not codec and "<|codec_test|>" in rebuilt.special_tokens
    new_id = tok.convert_tokens_to_ids("<|codec_test|>")
    assert rebuilt.encode("x<|codec_test|>y") == tok.encode("x<|codec_test|>y", add_special_tokens=False)
    assert new_id in rebuilt.encode("x<|codec_test|>y")
    assert new_id not in rebuilt.encode_literal("x<|codec_test|>y")


def test_tokenizers_without_a_rust_backend_use_transformers():
    from transformers import ByT5Tokenizer  # a real pure-Python tokenizer (bytes; needs no files)

    tok = ByT5Tokenizer()
    codec = TokenCodec.of(tok)
    assert not codec.fast
    text = "a</s>b é"
    eos = tok.convert_tokens_to_ids("</s>")
    assert codec.encode(text) == tok.encode(text, add_special_tokens=False) and eos in codec.encode(text)
    assert codec.encode_literal(text) == tok.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert eos not in codec.encode_literal(text)
    assert codec.decode(codec.encode(text)) == text


def test_the_codec_cache_does_not_keep_its_tokenizers_alive(tokenizer):
    """The cache is keyed weakly by tokenizer; a codec holding its tokenizer strongly would pin every
    tokenizer a process ever built (each test's, each eval's: ~85 MB apiece)."""
    import copy
    import gc
    import weakref

    tok = copy.deepcopy(tokenizer)
    codec = TokenCodec.of(tok)
    assert codec.tokenizer is tok and codec.encode("a<|im_end|>") == tok.encode("a<|im_end|>")
    gone = weakref.ref(tok)
    del tok
    gc.collect()
    assert gone() is None
    with pytest.raises(ReferenceError, match="no longer exists"):
        _ = codec.tokenizer


# tiktoken (tiktoken_bpe.py): the byte-level BPE families encode their per-turn inputs through it; the property
# tests above compare every family's ids with transformers' whichever engine the codec picked.
_TIKTOKEN_FAMILIES = {
    name: FAMILIES[name].base != "deepseek" if name in FAMILIES else True for name in TOKENIZERS
}
"""DeepSeek's pre-tokenizer is a chain of regex splits: not tiktoken's one pattern."""


@pytest.mark.parametrize("name", TOKENIZERS)
def test_byte_level_bpe_families_encode_through_tiktoken(name, tokenizer):
    tok = _tokenizer(name, tokenizer)
    codec = TokenCodec.of(tok)
    assert codec.uses_tiktoken is _TIKTOKEN_FAMILIES[name]
    text = "Result: 42 é中 <|im_end|> <think>x</think>\n\n  "
    assert codec.encode(text) == tok.encode(text, add_special_tokens=False)


def test_inputs_above_the_size_bound_never_reach_tiktoken(tokenizer):
    """tiktoken's regex overflows its stack on ~1M characters of whitespace (a Rust panic): inputs above
    GIL_RELEASE_CHARS go to the tokenizers library, hostile ones included."""
    codec = TokenCodec.of(tokenizer)
    assert codec.uses_tiktoken
    hostile = " " * 1_000_000 + "x"
    assert codec.encode_literal(hostile) == tokenizer.encode(hostile, add_special_tokens=False)


class PanicException(BaseException):
    """What a Rust panic inside tiktoken raises (pyo3's PanicException is a BaseException of this name)."""


class _FailingBPE:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def encode(self, text: str, literal: bool) -> list[int]:
        raise self.error


@pytest.mark.parametrize("error", [PanicException("stack overflow"), RuntimeError("regex failed")])
def test_a_tiktoken_failure_falls_back_to_the_same_ids(tokenizer, error, caplog, monkeypatch):
    codec = TokenCodec.of(tokenizer)
    monkeypatch.setattr(codec, "_bpe", _FailingBPE(error))
    text = "a<|im_end|>b é 12"
    assert codec.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert codec.encode_literal(text) == tokenizer.encode(
        text, add_special_tokens=False, split_special_tokens=True
    )
    assert "tiktoken failed" in caplog.text


def test_a_cancellation_inside_tiktoken_is_not_swallowed(tokenizer, monkeypatch):
    codec = TokenCodec.of(tokenizer)
    monkeypatch.setattr(codec, "_bpe", _FailingBPE(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        codec.encode("x")


def test_tiktoken_is_refused_when_its_ids_differ_or_the_shape_is_not_reproducible(tokenizer):
    import copy

    from tokenizers import AddedToken

    from slime_strands.template.tiktoken_bpe import TiktokenBPE

    backend = tokenizer.backend_tokenizer
    codec = TokenCodec.of(tokenizer)
    assert TiktokenBPE.build(backend, codec._encode_with_siblings) is not None
    assert TiktokenBPE.build(backend, lambda text, literal: [0]) is None  # disagrees with the reference
    stripping = copy.deepcopy(tokenizer)
    stripping.add_tokens([AddedToken("<strip>", lstrip=True)])  # lstrip eats the whitespace before it
    assert not TokenCodec.of(stripping).uses_tiktoken
    text = "a  <strip> b"
    assert TokenCodec.of(stripping).encode(text) == stripping.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("literal", [False, True])
def test_text_the_tokenizer_refuses_is_refused_the_same_way(tokenizer, literal):
    """A lone surrogate (json.loads gives one for "\\ud800"): transformers refuses the text; tiktoken's own
    Encoding would replace it with U+FFFD and encode something else."""
    codec = TokenCodec.of(tokenizer)
    assert codec.uses_tiktoken
    text = "tool output a\ud800b"
    with pytest.raises(Exception) as expected:
        tokenizer.encode(text, add_special_tokens=False, split_special_tokens=literal)
    with pytest.raises(type(expected.value)):
        (codec.encode_literal if literal else codec.encode)(text)


def test_tokenizers_of_one_vocabulary_share_one_tiktoken_encoder(tokenizer):
    """~35 MB and ~0.5 s per vocabulary, not per tokenizer object: copies, and tokenizers that add tokens."""
    import copy

    first, second = copy.deepcopy(tokenizer), copy.deepcopy(tokenizer)
    second.add_special_tokens({"additional_special_tokens": ["<|shared_test|>"]})
    one, two = TokenCodec.of(first), TokenCodec.of(second)
    assert one._bpe is not None and two._bpe is not None
    assert one._bpe._core is two._bpe._core
    text = "x<|shared_test|>y <|im_end|>"
    assert two.encode(text) == second.encode(text, add_special_tokens=False)
    assert one.encode(text) == first.encode(text, add_special_tokens=False)
