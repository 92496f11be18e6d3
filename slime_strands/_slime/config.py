"""What slime's ``args`` tell the plugin, parsed and checked once per ``args`` object, not once per sample.

slime calls ``generate`` (and the reward functions) with the same ``args`` for every sample of a run. Reading
the plugin's settings from them validates every key of the ``strands:`` mapping, and slime's
``--apply-chat-template-kwargs`` may be a JSON text: done per sample, that is thousands of identical parses a
step. :meth:`SlimeConfig.of` does it once and hands out the same frozen config while ``args`` holds the same
inputs; a tool or test that replaces ``args.strands`` (or another flag read here) gets a fresh parse.

``argparse.Namespace`` defines ``__eq__`` (so it cannot be a dict key by value) and test doubles such as
``types.SimpleNamespace`` cannot be weakly referenced, so configs are kept by the args object's id together
with the objects they were built from (compared by identity, and held, so that an id reused by a new args
object can only match when it holds those very objects: the config is then the same). A flag mutated in place
(``args.strands["max_tool_iters"] = 3``) is not seen: replace it. A few configs are kept (slime has one args
per process).
"""

from __future__ import annotations

import json
import threading
import types
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError
from ..settings import ARGS_KEY, PluginSettings, settings_from_args

__all__ = ["SlimeConfig"]

_CHECKED_FLAGS = (
    "apply_chat_template",
    "apply_chat_template_kwargs",
    "eval_datasets",
    "use_rollout_routing_replay",
    "num_layers",
    "moe_router_topk",
)
"""The flags :meth:`SlimeConfig.of` reads besides ``strands``: a config is reused only while none changed."""


@dataclass(frozen=True)
class SlimeConfig:
    """The plugin's view of one slime ``args``: its settings and chat-template variables, flags checked."""

    settings: PluginSettings
    template_kwargs: Mapping[str, Any]
    """``--apply-chat-template-kwargs``, parsed (a sample's own ``apply_chat_template_kwargs`` win over it)."""

    @classmethod
    def of(cls, args: Any) -> SlimeConfig:
        """The config of ``args``, parsed and checked on first use; ConfigurationError for invalid plugin
        settings and for slime flags the plugin cannot honour."""
        key, inputs = id(args), _inputs(args)
        with _LOCK:
            held = _CONFIGS.get(key)
        if held is not None and _same(held[0], inputs):
            return held[1]
        config = cls(settings_from_args(args), _template_kwargs(_arg(args, "apply_chat_template_kwargs")))
        _check_flags(args)
        with _LOCK:
            _CONFIGS[key] = (inputs, config)
            _CONFIGS.move_to_end(key)
            while len(_CONFIGS) > _KEPT:
                _CONFIGS.popitem(last=False)
        return config


_KEPT = 16
"""Configs kept, the most recently built ones (a process normally has one args; tests make many)."""
_LOCK = threading.Lock()
_CONFIGS: OrderedDict[int, tuple[tuple[Any, ...], SlimeConfig]] = OrderedDict()


def _inputs(args: Any) -> tuple[Any, ...]:
    """What a config is built from: the objects it reads (compared by identity) and how many attributes
    ``args`` has (a misspelt ``strands`` key added later is checked too)."""
    return (
        _arg(args, ARGS_KEY),
        *(_arg(args, name) for name in _CHECKED_FLAGS),
        len(getattr(args, "__dict__", ())),
    )


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a[:-1], b[:-1], strict=True)) and a[-1] == b[-1]


def _template_kwargs(flag: Any) -> Mapping[str, Any]:
    """``--apply-chat-template-kwargs``: slime parses it with ``json.loads``, but a config file may give text."""
    if isinstance(flag, str):
        try:
            flag = json.loads(flag or "{}")
        except ValueError as exc:
            raise ConfigurationError(f"--apply-chat-template-kwargs is not JSON: {exc}") from exc
    if not flag:
        return types.MappingProxyType({})
    if not isinstance(flag, Mapping):
        raise ConfigurationError(f"apply_chat_template_kwargs must be a mapping, got {flag!r}")
    return types.MappingProxyType(dict(flag))


def _check_flags(args: Any) -> None:
    problems = []
    if _arg(args, "apply_chat_template"):
        problems.append("--apply-chat-template is set")
    for cfg in _arg(args, "eval_datasets") or []:
        value = (
            cfg.get("apply_chat_template")
            if isinstance(cfg, Mapping)
            else getattr(cfg, "apply_chat_template", None)
        )
        if value:
            name = cfg.get("name") if isinstance(cfg, Mapping) else getattr(cfg, "name", "?")
            problems.append(f"eval dataset {name!r} sets apply_chat_template")
    if problems:
        raise ConfigurationError(
            f"{'; '.join(problems)}: slime would render each prompt to text with the chat template before "
            "generate sees it, and the agent would wrap that text in the template a second time (without its "
            "tools and system prompt). Remove it: slime-strands renders prompts itself; template options go in "
            "--apply-chat-template-kwargs or a sample's apply_chat_template_kwargs."
        )
    if _arg(args, "use_rollout_routing_replay") and not (
        _arg(args, "num_layers") and _arg(args, "moe_router_topk")
    ):
        raise ConfigurationError(
            "--use-rollout-routing-replay needs args.num_layers and args.moe_router_topk (the model's Megatron "
            "arguments) to lay out the routed experts"
        )


def _arg(args: Any, name: str) -> Any:
    return getattr(args, name, None)
