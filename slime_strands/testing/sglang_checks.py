"""SGLang 0.5.23's checks of a ``/generate`` request, with its own texts, for the stand-in server.

Read from SGLang 0.5.23's source, never from this package's client (whose mistakes the stand-in must catch):

- the HTTP API contract (``sglang/api/v1/api_types.py``, applied by ``generate_request`` before anything else):
  typed ``sampling_params`` whose unknown keys are refused, unknown top-level keys ignored; its 400 body is a
  plain string, ``{"error": "unknown field `foo`, expected one of ..."}``;
- the tokenizer manager's context checks, then the scheduler's (``{"error": {"message": ...}}``).

The sampling keys are the contract's own list (``_FIELDS_SamplingParams``: the API fields of
``sglang.srt.sampling.sampling_params.SamplingParams``, plus ``choice``), kept here on purpose apart from
production's ``slime_strands.provider.model.SGLANG_SAMPLING_KEYS``: a key production gets wrong is refused here, a key
production wrongly refuses is accepted here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..strict_reader import is_int, is_number

__all__ = ["SAMPLING_FIELDS", "context_error", "contract_error", "request_error", "sampling_value_error"]


class _ContractError(ValueError):
    """A contract violation; ``str()`` is serde's text, the 400 body's ``error``."""


def _unexpected(value: Any) -> str:
    """serde's ``Unexpected`` display of a JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return (
        "sequence" if isinstance(value, list) else "map" if isinstance(value, dict) else type(value).__name__
    )


