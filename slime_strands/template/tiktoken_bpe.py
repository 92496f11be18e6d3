"""TiktokenBPE: a byte-level BPE tokenizer's exact ids from tiktoken's encoder, ~5x faster per tool output.

Every agent turn encodes the new messages: a tool output of a few hundred words. The tokenizers library
spends ~0.25 ms on 300 words of that (it tracks alignments through every stage, even with offsets
off); tiktoken, OpenAI's byte-level BPE, spends ~0.05 ms on the same text and gives the same ids when the
tokenizer is a byte-level BPE whose merge order is its vocabulary order (Qwen2/3, Llama 3 and others
converted from tiktoken vocabularies). At 512 agents that was most of SGLangModel's own work per turn
(``benchmarks/bench_client.py``, docs/performance.md, "Client cost at scale").

Built only for the shape it reproduces, read from the tokenizer's own serialisation: a BPE model without
dropout, byte fallback or word affixes; an NFC (or no) normalizer; one regex ``Split`` (isolated) followed by
a ``ByteLevel`` step that adds no prefix space and runs no regex of its own; every merge producing a token
whose id is no smaller than the last merge's (the merge order is the vocabulary order); added tokens without
``lstrip`` / ``rstrip`` / ``single_word``. Added tokens are split out as the tokenizers library does
(leftmost-longest, raw text first, then the normalized text for ``normalized`` tokens; a literal encode leaves
special tokens' text as text). A tokenizer of another shape, or one whose ids differ from the reference on the
check texts, gets ``None``: the caller keeps the tokenizers library. One encoder is built per vocabulary and
split regex (~0.5 s, ~35 MB) and shared by the tokenizers that have them. ``tests/unit/test_token_codec.py``
checks the ids against transformers' over random text for every family's tokenizer.

tiktoken's regex engine backtracks on the ``\\s+(?!\\S)`` lookahead and overflows its stack (a Rust panic)
somewhere between 400k and 1M characters of whitespace, so the caller uses it only below a size bound
(``codec.GIL_RELEASE_CHARS``) and falls back to the reference if it ever fails.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

__all__ = ["TiktokenBPE"]

logger = logging.getLogger(__name__)

_MAX_CORES = 4
"""tiktoken encoders kept for the process (one per vocabulary a process uses: one in a rollout)."""

Reference = Callable[[str, bool], list[int]]
"""The ids to reproduce: ``reference(text, literal)``."""

_CHECK_TEXTS = (
    "Hello world! It's 12:30, isn't it? We'll see... 3.14159 and 1234567890.",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\n\tindented\r\n  \n  trailing   ",
    "Zürich, São Paulo, naïve café, Ελληνικά, русский, עברית, العربية, हिन्दी, ไทย, 中文字符, 日本語のカナ, 한국어",
    "e\u0301 A\u030a \u212b \ufb01 \uff26\uff55\uff4c\uff4c \u00a0nbsp\u3000ideographic\u2028line\u2029para\x85nel\x0b\x0c",
    "emoji 🙂👍🏽🏳️‍🌈 zero\u200bwidth \ufeffbom 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0001f9ea\U0010ffff",
    "'s 'S 'll 'LL 've 're 'd 'm 't don't I'M  ''' \"\"\" `code` ~!@#$%^&*()_+-=[]{}|;:,.<>/?\\",
    "        \n\n\n\n        \t\t\t    x\n \n \n" + " " * 70 + "y" + "\n" * 20,
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 1111111111111111111111 !!!!!!!!!!!!!!!!!!!!!!",
)


class _Core:
    """tiktoken's Rust encoder of one vocabulary and split regex (~35 MB, ~0.5 s to build), shared by every
    tokenizer that has them: reloads and copies of a tokenizer, and tokenizers that only add tokens to it."""

    def __init__(self, core: Any) -> None:
        self.encode_ordinary = core.encode_ordinary


class TiktokenBPE:
    """``encode(text, literal)``: the ids of the tokenizer it was built from (see the module docstring)."""

    _cores: ClassVar[dict[tuple[bytes, str], _Core]] = {}
    """By (vocabulary digest, regex), kept for the process (a tokenizer loaded again, as every command and
    eval run does, finds its encoder built), the :data:`_MAX_CORES` most recent: per vocabulary CONTENT on
    purpose, unlike the per-object caches of ``_per_tokenizer.py`` (equal vocabularies share one encoder)."""
    _refused: ClassVar[set[tuple[bytes, str]]] = set()
    """Vocabularies tiktoken cannot reproduce: not parsed again."""

    def __init__(
        self,
        core: _Core,
        tokens: dict[str, tuple[int, bool]],
        raw_tokens: re.Pattern[str] | None,
        normalized_tokens: re.Pattern[str] | None,
        nfc: bool,
    ) -> None:
        self._core = core
        self._tokens = tokens  # content -> (id, special)
        self._raw_tokens = raw_tokens
        self._normalized_tokens = normalized_tokens
        self._nfc = nfc

    @classmethod
    def build(cls, backend: Any, reference: Reference) -> TiktokenBPE | None:
        """The encoder for ``backend`` (a ``tokenizers.Tokenizer``), or None when its shape is not
        reproducible, tiktoken is not installed, or its ids differ from ``reference`` on the check texts."""
        try:
            shape = _shape(backend)
            if shape is None:
                return None
            pattern, nfc, added = shape
            core = cls._shared_core(backend.model, pattern)
        except (TypeError, ValueError, KeyError, AttributeError):
            return None
        if core is None:
            return None
        tokens = {token.content: (token_id, bool(token.special)) for token_id, token in added.items()}
        encoder = cls(
            core,
            tokens,
            _alternation(t.content for t in added.values() if not t.normalized),
            _alternation(t.content for t in added.values() if t.normalized),
            nfc,
        )
        specials = " ".join(tokens)
        for text in (*_CHECK_TEXTS, f"{specials} x{specials}y\n{_CHECK_TEXTS[0]}{specials}"):
            for literal in (False, True):
                if encoder.encode(text, literal) != reference(text, literal):
                    logger.debug("tiktoken's ids differ from the tokenizer's on %r: not used", text[:40])
                    return None
        return encoder

    @classmethod
    def _shared_core(cls, model: Any, pattern: str) -> _Core | None:
        """The shared encoder of a BPE ``model`` (a ``tokenizers`` model) and split regex, or None."""
        state = model.__getstate__()  # the vocabulary and merges as JSON (~5 MB for Qwen3), read once
        key = (hashlib.blake2b(state, digest_size=16).digest(), pattern)
        core = cls._cores.get(key)
        if core is not None or key in cls._refused:
            return core
        core = _build_core(json.loads(state), pattern)
        if core is None:
            cls._refused.add(key)
            return None
        while len(cls._cores) >= _MAX_CORES:
            del cls._cores[next(iter(cls._cores))]
        cls._cores[key] = core
        return core

    def encode(self, text: str, literal: bool) -> list[int]:
        """Ids of ``text``: added tokens' text becomes their ids (special ones only when not ``literal``)."""
        return self._encode_around(self._raw_tokens, text, literal, self._encode_normalized)

    def _encode_normalized(self, text: str, literal: bool) -> list[int]:
        if self._nfc and not text.isascii():
            text = unicodedata.normalize("NFC", text)
        return self._encode_around(self._normalized_tokens, text, literal, self._encode_ordinary)

    def _encode_ordinary(self, text: str, literal: bool) -> list[int]:
        ids: list[int] = self._core.encode_ordinary(text)
        return ids

    def _encode_around(
        self,
        tokens: re.Pattern[str] | None,
        text: str,
        literal: bool,
        encode_piece: Callable[[str, bool], list[int]],
    ) -> list[int]:
        """The ids of the added ``tokens`` in ``text`` and ``encode_piece``'s of the text between them (a
        special token skipped by a literal encode stays in its text, as in the tokenizers library)."""
        if tokens is None:
            return encode_piece(text, literal)
        ids: list[int] = []
        start = 0
        for match in tokens.finditer(text):
            token_id, special = self._tokens[match.group()]
            if literal and special:
                continue
            if match.start() > start:
                ids += encode_piece(text[start : match.start()], literal)
            ids.append(token_id)
            start = match.end()
        if start < len(text):
            ids += encode_piece(text[start:], literal)
        return ids


