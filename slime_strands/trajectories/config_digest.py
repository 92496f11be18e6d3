"""The digests a trajectory row carries of the configuration that made it (``config`` in the file), part by
part, so that resuming an eval can refuse rows of another configuration and name what differs.

What each part covers and how it is described is the eval's business (``slime_strands.cli.eval.digest``); this
module is the record the file stores: five short SHA-256 digests of canonical JSON texts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PARTS", "ConfigDigest"]

PARTS = {
    "settings": "the plugin settings (--config)",
    "sampling": "the sampling params (--temperature, --top-p, --max-response-len, --sampling-param, "
    "strands.sampling_params)",
    "tokenizer": "the tokenizer or its chat template (--tokenizer)",
    "tools": "the tools (strands.tools)",
    "model": "the served model (its /v1/models id, weight version or context window)",
}
"""Each part of the digest and what it covers, as the refusal names it."""


@dataclass(frozen=True)
class ConfigDigest:
    """The digests of one eval configuration, part by part (see the module docstring)."""

    settings: str
    sampling: str
    tokenizer: str
    tools: str
    model: str

    @classmethod
    def of(
        cls,
        *,
        settings: Any,
        sampling: Any,
        tokenizer: Any,
        tools: Any,
        model: Any,
    ) -> ConfigDigest:
        """Digests of JSON-able descriptions of each part."""
        return cls(_digest(settings), _digest(sampling), _digest(tokenizer), _digest(tools), _digest(model))

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> ConfigDigest | None:
        """The digest a row holds; None for a row without one (written by an older slime-strands)."""
        if not isinstance(data, Mapping) or set(data) != set(PARTS):
            return None
        return cls(**{name: str(data[name]) for name in PARTS})

    def differences(self, other: ConfigDigest | None) -> list[str]:
        """What differs from ``other``, in the words of :data:`PARTS` (every part when ``other`` is None)."""
        return [
            text
            for name, text in PARTS.items()
            if other is None or getattr(self, name) != getattr(other, name)
        ]


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=list)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
