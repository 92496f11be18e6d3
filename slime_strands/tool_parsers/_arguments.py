"""Argument decoding shared by the parsers: JSON objects, and bare values typed by the tool's JSON schema.

Formats that write every value as bare text (Qwen3-Coder's ``<parameter=k>``, GLM's ``<arg_value>``) follow
their chat templates: a string is written as is, anything else as JSON (GLM's ``tojson``) or, with
``python_literals``, also as Python's ``str()`` (Qwen3-Coder's template applies Jinja's ``string`` filter:
``{'a': 1, 'b': [1, 2]}``, ``[1, 'x']``, ``True``, ``None``). Python literals are read with
:func:`ast.literal_eval` (literals only, never code) and kept only when they are JSON values. The schema decides
which type a value is; a value that does not fit its declared type is an error the model is told about, never
coerced.

Null: ``null`` (and ``None`` with ``python_literals``) is None only where the schema allows null: a type list
holding ``"null"``, an ``anyOf`` / ``oneOf`` option of type null, ``nullable: true``, a ``default`` of null
(Strands writes ``x: str | None = None`` as ``{"type": "string", "default": null}``), or no type at all.
Elsewhere it is text for a string parameter (the template writes the string "None" and None alike; the
schema says which was meant) and an error for any other type.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

from ..strict_reader import is_number
from .base import MalformedCall, ParseErrorKind, ToolCall, ToolSchemas, clip

__all__ = [
    "add_argument",
    "convert_value",
    "json_call",
    "json_error",
    "json_object",
    "load_json_object",
    "parameter_schema",
]

_INTEGER = re.compile(r"[+-]?\d+")


def load_json_object(raw: str, what: str, name: str | None = None) -> dict[str, Any] | MalformedCall:
    """``raw`` as a JSON object, else a ``bad_json`` / ``bad_arguments`` error naming ``what`` it was."""
    try:
        value: Any = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:
        return json_error(exc, what, raw, name)
    return json_object(value, what, raw, name)


def json_error(exc: Exception, what: str, raw: str, name: str | None = None) -> MalformedCall:
    """The ``bad_json`` error for JSON that did not decode (``RecursionError``: the policy can nest brackets
    deeper than the decoder recurses)."""
    if isinstance(exc, RecursionError):
        return MalformedCall("bad_json", f"{what} JSON is nested too deeply: {clip(raw)}", raw, name)
    return MalformedCall("bad_json", f"{what} is not valid JSON ({exc}): {clip(raw)}", raw, name)


def json_object(value: Any, what: str, raw: str, name: str | None = None) -> dict[str, Any] | MalformedCall:
    """``value`` when it is a JSON object, else the error saying what it is (``bad_arguments`` when it holds
    the arguments of a named call, ``bad_json`` when it should have been the whole call)."""
    if isinstance(value, dict):
        return value
    kind: ParseErrorKind = "bad_arguments" if name else "bad_json"
    return MalformedCall(
        kind, f"{what} must be a JSON object, got {type(value).__name__}: {clip(raw)}", raw, name
    )


def json_call(payload: dict[str, Any], raw: str, argument_keys: tuple[str, ...]) -> ToolCall | MalformedCall:
    """A call written as one JSON object: a non-empty ``name`` string and its arguments object under exactly
    one of ``argument_keys`` (Hermes: ``arguments``; Llama 3: ``parameters`` or ``arguments``)."""
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        return MalformedCall("missing_name", f'the tool call has no "name" string: {clip(raw)}', raw)
    present = [key for key in argument_keys if key in payload]
    if len(present) != 1:
        if len(argument_keys) == 1:
            problem = f'no "{argument_keys[0]}" object'
        else:
            quoted = " and ".join(f'"{key}"' for key in argument_keys)
            problem = f"{'both' if present else 'neither'} {quoted}"
        return MalformedCall("bad_arguments", f"the call to {name!r} has {problem}", raw, name)
    arguments = payload[present[0]]
    if not isinstance(arguments, dict):
        return MalformedCall(
            "bad_arguments",
            f'"{present[0]}" of the call to {name!r} must be a JSON object, got {type(arguments).__name__}',
            raw,
            name,
        )
    return ToolCall(name=name, input=arguments, raw=raw)


def add_argument(
    arguments: dict[str, Any],
    key: str,
    value: str,
    *,
    call: str,
    tools: ToolSchemas,
    noun: str,
    python_literals: bool = False,
) -> MalformedCall | None:
    """Add the bare-text ``value`` of argument ``key`` of a call to ``call`` (typed by the tool's schema), or
    say why it cannot be added (an empty or repeated name, a value its schema rejects); ``raw`` is left for
    the caller to fill in. ``noun`` is what the format calls an argument (``parameter``, ``argument``);
    ``python_literals``: the format's template may write values as Python's ``str()`` (see the module doc)."""
    if not key or key in arguments:
        problem = "duplicate" if key else "empty"
        return MalformedCall("bad_arguments", f"{problem} {noun} name {key!r} in the call to {call!r}", "")
    try:
        arguments[key] = convert_value(
            value, parameter_schema(tools, call, key), python_literals=python_literals
        )
    except ValueError as exc:
        return MalformedCall("bad_arguments", f"argument {key!r} of the call to {call!r}: {exc}", "")
    return None


def parameter_schema(tools: ToolSchemas, tool: str, key: str) -> Mapping[str, Any] | None:
    """The JSON schema of parameter ``key`` of ``tool``, when the tool declares it."""
    properties = (tools.get(tool) or {}).get("properties")
    schema = properties.get(key) if isinstance(properties, Mapping) else None
    return schema if isinstance(schema, Mapping) else None


def _declared_type(schema: Mapping[str, Any] | None) -> str | None:
    """The one type a schema declares (``["integer", "null"]`` -> integer), or None if it is not one type."""
    if schema is None:
        return None
    declared = schema.get("type")
    if isinstance(declared, list):
        non_null = [t for t in declared if t != "null"]
        declared = non_null[0] if len(non_null) == 1 else None
    if isinstance(declared, str):
        return declared
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list):
        types = {_declared_type(o) for o in options if isinstance(o, Mapping)} - {"null"}
        return types.pop() if len(types) == 1 else None
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return "string"
    return None


def convert_value(raw: str, schema: Mapping[str, Any] | None, *, python_literals: bool = False) -> Any:
    """The value of a bare-text argument by its schema; raises ValueError saying why it does not fit.

    Without a single declared type a value that is JSON (a number, object, ...) is that value, else (with
    ``python_literals``) a Python literal of a JSON value, else the text.
    """
    declared = _declared_type(schema)
    text = raw.strip()
    if text in (_NULLS_PYTHON if python_literals else _NULLS) and _allows_null(schema):
        return None
    if declared == "string":
        return raw
    if declared == "integer":
        if not _INTEGER.fullmatch(text):
            raise ValueError(f"expected an integer, got {clip(raw)!r}")
        return int(text)
    if declared == "number":
        value = _json_value(text)
        if not is_number(value):
            raise ValueError(f"expected a number, got {clip(raw)!r}")
        return value
    if declared == "boolean":
        if text.lower() not in ("true", "false"):
            raise ValueError(f"expected true or false, got {clip(raw)!r}")
        return text.lower() == "true"
    if declared in ("object", "array"):
        value = _structured_value(text, python_literals)
        if not isinstance(value, dict if declared == "object" else list):
            written = "JSON or a Python literal" if python_literals else "JSON"
            raise ValueError(f"expected an {declared} ({written}), got {clip(raw)!r}")
        return value
    value = _structured_value(text, python_literals)
    if value is _NOTHING or value is None or isinstance(value, str):
        return raw  # null was handled above: here the schema does not allow it
    return value


_NULLS = ("null",)
_NULLS_PYTHON = ("null", "None")
_NOTHING: Any = object()
"""What a text that is not a JSON (or Python) literal decodes to."""


def _allows_null(schema: Mapping[str, Any] | None) -> bool:
    """Whether the schema lets a value be null (see the module doc); True without a schema or a type."""
    if schema is None or not any(key in schema for key in ("type", "anyOf", "oneOf", "enum", "const")):
        return True
    declared = schema.get("type")
    if declared == "null" or (isinstance(declared, list) and "null" in declared):
        return True
    if schema.get("nullable") is True or ("default" in schema and schema["default"] is None):
        return True
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list) and any(isinstance(o, Mapping) and _allows_null(o) for o in options):
        return True
    enum = schema.get("enum")
    return isinstance(enum, list) and None in enum


def _structured_value(text: str, python_literals: bool) -> Any:
    """``text`` as a JSON value, else (``python_literals``) as a Python literal of one, else ``_NOTHING``."""
    value = _json_value(text)
    if value is _NOTHING and python_literals:
        value = _python_literal(text)
    return value


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return _NOTHING


def _python_literal(text: str) -> Any:
    """``text`` read by :func:`ast.literal_eval` (it builds literals and never runs code), when it is a JSON
    value (dicts with string keys, lists, strings, numbers, booleans, None); ``_NOTHING`` otherwise. Deep
    nesting and digit strings too long for ``int`` raise inside ``literal_eval`` and count as not a literal."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOTHING
    return value if _json_compatible(value) else _NOTHING


def _json_compatible(value: Any) -> bool:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                return False
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif not (item is None or isinstance(item, (str, int, float))):
            return False  # tuples, sets, bytes, complex numbers: not what a template writes for JSON
    return True
