"""Reading saved plain data back strictly: typed fields, nothing missing, nothing unknown left unread.

What the plugin saves and reads back (a partial-rollout checkpoint on a Sample, an episode record in
``sample.metadata``, a row of the trajectory file) is plain JSON data that crossed a process, a Ray hop or a
disk. A value of the wrong type there is a writer bug or data of another version: it is refused whole, with one
line naming the field, never half read. :class:`StrictReader` is that check for one mapping; the owners of the
formats say which fields they have.

:func:`is_int` and :func:`is_number` are the checks JSON values need because ``bool`` is an ``int`` in Python
(``True`` is no token count).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, NoReturn, TypeGuard, TypeVar

__all__ = ["StrictReader", "is_int", "is_number"]

E = TypeVar("E", bound=enum.Enum)


def is_int(value: Any) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any, *, finite: bool = False) -> TypeGuard[int | float]:
    """An ``int`` or ``float`` that is not a ``bool`` (and, with ``finite``, neither NaN nor infinite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not finite or math.isfinite(value)


class StrictReader:
    """Typed, strict access to one saved mapping: each key read once, :meth:`done` refusing unknown ones.

    ``where`` names the mapping in messages (``checkpoint.tools``); ``error`` is the exception raised (the
    format's own, a ``ValueError``). Messages name the field: ``checkpoint.tools.tool_iters must be an integer,
    got True``."""

    def __init__(self, data: Any, where: str, error: type[ValueError] = ValueError) -> None:
        self.error = error
        self.where = where
        if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
            self.fail(f"{where} must be an object, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data
        self._read: set[str] = set()

    def fail(self, message: str) -> NoReturn:
        raise self.error(message)

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str) -> Any:
        """The raw value of ``key`` (it must be there)."""
        if key not in self.data:
            self.fail(f"{self.where}: {key!r} missing")
        self._read.add(key)
        return self.data[key]

    def optional(self, key: str, default: Any = None) -> Any:
        """The raw value of ``key``, or ``default`` when it is absent (a field older writers left out)."""
        if key not in self.data:
            return default
        return self.get(key)

    def _refuse(self, key: str, what: str, value: Any) -> NoReturn:
        self.fail(f"{self.where}.{key} must be {what}, got {value!r:.80}")

    def integer(self, key: str, *, negative: bool = True) -> int:
        """An integer (``negative`` false: 0 or more)."""
        value = self.get(key)
        if not is_int(value):
            self._refuse(key, "an integer", value)
        if not negative and value < 0:
            self.fail(f"{self.where}.{key} must not be negative, got {value!r}")
        return int(value)

    def optional_integer(self, key: str, *, negative: bool = True) -> int | None:
        return None if self.get(key) is None else self.integer(key, negative=negative)

    def number(self, key: str) -> float:
        """An integer or a float, not NaN (a time, a reward)."""
        value = self.get(key)
        if not is_number(value) or value != value:
            self._refuse(key, "a number", value)
        return float(value)

    def text(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            self._refuse(key, "a string", value)
        return value

    def optional_text(self, key: str) -> str | None:
        return None if self.get(key) is None else self.text(key)

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            self._refuse(key, "a boolean", value)
        return value

    def optional_flag(self, key: str) -> bool | None:
        return None if self.get(key) is None else self.flag(key)

    def items(self, key: str) -> list[Any]:
        value = self.get(key)
        if not isinstance(value, (list, tuple)):
            self._refuse(key, "a list", value)
        return list(value)

    def mapping(self, key: str) -> dict[str, Any]:
        """A mapping with string keys, copied."""
        return dict(self.sub(key).data)

    def counts(self, key: str) -> dict[str, int]:
        """A mapping of names to integers (counters by kind)."""
        value = self.mapping(key)
        if not all(is_int(v) for v in value.values()):
            self._refuse(key, "a mapping of counts", value)
        return value

    def choice(self, key: str, kind: type[E]) -> E:
        """A member of the enum ``kind``, saved as its value."""
        value = self.get(key)
        try:
            return kind(value)
        except (ValueError, TypeError):
            self.fail(f"{self.where}: unknown {key} {value!r:.80}")

    def optional_choice(self, key: str, kind: type[E]) -> E | None:
        return None if self.get(key) is None else self.choice(key, kind)

    def sub(self, key: str) -> StrictReader:
        """A reader of the mapping under ``key``."""
        return StrictReader(self.get(key), f"{self.where}.{key}", self.error)

    def unread(self) -> list[str]:
        """The keys not read yet, sorted."""
        return sorted(set(self.data) - self._read)

    def done(self) -> None:
        """Refuse every key that was not read."""
        unknown = self.unread()
        if unknown:
            self.fail(f"{self.where}: unknown key(s) {unknown}")

    def scalars(
        self,
        record: type[Any],
        *,
        defaults: bool = False,
        negative: bool = True,
        skip: Collection[str] = (),
    ) -> dict[str, Any]:
        """The fields of the dataclass ``record`` whose annotation is a plain scalar (``int``, ``float``,
        ``str``, ``bool`` or one of them ``| None``), read by type, but for those in ``skip`` (not saved); the
        caller reads the others. ``defaults``: a field that is absent and has a default is left to it (else it
        is missing); ``negative`` false: integers are 0 or more."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(record):
            read = _SCALARS.get(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))
            if read is None or f.name in skip:
                continue
            optional = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if defaults and optional and not self.has(f.name):
                continue
            integer = read in (StrictReader.integer, StrictReader.optional_integer)
            values[f.name] = read(self, f.name, negative=negative) if integer else read(self, f.name)
        return values


_SCALARS: dict[str, Callable[..., Any]] = {
    "int": StrictReader.integer,
    "int | None": StrictReader.optional_integer,
    "float": StrictReader.number,
    "str": StrictReader.text,
    "str | None": StrictReader.optional_text,
    "bool": StrictReader.flag,
    "bool | None": StrictReader.optional_flag,
}
"""How a field is read, by its annotation (the modules that declare records use ``from __future__ import
annotations``: annotations are these strings)."""
