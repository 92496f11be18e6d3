"""TokenCodec: exact token ids for the per-turn path, straight from a fast tokenizer's Rust ``Tokenizer``.

Every turn encodes the new messages (a tool output of a few hundred words) and decodes the model's answer.
transformers' Python wrapper around the Rust tokenizer (``tokenizer.encode`` / ``decode``) validates its
arguments, resets truncation and padding, builds a ``BatchEncoding`` and copies the ids again: ~15% of an
encode and half of a decode of that size. This codec calls the Rust tokenizer directly, with exactly the
ids transformers gives (``tests/unit/test_token_codec.py`` checks it property by property for every family's
tokenizer).

It never touches the tokenizer's own Rust object: it calls two SIBLINGS of it that share its model,
normalizer, pre-tokenizer and decoder (no copy: built in microseconds) and carry its added tokens:

* ``plain``: special-token text is recognised (template markup), ``encode_special_tokens`` off, no
  truncation or padding (transformers sets those on the shared object per call; a concurrent call elsewhere
  cannot change what this codec returns);
* ``literal``: ``encode_special_tokens`` on, for untrusted bodies (tool output): text such as ``<|im_end|>``
  becomes ordinary tokens. transformers' ``split_special_tokens=True`` flips that flag on the ONE shared Rust
  object for the duration of a call, a race with every concurrent encode in the tokenizer pool; a sibling of
  its own has the flag set once, forever.

Byte-level BPE tokenizers (Qwen2/3 and Llama 3 among those tested) encode inputs up to
:data:`GIL_RELEASE_CHARS` through tiktoken (``template/tiktoken_bpe.py``: the same ids, ~5x faster), checked against
the siblings when the codec is built. The siblings encode everything else through ``encode_batch_fast`` (no
character offsets, which nothing here reads) where the tokenizers library has it. Otherwise, and for
decoding, inputs above :data:`GIL_RELEASE_CHARS` go through ``encode_batch`` / ``decode_batch``, which release
the GIL while Rust works (``encode`` holds it: 0.7 s for a 1 MB tool output, a stall for every other agent
when it runs in a worker thread). Slow (pure Python) tokenizers, and fast ones whose siblings do not
reproduce their added-token ids, use transformers' own calls.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ._per_tokenizer import PerTokenizer
from .tiktoken_bpe import TiktokenBPE

__all__ = ["GIL_RELEASE_CHARS", "TokenCodec"]

logger = logging.getLogger(__name__)

GIL_RELEASE_CHARS = 16_384
"""Inputs longer than this (characters, or ids to decode) go through the Rust calls that release the GIL."""
_CHECK_TEXT = "Codec check: <{}> 12 345 ,;\n\n  end"


class TokenCodec:
    """Exact ``encode`` / ``encode_literal`` / ``decode`` for one transformers tokenizer (see the module doc).

    Get it with :meth:`of`: one codec per tokenizer object, rebuilt when tokens are added to it."""

    def __init__(self, tokenizer: Any) -> None:
        # Held weakly: the codec is kept per tokenizer object (``_per_tokenizer.py``), and a value that
        # referenced its key would keep every tokenizer ever used alive (~85 MB each for Qwen3).
        self._tokenizer = _reference(tokenizer)
        self._signature = _signature(tokenizer)
        self._plain: Any = None
        self._literal: Any = None
        self._bpe: TiktokenBPE | None = None
        siblings = _siblings(tokenizer)
        if siblings is not None:
            self._plain, self._literal = siblings
            self._bpe = TiktokenBPE.build(tokenizer.backend_tokenizer, self._encode_with_siblings)
        self._decode_in_python = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        self.special_tokens = _special_tokens(tokenizer)
        """Every special / added token's text, longest first."""

    @classmethod
    def of(cls, tokenizer: Any) -> TokenCodec:
        """The codec of ``tokenizer`` (built on first use; again after tokens were added to it)."""
        return _CODECS.get(tokenizer, _signature(tokenizer), lambda: cls(tokenizer))

    @property
    def tokenizer(self) -> Any:
        """The transformers tokenizer this codec encodes for (used directly where the siblings are not)."""
        tokenizer = self._tokenizer()
        if tokenizer is None:
            raise ReferenceError("the tokenizer of this TokenCodec no longer exists")
        return tokenizer

    @property
    def fast(self) -> bool:
        """True when the Rust siblings are used (False: transformers' own calls)."""
        return self._plain is not None

    @property
    def uses_tiktoken(self) -> bool:
        """True when inputs up to :data:`GIL_RELEASE_CHARS` are encoded by tiktoken (``template/tiktoken_bpe.py``)."""
        return self._bpe is not None

    def encode(self, text: str) -> list[int]:
        """Token ids of templated text: special-token text is recognised, no special token is added."""
        return self._encode(text, literal=False)

    def encode_literal(self, text: str) -> list[int]:
        """Token ids of untrusted text: special-token text is split into ordinary tokens."""
        return self._encode(text, literal=True)

    def _encode(self, text: str, literal: bool) -> list[int]:
        if self._bpe is not None and len(text) <= GIL_RELEASE_CHARS:
            try:
                return self._bpe.encode(text, literal)
            except UnicodeEncodeError:  # lone surrogates: the tokenizers library raises its own error below
                pass
            # A Rust panic in tiktoken arrives as pyo3's PanicException, a BaseException.
            except BaseException as error:
                if not isinstance(error, Exception) and type(error).__name__ != "PanicException":
                    raise
                logger.warning(
                    "tiktoken failed on a %d-character input (%r): using tokenizers", len(text), error
                )
        if self._plain is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=literal))
        return self._encode_with_siblings(text, literal)

    def _encode_with_siblings(self, text: str, literal: bool) -> list[int]:
        return _encode(self._literal if literal else self._plain, text)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens kept (what transformers' ``decode`` gives)."""
        if self._plain is None or self._decode_in_python:
            return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        if len(ids) > GIL_RELEASE_CHARS:
            return str(self._plain.decode_batch([ids], skip_special_tokens=False)[0])
        return str(self._plain.decode(ids, skip_special_tokens=False))


def _encode(rust: Any, text: str) -> list[int]:
    # encode_batch_fast (tokenizers >= 0.21) skips the character offsets nobody here reads: the same ids for
    # ~25% less CPU at a tool output's size, and it releases the GIL at every size.
    fast = getattr(rust, "encode_batch_fast", None)
    if fast is not None:
        ids: list[int] = fast([text], add_special_tokens=False)[0].ids
    elif len(text) > GIL_RELEASE_CHARS:
        ids = rust.encode_batch([text], add_special_tokens=False)[0].ids
    else:
        ids = rust.encode(text, add_special_tokens=False).ids
    return ids


def _reference(tokenizer: Any) -> Callable[[], Any]:
    """A weak reference to ``tokenizer``, or a strong one when it cannot be weakly referenced."""
    try:
        return weakref.ref(tokenizer)
    except TypeError:
        return lambda: tokenizer


def _signature(tokenizer: Any) -> tuple[int, int]:
    """Changes when the tokenizer's Rust object is replaced or tokens are added to it (its length)."""
    return id(getattr(tokenizer, "backend_tokenizer", None)), len(tokenizer)


def _siblings(tokenizer: Any) -> tuple[Any, Any] | None:
    """Two Rust tokenizers sharing the tokenizer's model and pipeline (plain, literal), or None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - a fast tokenizer needs the tokenizers package
        return None
    if not isinstance(backend, Tokenizer):
        return None
    added = backend.get_added_tokens_decoder()
    siblings = []
    for split_special in (False, True):
        sibling = Tokenizer(backend.model)
        sibling.normalizer = backend.normalizer
        sibling.pre_tokenizer = backend.pre_tokenizer
        sibling.post_processor = backend.post_processor
        sibling.decoder = backend.decoder
        for token_id in sorted(added):
            sibling.add_tokens([added[token_id]])
        sibling.encode_special_tokens = split_special
        siblings.append(sibling)
    plain, literal = siblings
    if not _reproduces(tokenizer, plain, literal, added):
        logger.warning(
            "tokenizer %r: its Rust tokenizer cannot be shared exactly; using transformers' encode/decode",
            getattr(tokenizer, "name_or_path", tokenizer),
        )
        return None
    return plain, literal


def _reproduces(tokenizer: Any, plain: Any, literal: Any, added: dict[int, Any]) -> bool:
    """The siblings give transformers' ids for every added token and for a text holding them all."""
    if any(plain.token_to_id(token.content) != token_id for token_id, token in added.items()):
        return False
    text = _CHECK_TEXT.format(" ".join(token.content for token in added.values()))
    expected = list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=False))
    expected_literal = list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    return (
        plain.encode(text, add_special_tokens=False).ids == expected
        and literal.encode(text, add_special_tokens=False).ids == expected_literal
        and plain.decode(expected, skip_special_tokens=False)
        == tokenizer.decode(expected, skip_special_tokens=False)
    )


def _special_tokens(tokenizer: Any) -> list[str]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    tokens = {t.content for t in added.values() if getattr(t, "special", False)}
    tokens |= set(getattr(tokenizer, "all_special_tokens", []))
    tokens |= set(getattr(tokenizer, "get_added_vocab", dict)().keys())
    return sorted((t for t in tokens if t), key=len, reverse=True)


_CODECS: PerTokenizer[TokenCodec] = PerTokenizer()
"""Codecs per tokenizer object, by vocabulary signature (a tokenizer given new tokens gets a new codec)."""
