"""The one cache policy for what is found per tokenizer: values kept per tokenizer OBJECT, forgotten with it.

Rendering facts, the detected tool parser and the token codec cost milliseconds to find and every episode's
model asks for them, so they are found once per tokenizer. Keys are the tokenizer objects themselves, held
weakly (an ``id()`` would be reused by the next tokenizer once this one is collected, and a strong key would
keep every tokenizer ever loaded alive: ~85 MB each for Qwen3); a value must not hold its tokenizer strongly
for the same reason. Under each tokenizer a few values are kept by a sub-key (the template, its variables,
a signature of the vocabulary), the most recently used first. A tokenizer that cannot be weakly referenced or
hashed is not cached: its values are found again each time. One lock per cache; a value is built under it,
so it is built once.

(``TiktokenBPE``'s encoders are kept per vocabulary CONTENT instead, a different question: two tokenizer
objects loaded from one checkpoint share one encoder; see ``tiktoken_bpe.py``.)
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["PerTokenizer"]

V = TypeVar("V")

_KEYS_PER_TOKENIZER = 8
"""Sub-keys kept per tokenizer (templates x thinking modes in use; a vocabulary changed by added tokens)."""


class PerTokenizer(Generic[V]):
    """Values of type ``V`` per tokenizer object and sub-key (see the module docstring)."""

    def __init__(self) -> None:
        self._values: weakref.WeakKeyDictionary[Any, OrderedDict[Hashable, V]] = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()  # re-entrant: building one value may ask this cache for another

    def get(self, tokenizer: Any, key: Hashable, build: Callable[[], V]) -> V:
        """The value of ``tokenizer`` under ``key``, built by ``build()`` the first time."""
        try:
            held = self._values.get(tokenizer)
        except TypeError:  # not weakly referenceable, or not hashable: no cache
            return build()
        if held is not None:
            with self._lock:
                if key in held:
                    held.move_to_end(key)
                    return held[key]
        with self._lock:
            held = self._values.setdefault(tokenizer, OrderedDict())
            if key not in held:
                held[key] = build()
                while len(held) > _KEYS_PER_TOKENIZER:
                    held.popitem(last=False)
            return held[key]