def _shape(backend: Any) -> tuple[str, bool, dict[int, Any]] | None:
    """(split regex, NFC?, added tokens by id) of a tokenizer whose pipeline tiktoken reproduces, or None."""
    normalizer = json.loads(backend.normalizer.__getstate__()) if backend.normalizer is not None else None
    if normalizer is not None and normalizer != {"type": "NFC"}:
        return None
    pre_tokenizer = backend.pre_tokenizer
    pattern = _split_pattern(json.loads(pre_tokenizer.__getstate__()) if pre_tokenizer is not None else None)
    added = backend.get_added_tokens_decoder()
    if pattern is None or any(t.lstrip or t.rstrip or t.single_word for t in added.values()):
        return None
    return pattern, normalizer is not None, added


def _build_core(model: dict[str, Any], pattern: str) -> _Core | None:
    """tiktoken's encoder of a byte-level BPE ``model`` (its JSON) whose merge order is its vocabulary order."""
    try:
        import tiktoken
    except ImportError:
        return None
    if model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback"):
        return None
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    to_byte = {char: byte for byte, char in _byte_level_alphabet().items()}
    vocab: dict[str, int] = model["vocab"]
    try:
        ranks = {bytes(to_byte[char] for char in token): token_id for token, token_id in vocab.items()}
    except KeyError:  # a character outside the byte-level alphabet
        return None
    if len(ranks) != len(vocab) or any(bytes([b]) not in ranks for b in range(256)):
        return None
    last = -1
    for merge in model["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        merged = vocab.get(left + right)
        if merged is None or merged < last:  # several merges may make one token (every split of it)
            return None
        last = merged
    try:
        encoding = tiktoken.Encoding(
            "slime-strands", pat_str=pattern, mergeable_ranks=ranks, special_tokens={}
        )
    except Exception as error:  # tiktoken refuses the pattern or the ranks
        logger.debug("tiktoken cannot build this tokenizer's encoder: %s", error)
        return None
    # The Rust encoder itself, without the Encoding around it: that keeps a Python copy of the vocabulary
    # (~20 MB) and replaces lone surrogates with U+FFFD, where the tokenizers library refuses the text.
    core = getattr(encoding, "_core_bpe", None)
    if core is None or not callable(getattr(core, "encode_ordinary", None)):
        return None
    return _Core(core)


def _split_pattern(pre_tokenizer: Any) -> str | None:
    """The regex of a ``Sequence[Split(regex, isolated), ByteLevel(no prefix space, no regex)]``."""
    if not isinstance(pre_tokenizer, dict) or pre_tokenizer.get("type") != "Sequence":
        return None
    steps = pre_tokenizer.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    regex = (split.get("pattern") or {}).get("Regex") if split.get("type") == "Split" else None
    if regex is None or split.get("behavior") != "Isolated" or split.get("invert"):
        return None
    if (
        byte_level.get("type") != "ByteLevel"
        or byte_level.get("add_prefix_space")
        or byte_level.get("use_regex")
    ):
        return None
    return str(regex)


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for chars from 256 up."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    alphabet = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in alphabet:
            alphabet[byte] = chr(256 + extra)
            extra += 1
    return alphabet


def _alternation(contents: Iterable[str]) -> re.Pattern[str] | None:
    """A regex matching any of ``contents``, leftmost-longest (longest first), or None for none."""
    ordered = sorted({c for c in contents if c}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None
