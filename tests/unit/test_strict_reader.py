"""StrictReader: saved plain data read back typed, whole or not at all, with one line naming the field."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import pytest

from slime_strands.strict_reader import StrictReader, is_int, is_number


class Malformed(ValueError):
    pass


class Colour(enum.Enum):
    RED = "red"


@dataclass(frozen=True)
class Saved:
    count: int
    seconds: float
    name: str
    done: bool
    note: str | None = None
    limit: int | None = None
    extra: list[int] | None = None  # not a scalar: the caller reads it


def reader(data, where="saved"):
    return StrictReader(data, where, Malformed)


def test_a_bool_is_no_int_and_nan_no_number():
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_number(3) and is_number(2.5) and not is_number(False) and not is_number("1")
    assert (
        is_number(math.nan) and not is_number(math.nan, finite=True) and not is_number(math.inf, finite=True)
    )


def test_scalars_are_read_by_their_annotation():
    data = {"count": 2, "seconds": 1, "name": "n", "done": False, "note": None, "limit": 4, "extra": [1]}
    d = reader(data)
    values = d.scalars(Saved)
    assert values == {"count": 2, "seconds": 1.0, "name": "n", "done": False, "note": None, "limit": 4}
    assert isinstance(values["seconds"], float)
    assert d.unread() == ["extra"]
    assert d.items("extra") == [1]
    d.done()


def test_defaults_leave_absent_fields_to_the_record():
    assert reader({"count": 1, "seconds": 0.5, "name": "n", "done": True}).scalars(Saved, defaults=True) == {
        "count": 1,
        "seconds": 0.5,
        "name": "n",
        "done": True,
    }
    with pytest.raises(Malformed, match="saved: 'note' missing"):
        reader({"count": 1, "seconds": 0.5, "name": "n", "done": True}).scalars(Saved)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"count": True}, "saved.count must be an integer, got True"),
        ({"count": -1}, "saved.count must not be negative, got -1"),
        ({"count": 1, "seconds": math.nan}, "saved.seconds must be a number, got nan"),
        ({"count": 1, "seconds": "1"}, "saved.seconds must be a number, got '1'"),
        ({"count": 1, "seconds": 1, "name": 3}, "saved.name must be a string, got 3"),
        ({"count": 1, "seconds": 1, "name": "n", "done": 0}, "saved.done must be a boolean, got 0"),
    ],
)
def test_a_wrong_type_is_named_with_its_field(data, message):
    with pytest.raises(Malformed) as raised:
        reader(data).scalars(Saved, negative=False)
    assert str(raised.value) == message


@pytest.mark.parametrize("value", [0, 1, 7])
def test_zero_and_up_are_not_negative(value):
    """The boundary of ``negative=False`` is below 0: a zero count (nothing happened yet) reads back."""
    data = {"count": value, "seconds": 0, "name": "n", "done": True, "limit": value}
    assert reader(data).scalars(Saved, defaults=True, negative=False)["count"] == value
    assert reader(data).integer("count", negative=False) == value
    assert reader(data).optional_integer("limit", negative=False) == value


@pytest.mark.parametrize("value", [-1, -5])
def test_below_zero_is_refused_by_each_integer_reader(value):
    for read in (
        lambda d: d.integer("count", negative=False),
        lambda d: d.optional_integer("count", negative=False),
        lambda d: d.scalars(Saved, defaults=True, negative=False),
    ):
        with pytest.raises(Malformed) as raised:
            read(reader({"count": value, "seconds": 0, "name": "n", "done": True}))
        assert str(raised.value) == f"saved.count must not be negative, got {value}"
    assert reader({"count": value}).integer("count") == value, "negative=True (the default) reads it"


def test_unknown_keys_are_refused_only_when_done():
    d = reader({"a": 1, "z": 2, "b": 3})
    assert d.integer("a") == 1
    with pytest.raises(Malformed, match=r"saved: unknown key\(s\) \['b', 'z'\]"):
        d.done()


def test_nested_mappings_lists_counts_and_choices():
    d = reader({"sub": {"k": "v"}, "counts": {"bad_json": 2}, "colour": "red", "none": None, "list": (1, 2)})
    assert d.sub("sub").text("k") == "v"
    assert d.counts("counts") == {"bad_json": 2}
    assert d.choice("colour", Colour) is Colour.RED and d.optional_choice("none", Colour) is None
    assert d.items("list") == [1, 2] and d.optional("absent", 7) == 7
    d.done()


@pytest.mark.parametrize(
    ("value", "read", "message"),
    [
        ({"k": True}, lambda d: d.counts("x"), "saved.x must be a mapping of counts"),
        ("blue", lambda d: d.choice("x", Colour), "saved: unknown x 'blue'"),
        ({1: 2}, lambda d: d.sub("x"), "saved.x must be an object, got dict"),
        ("no list", lambda d: d.items("x"), "saved.x must be a list, got 'no list'"),
    ],
)
def test_nested_values_are_checked_too(value, read, message):
    with pytest.raises(Malformed) as raised:
        read(reader({"x": value}))
    assert str(raised.value).startswith(message)


def test_what_is_not_a_mapping_is_refused_up_front():
    with pytest.raises(Malformed, match="row must be an object, got list"):
        reader([1], "row")
