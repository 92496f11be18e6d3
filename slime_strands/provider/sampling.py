"""SGLang's sampling params: the keys its ``/generate`` accepts, and how an episode's params are merged.

An episode's sampling params come from three places, merged by :func:`merge_sampling_params`:

1. what the caller passes: slime's ``sampling_params`` (its ``--rollout-*`` / eval flags), or
   ``slime-strands eval``'s ``--temperature`` / ``--top-p`` / ``--max-response-len``;
2. the plugin settings' ``strands.sampling_params`` (:class:`SamplingParams`), which win over (1) key by key;
3. ``slime-strands eval --sampling-param KEY=JSON``, folded into (2) before the run (a flag wins over the
   config file).

Two keys are not simply overridden. ``max_new_tokens`` from (2)/(3) caps each turn (the smaller value wins):
the whole-trajectory response budget stays the caller's (slime's ``max_new_tokens``), and the model clamps
every turn to what the context window and that budget leave. In training, ``temperature`` and ``top_p`` must
agree with slime's: its trainer divides logits by ``--rollout-temperature`` and replays top-p from
``--rollout-top-p``, so a rollout sampled otherwise would be trained off-policy without a word
(:data:`TRAINER_OWNED_KEYS`). Keys SGLang does not know are refused at once, naming the key
(:class:`SamplingParamError`, a configuration error): SGLang would refuse every request with them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..errors import ConfigurationError
from ..strict_reader import is_int, is_number
from .sampling_ranges import range_problems

__all__ = [
    "SGLANG_SAMPLING_KEYS",
    "SGLANG_SAMPLING_VERSIONS",
    "TRAINER_OWNED_KEYS",
    "SamplingParamError",
    "SamplingParams",
    "check_sampling_keys",
    "checked_params",
    "merge_sampling_params",
    "turn_params",
]

SGLANG_SAMPLING_VERSIONS = "0.5.15 to 0.5.23"
"""The SGLang releases :data:`SGLANG_SAMPLING_KEYS` was read from (slime's image pins 0.5.15 with patches)."""

SGLANG_SAMPLING_KEYS = frozenset(
    {
        # in every release from 0.5.15 to 0.5.23
        "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
        "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
        "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
        "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params",
        "beam_width",  # since 0.5.19
        "watermark",  # since 0.5.22
    }
)  # fmt: skip
"""The request fields of SGLang's ``SamplingParams`` (``sglang.srt.sampling.sampling_params``), the union over
SGLang 0.5.15 to 0.5.23 (every release in between read from its PyPI wheel). Not included: the fields that
class fills itself (``stop_strs``, ``stop_regex_strs``, ``stop_str_max_len``, ``stop_regex_max_len``,
``is_normalized``, ``ebnf_full_assistant``; 0.5.18+ refuses them at the HTTP layer), and ``choice``, which
0.5.23's HTTP layer lists but its ``SamplingParams`` does not have.

A union rather than one set per version: the client cannot know which release serves it before the first
answer, and a key that only a newer release knows is then refused by the older server itself, loudly (a 400
naming the key, the sample FAILED with it), never dropped. To refresh it for a new release::

    python -c "import inspect; from sglang.srt.sampling.sampling_params import SamplingParams; \\
        print(inspect.signature(SamplingParams.__init__))"

and drop the internal fields listed above."""

TRAINER_OWNED_KEYS = ("temperature", "top_p")
"""Sampling params slime's trainer reads from its own flags: in training they must equal what slime passes."""


GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")
"""Constrained-decoding keys: SGLang refuses a request with more than one (400 "Only one of json_schema, regex,
ebnf, or structural_tag can be set."). A grammar set at a higher level replaces one set below it."""


class SamplingParamError(ConfigurationError):
    """A sampling param SGLang does not accept, or one slime-strands cannot honour; the message names it."""


def check_sampling_keys(params: Mapping[str, Any], where: str) -> None:
    """Raise :class:`SamplingParamError` naming the first key of ``params`` that SGLang does not accept, or the
    grammars when more than one is set (SGLang refuses such a request)."""
    unknown = sorted(set(params) - SGLANG_SAMPLING_KEYS)
    if unknown:
        raise SamplingParamError(
            f"{where}: {unknown[0]!r} is not a sampling param SGLang ({SGLANG_SAMPLING_VERSIONS}) accepts; "
            f"use one of {sorted(SGLANG_SAMPLING_KEYS)}"
        )
    grammars = [key for key in GRAMMAR_KEYS if params.get(key) is not None]
    if len(grammars) > 1:
        raise SamplingParamError(
            f"{where}: {' and '.join(grammars)} are both set, but SGLang takes one grammar per request "
            f"(one of {', '.join(GRAMMAR_KEYS)}): keep one"
        )


def check_sampling_values(params: Mapping[str, Any], where: str) -> None:
    """Raise :class:`SamplingParamError` for the first value of the params a request sends that SGLang would
    refuse (out of its range: every request of every episode would fail)."""
    for key, problem in range_problems(params):
        raise SamplingParamError(f"{where}: {key} {problem} (SGLang would refuse every request)")


def checked_params(params: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """A copy of ``params`` whose keys and values SGLang accepts; SamplingParamError naming the first that it
    would refuse."""
    checked = dict(params or {})
    check_sampling_keys(checked, where)
    check_sampling_values(checked, where)
    return checked


def turn_params(params: Mapping[str, Any], turn_end_ids: Sequence[int]) -> dict[str, Any]:
    """A turn's sampling params: ``params`` with every token a turn may end on (the template's stop tokens and
    the model's end-of-sequence ones) added to their ``stop_token_ids``."""
    turn = dict(params)
    stop_ids = list(turn.get("stop_token_ids") or [])
    turn["stop_token_ids"] = stop_ids + [t for t in turn_end_ids if t not in stop_ids]
    return turn


class SamplingParams(Mapping[str, Any]):
    """An immutable, hashable set of SGLang sampling params (the plugin settings' ``sampling_params``).

    Built from a mapping whose keys are checked against :data:`SGLANG_SAMPLING_KEYS` and whose values must be
    JSON (they are sent as such); a ``None`` value means "SGLang's default" and is left out. Reading a value
    gives a copy, so nothing can change the settings behind their back.
    """

    __slots__ = ("_json", "_values")

    def __init__(self, values: Mapping[str, Any] | None = None, *, where: str = "sampling_params") -> None:
        if values is None:
            values = {}
        if not isinstance(values, Mapping):
            raise SamplingParamError(f"{where}: expected a mapping of sampling params, got {values!r}")
        present = {str(k): v for k, v in values.items() if v is not None}
        check_sampling_keys(present, where)
        for key, value in present.items():
            _check_value(key, value, where)
        self._json = json.dumps(present, sort_keys=True, allow_nan=False)
        self._values: dict[str, Any] = json.loads(self._json)

    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy(self._values[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(self._json)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SamplingParams):
            return self._json == other._json
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return f"SamplingParams({self._json})"

    def with_overrides(self, overrides: Mapping[str, Any], *, where: str) -> SamplingParams:
        """These params with ``overrides`` on top (each checked as in the constructor; a grammar among the
        overrides replaces this one's)."""
        return SamplingParams({**_without_grammar_if(self._values, overrides), **overrides}, where=where)


def _without_grammar_if(params: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` without its grammar when ``overrides`` bring one (so the higher level's grammar wins)."""
    if not any(overrides.get(key) is not None for key in GRAMMAR_KEYS):
        return dict(params)
    return {k: v for k, v in params.items() if k not in GRAMMAR_KEYS}


def _check_value(key: str, value: Any, where: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise SamplingParamError(f"{where}.{key}: {value!r} is not a JSON value") from None
    if key == "max_new_tokens" and not (is_int(value) and value >= 1):
        raise SamplingParamError(f"{where}.max_new_tokens: must be a positive integer, got {value!r}")
    if key in TRAINER_OWNED_KEYS and not is_number(value, finite=True):
        raise SamplingParamError(f"{where}.{key}: must be a number, got {value!r}")


def merge_sampling_params(
    given: Mapping[str, Any], settings: Mapping[str, Any], *, training: bool
) -> dict[str, Any]:
    """A fresh dict of the params an episode sends: ``given`` (slime's or eval's) with the plugin settings'
    on top, as the module docstring says. ``None`` values of ``given`` are left out (SGLang's defaults); a key
    SGLang does not accept raises :class:`SamplingParamError`, as does, in training, a ``temperature`` or
    ``top_p`` that differs from slime's, and a value out of SGLang's range."""
    params = {k: copy.deepcopy(v) for k, v in given.items() if v is not None}
    check_sampling_keys(params, "the sampling params passed to generate")
    params = _without_grammar_if(params, settings)
    for key, value in settings.items():
        if key == "max_new_tokens" and params.get("max_new_tokens") is not None:
            params[key] = min(int(params[key]), int(value))
            continue
        if training and key in TRAINER_OWNED_KEYS and key in params and params[key] != value:
            flag = "--rollout-temperature" if key == "temperature" else "--rollout-top-p"
            raise SamplingParamError(
                f"strands.sampling_params.{key} is {value!r} but slime samples with {params[key]!r}: slime's "
                f"trainer uses {flag}, so set {flag} {value} instead (or remove it from the settings)"
            )
        params[key] = copy.deepcopy(value)
    check_sampling_values(params, "the sampling params of an episode")
    return params
