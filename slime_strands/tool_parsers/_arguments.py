"""Argument decoding shared by the parsers: JSON objects, and bare values typed by the tool's JSON schema.

Formats that write every value as bare text (Qwen3-Coder's ``<parameter=k>``, GLM's ``<arg_value>``) follow
their chat templates: a string is written as is, anything else as JSON (GLM's ``tojson``) or Python's
``str()`` (Qwen3-Coder writes ``True`` for a boolean). The schema decides which; a value that does not fit
its declared type is an error the model is told about, never coerced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .base import ParseErrorKind, ToolCall, ToolCallError, ToolSchemas, clip

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


def load_json_object(raw: str, what: str, name: str | None = None) -> dict[str, Any] | ToolCallError:
    """``raw`` as a JSON object, else a ``bad_json`` / ``bad_arguments`` error naming ``what`` it was."""
    try:
        value: Any = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:
        return json_error(exc, what, raw, name)
    return json_object(value, what, raw, name)


def json_error(exc: Exception, what: str, raw: str, name: str | None = None) -> ToolCallError:
    """The ``bad_json`` error for JSON that did not decode (``RecursionError``: the policy can nest brackets
    deeper than the decoder recurses)."""
    if isinstance(exc, RecursionError):
        return ToolCallError("bad_json", f"{what} JSON is nested too deeply: {clip(raw)}", raw, name)
    return ToolCallError("bad_json", f"{what} is not valid JSON ({exc}): {clip(raw)}", raw, name)


def json_object(value: Any, what: str, raw: str, name: str | None = None) -> dict[str, Any] | ToolCallError:
    """``value`` when it is a JSON object, else the error saying what it is (``bad_arguments`` when it holds
    the arguments of a named call, ``bad_json`` when it should have been the whole call)."""
    if isinstance(value, dict):
        return value
    kind: ParseErrorKind = "bad_arguments" if name else "bad_json"
    return ToolCallError(
        kind, f"{what} must be a JSON object, got {type(value).__name__}: {clip(raw)}", raw, name
    )


def json_call(payload: dict[str, Any], raw: str, argument_keys: tuple[str, ...]) -> ToolCall | ToolCallError:
    """A call written as one JSON object: a non-empty ``name`` string and its arguments object under exactly
    one of ``argument_keys`` (Hermes: ``arguments``; Llama 3: ``parameters`` or ``arguments``)."""
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallError("missing_name", f'the tool call has no "name" string: {clip(raw)}', raw)
    present = [key for key in argument_keys if key in payload]
    if len(present) != 1:
        if len(argument_keys) == 1:
            problem = f'no "{argument_keys[0]}" object'
        else:
            quoted = " and ".join(f'"{key}"' for key in argument_keys)
            problem = f"{'both' if present else 'neither'} {quoted}"
        return ToolCallError("bad_arguments", f"the call to {name!r} has {problem}", raw, name)
    arguments = payload[present[0]]
    if not isinstance(arguments, dict):
        return ToolCallError(
            "bad_arguments",
            f'"{present[0]}" of the call to {name!r} must be a JSON object, got {type(arguments).__name__}',
            raw,
            name,
        )
    return ToolCall(name=name, input=arguments, raw=raw)


def add_argument(
    arguments: dict[str, Any], key: str, value: str, *, call: str, tools: ToolSchemas, noun: str
) -> ToolCallError | None:
    """Add the bare-text ``value`` of argument ``key`` of a call to ``call`` (typed by the tool's schema), or
    say why it cannot be added (an empty or repeated name, a value its schema rejects); ``raw`` is left for
    the caller to fill in. ``noun`` is what the format calls an argument (``parameter``, ``argument``)."""
    if not key or key in arguments:
        problem = "duplicate" if key else "empty"
        return ToolCallError("bad_arguments", f"{problem} {noun} name {key!r} in the call to {call!r}", "")
    try:
        arguments[key] = convert_value(value, parameter_schema(tools, call, key))
    except ValueError as exc:
        return ToolCallError("bad_arguments", f"argument {key!r} of the call to {call!r}: {exc}", "")
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


def convert_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """The value of a bare-text argument by its schema; raises ValueError saying why it does not fit.

    Without a single declared type a value that is JSON (a number, object, ...) is that value, else the text.
    """
    declared = _declared_type(schema)
    text = raw.strip()
    if declared == "string":
        return raw
    if (
        text in ("null", "None") and declared is not None
    ):  # JSON's null; Qwen3-Coder's template writes str(None)
        return None
    if declared == "integer":
        if not _INTEGER.fullmatch(text):
            raise ValueError(f"expected an integer, got {clip(raw)!r}")
        return int(text)
    if declared == "number":
        value = _json_or_none(text)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {clip(raw)!r}")
        return value
    if declared == "boolean":
        if text.lower() not in ("true", "false"):
            raise ValueError(f"expected true or false, got {clip(raw)!r}")
        return text.lower() == "true"
    if declared in ("object", "array"):
        value = _json_or_none(text)
        expected = dict if declared == "object" else list
        if not isinstance(value, expected):
            raise ValueError(f"expected a JSON {declared}, got {clip(raw)!r}")
        return value
    value = _json_or_none(text)
    return raw if value is None or isinstance(value, str) else value


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
