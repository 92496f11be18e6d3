"""What makes an eval's trajectories what they are, as digests stored in every row: a resumed ``--out`` file
must hold trajectories of the configuration being run, or its old results would be reported as the new one's.

Five parts, each a short SHA-256 of a canonical JSON text, so that the refusal can name what differs:

* ``settings``: the plugin settings (``--config``), except the knobs that only change how requests are retried
  or how fast things run (timeouts, retries, the garbage collector, the sandbox's concurrency and prewarming),
  where the sandbox runs (its placement and Ray pool: the same results, token for token) and the training-only
  reward shaping (eval grades 1 / 0);
* ``sampling``: the params every turn is sent with, as the episode merges them (``--temperature``, ``--top-p``,
  the config's ``sampling_params``, ``--sampling-param``), and the response budget (``--max-response-len``);
* ``tokenizer``: the vocabulary (every token and its id) and the chat template, not the path it was loaded
  from (a hub id and a local copy are the same tokenizer);
* ``tools``: each tool's dotted path and the spec the model sees (name, description, parameters);
* ``model``: the served model's id (``/v1/models``), weight version (``/model_info``, when reported) and context
  window, not the base URL (the same server reached by another name, or through a router, samples the same
  way).

``--n``, ``--limit``, ``--concurrency``, ``--out`` and wandb change which trajectories run, not what one is;
the data is checked row by row (``prompt_digest``). The digests themselves are the row's record
(:class:`~slime_strands.trajectories.config_digest.ConfigDigest`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ...provider.client import SGLangClient, SGLangError
from ...settings import PluginSettings

__all__ = ["served_model", "settings_part", "tokenizer_part", "tools_part"]

_NOT_TRAJECTORY = frozenset(
    {
        # how requests are sent and retried: a FAILED row runs again anyway
        "request_timeout_s",
        "max_retries",
        "retry_delay_s",
        "server_abort_retries",
        # speed only
        "gc_young_threshold",
        "sandbox.concurrency",
        "sandbox.prewarm",
        "sandbox.preload_modules",
        # where the code runs: the same results either way (tests/ray)
        "sandbox.placement",
        # training rewards: eval grades 1.0 / 0.0 (reward.math_verify_timeout_s does count)
        "reward.tool_shaping",
        "reward.shaping_cap",
        "reward.shaping_per_iter",
        "reward.shaping_baseline_iters",
        "reward.correct",
        "reward.incorrect",
        # parts of their own
        "tools",
        "sampling_params",
    }
)


_NOT_TRAJECTORY_SECTIONS = ("sandbox.ray.",)  # the Ray pool's size and resources: where, not what


def settings_part(settings: PluginSettings) -> dict[str, Any]:
    """The settings that change a trajectory, as dotted names and values."""
    flat: dict[str, Any] = {}
    _flatten(settings, "", flat)
    return {
        name: value
        for name, value in flat.items()
        if name not in _NOT_TRAJECTORY and not name.startswith(_NOT_TRAJECTORY_SECTIONS)
    }


def tokenizer_part(tokenizer: Any) -> dict[str, Any]:
    """The vocabulary and the chat template (~0.2 s for a 150k-token vocabulary: once per eval)."""
    vocab = tokenizer.get_vocab()
    return {
        "vocab": sorted((str(token), int(index)) for token, index in vocab.items()),
        "chat_template": getattr(tokenizer, "chat_template", None),
    }


def tools_part(paths: Sequence[str], specs: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    return {"paths": list(paths), "specs": list(specs or [])}


async def served_model(client: SGLangClient) -> dict[str, Any]:
    """The served model's id (``/v1/models``, else ``/model_info``'s served name or path), weight version and
    context window; None for what the server does not say."""
    model_id: Any = None
    info: dict[str, Any] = {}
    with contextlib.suppress(SGLangError):
        cards = (await client.models()).get("data")
        if isinstance(cards, list) and cards and isinstance(cards[0], Mapping):
            model_id = cards[0].get("id")
    with contextlib.suppress(SGLangError):
        info = await client.model_info()
    if model_id is None:
        model_id = info.get("served_model_name") or info.get("model_path")
    return {
        "id": model_id,
        "weight_version": info.get("weight_version"),
        "window": await client.context_length(),
    }


def _server_part(server: Any) -> dict[str, Any]:
    """An MCP server's settings but those that change only how fast it goes (``max_live``, its start time)."""
    fields = dataclasses.asdict(server)
    return {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in fields.items()
        if k not in ("max_live", "startup_timeout_s")
    }


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    for field in dataclasses.fields(value):
        item = getattr(value, field.name)
        if dataclasses.is_dataclass(item):
            _flatten(item, f"{prefix}{field.name}.", out)
        elif isinstance(item, tuple) and item and dataclasses.is_dataclass(item[0]):  # mcp_servers
            out[prefix + field.name] = [_server_part(server) for server in item]
        else:
            out[prefix + field.name] = dict(item) if isinstance(item, Mapping) else item