def _expect(ok: Callable[[Any], bool], expected: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not ok(value):
            raise _ContractError(f"invalid type: {_unexpected(value)}, expected {expected}")

    return check


_int = _expect(is_int, "i64")
_float = _expect(is_number, "f64")
_str = _expect(lambda v: isinstance(v, str), "a string")
_bool = _expect(lambda v: isinstance(v, bool), "a boolean")
_sequence = _expect(lambda v: isinstance(v, list), "a sequence")
_map = _expect(lambda v: isinstance(v, dict), "a map")


def _each(check: Callable[[Any], None]) -> Callable[[Any], None]:
    def check_list(value: Any) -> None:
        _sequence(value)
        for item in value:
            check(item)

    return check_list


def _string_or_list(value: Any) -> None:
    if isinstance(value, list):
        _each(_str)(value)
    else:
        _expect(lambda v: isinstance(v, str), "a value or an array of values for StringOrList")(value)


def _int_or_list(value: Any) -> None:
    if isinstance(value, list):
        _each(_int)(value)
    else:
        _expect(is_int, "a value or an array of values for Int64OrList")(value)


def _float_map(value: Any) -> None:
    _map(value)
    for item in value.values():
        _float(item)


def _struct(name: str, fields: Mapping[str, Callable[[Any], None]]) -> Callable[[Any], None]:
    """A JSON object whose unknown keys are refused; a null field takes its default."""

    def check(value: Any) -> None:
        _expect(lambda v: isinstance(v, dict), f"struct {name}")(value)
        for key, item in value.items():
            if key not in fields:
                listed = ", ".join(f"`{f}`" for f in fields)
                raise _ContractError(f"unknown field `{key}`, expected one of {listed}")
            if item is not None:
                fields[key](item)

    return check


_WATERMARK = _struct("WatermarkRequestConfig", {"enabled": _bool, "key": _str, "context_window": _int})

SAMPLING_FIELDS: Mapping[str, Callable[[Any], None]] = {
    "max_new_tokens": _int, "stop": _string_or_list, "stop_token_ids": _each(_int), "stop_regex": _string_or_list,
    "temperature": _float, "top_p": _float, "top_k": _int, "min_p": _float, "frequency_penalty": _float,
    "presence_penalty": _float, "repetition_penalty": _float, "min_new_tokens": _int, "n": _int,
    "json_schema": _str, "regex": _str, "ebnf": _str, "structural_tag": _str, "ignore_eos": _bool,
    "skip_special_tokens": _bool, "spaces_between_special_tokens": _bool, "no_stop_trim": _bool,
    "stream_interval": _int, "logit_bias": _float_map, "sampling_seed": _int, "custom_params": lambda v: None,
    "beam_width": _int, "watermark": _WATERMARK, "choice": _each(_str),
}  # fmt: skip
"""SGLang 0.5.23's sampling keys, in the contract's order (its "unknown field" text lists them so), each with
the contract's type check."""

_sampling_params = _struct("SamplingParams", SAMPLING_FIELDS)

# The top-level keys the stand-in reads, with the contract's checks (every other key is ignored, as SGLang does).
_TOP_LEVEL: Mapping[str, Callable[[Any], None]] = {
    "sampling_params": _sampling_params,
    "logprob_start_len": _int_or_list,
    "routed_experts_start_len": _int,
}


def contract_error(body: Mapping[str, Any]) -> str | None:
    """The contract's 400 text for a ``/generate`` body, or None (keys checked in the body's order)."""
    try:
        for key, value in body.items():
            if key in _TOP_LEVEL and (value is not None or key == "routed_experts_start_len"):
                _TOP_LEVEL[key](value)
    except _ContractError as exc:
        return str(exc)
    return None


def context_error(n: int, max_new_tokens: int | None, window: int) -> str | None:
    """The tokenizer manager's context checks of an input of ``n`` tokens."""
    if n >= window:
        return f"The input ({n} tokens) is longer than the model's context length ({window} tokens)."
    if max_new_tokens is not None and n + max_new_tokens > window:
        return (
            f"Requested token count exceeds the model's maximum context length of {window} tokens. "
            f"You requested a total of {n + max_new_tokens} tokens: {n} tokens from the input messages and "
            f"{max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input messages "
            "or the completion to fit within the limit."
        )
    return None


_GRAMMARS = ("json_schema", "regex", "ebnf", "structural_tag")
_SAMPLING_EPS = 1e-6  # a lower temperature is greedy (top_k = 1)


def sampling_value_error(params: Mapping[str, Any], vocab_size: int) -> str | None:
    """``SamplingParams.verify``: the tokenizer manager refuses values out of range (after the context checks)."""
    value: dict[str, Any] = {key: params.get(key) for key in SAMPLING_FIELDS}
    defaults = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "top_k": -1, "frequency_penalty": 0.0,
                "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}  # fmt: skip
    value.update({key: default for key, default in defaults.items() if value[key] is None})
    temperature, top_k, min_new, max_new = (
        value["temperature"],
        value["top_k"],
        value["min_new_tokens"],
        value["max_new_tokens"],
    )
    problems = (
        (value["beam_width"] is not None and value["beam_width"] < 1, f"beam_width must be at least 1, got {value['beam_width']}."),
        (not math.isfinite(temperature) or temperature < 0.0, f"temperature must be a non-negative finite number, got {temperature}."),
        (not 0.0 < value["top_p"] <= 1.0, f"top_p must be in (0, 1], got {value['top_p']}."),
        (not 0.0 <= value["min_p"] <= 1.0, f"min_p must be in [0, 1], got {value['min_p']}."),
        (top_k < 1 and top_k != -1 and temperature >= _SAMPLING_EPS, f"top_k must be -1 (disable) or at least 1, got {top_k}."),
        (not -2.0 <= value["frequency_penalty"] <= 2.0, f"frequency_penalty must be in [-2, 2], got {value['frequency_penalty']}."),
        (not -2.0 <= value["presence_penalty"] <= 2.0, f"presence_penalty must be in [-2, 2], got {value['presence_penalty']}."),
        (not 0.0 < value["repetition_penalty"] <= 2.0, f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {value['repetition_penalty']}."),
        (min_new < 0, f"min_new_tokens must be in [0, max_new_tokens], got {min_new}."),
        (max_new is not None and max_new < 0, f"max_new_tokens must be at least 0, got {max_new}."),
        (max_new is not None and not min_new <= max_new, f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}."),
    )  # fmt: skip
    grammars = sum(bool(value[g]) for g in _GRAMMARS)
    return (
        next((text for bad, text in problems if bad), None)
        or _logit_bias_error(value["logit_bias"] or {}, vocab_size)
        or ("Only one of json_schema, regex, ebnf, or structural_tag can be set." if grammars > 1 else None)
    )


def _logit_bias_error(bias: Mapping[str, Any], vocab_size: int) -> str | None:
    for token in bias:
        try:
            in_vocab = 0 <= int(token) < vocab_size
        except ValueError:
            return f"invalid literal for int() with base 10: {token!r}"
        if not in_vocab:
            return f"logit_bias must has keys in [0, {vocab_size - 1}], got {token}."
    return None


def request_error(body: Mapping[str, Any], n: int, max_req_input_len: int) -> str | None:
    """The scheduler's checks when it receives a request of ``n`` input tokens, in its order."""
    if n >= max_req_input_len:
        return (
            f"Input length ({n} tokens) exceeds the maximum allowed length ({max_req_input_len} tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        )
    start = body.get("logprob_start_len")
    if body.get("return_logprob") and start is not None and start > n:
        return (
            f"req.logprob_start_len={start} is higher than the number of input tokens "
            f"len(req.origin_input_ids)={n}. Please use a smaller logprob_start_len."
        )
    if not body.get("return_routed_experts"):
        return None
    start = body.get("routed_experts_start_len", 0)
    if start < 0:
        return (
            f"recv_req.routed_experts_start_len={start} is lower than 0. "
            "Please use a non-negative routed_experts_start_len."
        )
    if start > n:
        return (
            f"recv_req.routed_experts_start_len={start} is higher than the number of input tokens "
            f"len(req.origin_input_ids)={n}. Please use a smaller routed_experts_start_len."
        )
    return None
