"""slime's ``args`` as the plugin reads them: one typed, frozen view, built and checked once per args object.

slime calls ``generate`` (and the reward functions) with the same ``args`` for every sample of a run. Everything
the plugin reads from them is read HERE, once, into a :class:`SlimeConfig`: the plugin's settings (every key of
the ``strands:`` mapping validated), ``--apply-chat-template-kwargs`` (maybe a JSON text), the router and the
size of its connection pool, the trainer's demands (reward keys, top-p, routing replay, speculative decoding),
the response and context budgets, partial rollout, and the flags that conflict with a fanned-out episode. Below
``rollout.generate`` nothing else sees the namespace: the view is passed down, and it hands the namespace back
only to slime's own functions (``GenerateState``, the reward step) that take it.

The view also holds the :class:`~slime_strands.agent.runtime.Runtime` of its configuration (client pool,
tokenizer, tools), built on first use and shared with a view of an equal configuration: the one cache keyed on
args is the cache of views (:data:`_CONFIGS`).

``argparse.Namespace`` defines ``__eq__`` (so it cannot be a dict key by value) and test doubles such as
``types.SimpleNamespace`` cannot be weakly referenced, so views are kept by the args object's id together with
the flag values they were built from (compared by identity, and held, so that an id reused by a new args object
can only match when it holds those very objects: the view is then the same). A flag replaced (``args.strands =
{...}``) or added is seen; one mutated in place (``args.strands["max_tool_iters"] = 3``) is not: replace it. A
few views are kept (slime has one args per process).
"""

from __future__ import annotations

import functools
import json
import threading
import types
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..agent.runtime import Runtime, client_for
from ..errors import ConfigurationError
from ..settings import ARGS_KEY, PluginSettings, settings_from_slime
from .advantage import CENTERED_ESTIMATORS

__all__ = ["SlimeConfig"]

_FLAGS = (
    ARGS_KEY,
    "apply_chat_template",
    "apply_chat_template_kwargs",
    "eval_datasets",
    "sglang_router_ip",
    "sglang_router_port",
    "sglang_server_concurrency",
    "rollout_num_engines",
    "rollout_num_gpus",
    "rollout_num_gpus_per_engine",
    "hf_checkpoint",
    "partial_rollout",
    "mask_offpolicy_in_partial_rollout",
    "reward_key",
    "eval_reward_key",
    "custom_rm_path",
    "rollout_top_p",
    "use_rollout_routing_replay",
    "num_layers",
    "moe_router_topk",
    "sglang_speculative_algorithm",
    "rollout_max_response_len",
    "eval_max_response_len",
    "rollout_max_context_len",
    "eval_max_context_len",
    "group_rm",
    "advantage_estimator",
    "rewards_normalization",
    "custom_reward_post_process_path",
    "custom_convert_samples_to_train_data_path",
)
"""Every attribute of slime's args the plugin reads (absent ones read as None)."""


@dataclass(frozen=True)
class SlimeConfig:
    """The plugin's view of one slime ``args``: every flag it reads, typed and checked (see the module
    docstring); build it with :meth:`of`."""

    settings: PluginSettings
    template_kwargs: Mapping[str, Any]
    """``--apply-chat-template-kwargs``, parsed (a sample's own ``apply_chat_template_kwargs`` win over it)."""
    router_url: str | None
    """slime's router (``--sglang-router-ip`` / ``--sglang-router-port``); None in args that name none (a
    reward function's)."""
    pool_size: int
    """Connections to the router: as many as slime's own pool (``sglang_server_concurrency`` x the number of
    engines, as ``slime.utils.http_utils.get_rollout_num_engines`` counts them)."""
    hf_checkpoint: str | None
    """The checkpoint: its tokenizer, and the model id of every episode."""
    partial_rollout: bool
    """``--partial-rollout``: slime recycles the samples its abort stopped."""
    mask_offpolicy: bool
    """``--partial-rollout`` and ``--mask-offpolicy-in-partial-rollout``: tokens written before a continuation
    get loss mask 0."""
    reward_key: str | None
    eval_reward_key: str | None
    custom_rm_path: str | None
    rollout_top_p: float
    routing: tuple[int, int] | None
    """``(num_layers, moe_router_topk)`` under ``--use-rollout-routing-replay``, else None."""
    speculative: bool
    """``--sglang-speculative-algorithm`` is set (slime then reads the server's speculative stats)."""
    rollout_max_response_len: int | None
    eval_max_response_len: int | None
    rollout_max_context_len: int | None
    eval_max_context_len: int | None
    fanout_conflicts: tuple[str, ...]
    """The slime flags that cannot take ``list[Sample]`` from generate (see :meth:`check_fanout`)."""
    namespace: Any = field(compare=False, repr=False)
    """slime's args themselves: only for slime's own functions that take them (``GenerateState``,
    ``rm_hub.async_rm``, a custom reward function)."""

    @classmethod
    def of(cls, args: Any) -> SlimeConfig:
        """The view of ``args``, built and checked on first use; ConfigurationError for invalid plugin settings
        and for slime flags the plugin cannot honour."""
        key, inputs = id(args), _inputs(args)
        with _LOCK:
            held = _CONFIGS.get(key)
        if held is not None and _same(held[0], inputs):
            return held[1]
        config = _read(args, dict(zip(_FLAGS, inputs[:-1], strict=True)))
        if held is not None:
            config._keep_runtime_of(held[1])
        with _LOCK:
            _CONFIGS[key] = (inputs, config)
            _CONFIGS.move_to_end(key)
            while len(_CONFIGS) > _KEPT:
                _CONFIGS.popitem(last=False)
        return config

    @functools.cached_property
    def runtime(self) -> Runtime:
        """The runtime of this configuration (client, tokenizer, tools), built on first use; a held view of
        the same router, pool, settings and checkpoint shares its own."""
        if self.router_url is None:
            raise ConfigurationError(
                "slime's args name no router: set --sglang-router-ip and --sglang-router-port"
            )
        held = self._held_runtime()
        if held is not None:
            return held
        client = client_for(self.settings, self.router_url, max_connections=self.pool_size)
        return Runtime(self.settings, client, tokenizer_path=self.hf_checkpoint)

    @property
    def served_window(self) -> int | None:
        """The server's context window the runtime of this configuration sizes turns by (reported, or named by
        a refusal and not contradicted); None before an episode of it ran in this process, or while no answer
        said (for the rollout metrics: it builds no runtime)."""
        runtime = vars(self).get("runtime") or self._held_runtime()
        return None if runtime is None else runtime.client.window.tokens

    def _keep_runtime_of(self, previous: SlimeConfig) -> None:
        """Take over the runtime of the view this one replaces (the same args, a flag replaced or added) when it
        is of the same configuration: its client pool, tokenizer and checked templates stay."""
        runtime = vars(previous).get("runtime")
        if runtime is not None and previous._runtime_key == self._runtime_key:
            vars(self)["runtime"] = runtime

    def _held_runtime(self) -> Runtime | None:
        """The runtime a held view of the same configuration built, if one did."""
        with _LOCK:
            for _, other in _CONFIGS.values():
                if "runtime" in vars(other) and other._runtime_key == self._runtime_key:
                    runtime: Runtime = vars(other)["runtime"]
                    return runtime
        return None

    @property
    def _runtime_key(self) -> tuple[Any, ...]:
        return (self.router_url, self.pool_size, self.settings, self.hf_checkpoint)

    def check_fanout(self) -> None:
        """Raise ConfigurationError for slime flags that cannot take ``list[Sample]`` from generate (a
        fanned-out episode in training).

        slime main scores a group's members as samples under ``--group-rm``; its default reward normalisation
        groups rewards by position and, with more samples than ``rollout_batch_size x n_samples_per_prompt``,
        normalises the whole batch as ONE group. (``--partial-rollout`` reads each member of an aborted group
        as a Sample: a fanned-out episode answers as one, see ``slime_strands._slime.partial_rollout``.)"""
        if self.fanout_conflicts:
            raise ConfigurationError(
                "context_management / collect_subagents make generate return list[Sample] (one per trajectory "
                f"segment), which slime cannot take with: {'; '.join(self.fanout_conflicts)}"
            )

    def continues_aborted(self, evaluation: bool) -> bool:
        """Whether an episode slime aborts will be continued, so that it keeps a checkpoint: slime recycles
        aborted samples (``--partial-rollout``), the settings continue them (``resume_aborted``), and it is
        training (an evaluation sample is never continued). Decided once per sample: otherwise nothing is
        captured."""
        return self.partial_rollout and self.settings.resume_aborted and not evaluation


_KEPT = 16
"""Views kept, the most recently built ones (a process normally has one args; tests make many)."""
_LOCK = threading.RLock()  # re-entrant: a view's runtime is looked up under it
_CONFIGS: OrderedDict[int, tuple[tuple[Any, ...], SlimeConfig]] = OrderedDict()


def _inputs(args: Any) -> tuple[Any, ...]:
    """What a view is built from: every flag it reads (compared by identity) and how many attributes ``args``
    has (a misspelt ``strands`` key added later is checked too)."""
    return (*(getattr(args, name, None) for name in _FLAGS), len(getattr(args, "__dict__", ())))


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a[:-1], b[:-1], strict=True)) and a[-1] == b[-1]


def _read(args: Any, flags: Mapping[str, Any]) -> SlimeConfig:
    """The view of ``flags`` (``args``' values of :data:`_FLAGS`), checked."""
    settings = settings_from_slime(flags[ARGS_KEY], getattr(args, "__dict__", {}))
    _check_flags(flags)
    partial = bool(flags["partial_rollout"])
    _check_staleness(settings, partial and bool(flags["mask_offpolicy_in_partial_rollout"]))
    routing = None
    if flags["use_rollout_routing_replay"]:
        routing = (int(flags["num_layers"]), int(flags["moe_router_topk"]))
    return SlimeConfig(
        settings=settings,
        template_kwargs=_template_kwargs(flags["apply_chat_template_kwargs"]),
        router_url=_router_url(flags),
        pool_size=int(flags["sglang_server_concurrency"] or 512) * _rollout_num_engines(flags),
        hf_checkpoint=flags["hf_checkpoint"],
        partial_rollout=partial,
        mask_offpolicy=partial and bool(flags["mask_offpolicy_in_partial_rollout"]),
        reward_key=flags["reward_key"],
        eval_reward_key=flags["eval_reward_key"],
        custom_rm_path=flags["custom_rm_path"],
        rollout_top_p=float(flags["rollout_top_p"] or 1.0),
        routing=routing,
        speculative=bool(flags["sglang_speculative_algorithm"]),
        rollout_max_response_len=_length(flags["rollout_max_response_len"]),
        eval_max_response_len=_length(flags["eval_max_response_len"]),
        rollout_max_context_len=_length(flags["rollout_max_context_len"]),
        eval_max_context_len=_length(flags["eval_max_context_len"]),
        fanout_conflicts=_fanout_conflicts(flags),
        namespace=args,
    )


def _router_url(flags: Mapping[str, Any]) -> str | None:
    if flags["sglang_router_ip"] is None or flags["sglang_router_port"] is None:
        return None
    return f"http://{flags['sglang_router_ip']}:{flags['sglang_router_port']}"


def _rollout_num_engines(flags: Mapping[str, Any]) -> int:
    engines = flags["rollout_num_engines"]
    if engines is not None:
        return max(1, int(engines))
    gpus = int(flags["rollout_num_gpus"] or 0)
    per_engine = int(flags["rollout_num_gpus_per_engine"] or 1)
    return max(1, gpus // max(1, per_engine))


def _length(value: Any) -> int | None:
    """A token budget flag: None when unset (or 0)."""
    return int(value) if value else None


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


def _check_flags(flags: Mapping[str, Any]) -> None:
    problems = []
    if flags["apply_chat_template"]:
        problems.append("--apply-chat-template is set")
    for cfg in flags["eval_datasets"] or []:
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
    if flags["use_rollout_routing_replay"] and not (flags["num_layers"] and flags["moe_router_topk"]):
        raise ConfigurationError(
            "--use-rollout-routing-replay needs args.num_layers and args.moe_router_topk (the model's Megatron "
            "arguments) to lay out the routed experts"
        )


def _check_staleness(settings: PluginSettings, mask_offpolicy: bool) -> None:
    """slime's ``--mask-offpolicy-in-partial-rollout`` and the plugin's staleness bound say the same thing
    only with ``max_versions: 0`` and ``on_exceed: mask``; any other bound next to the flag is refused."""
    bound = settings.staleness
    if mask_offpolicy and bound.max_versions is not None and not (bound.masks and bound.max_versions == 0):
        raise ConfigurationError(
            f"--mask-offpolicy-in-partial-rollout masks every token before an episode's last continuation, "
            f"but strands.staleness is max_versions: {bound.max_versions}, on_exceed: {bound.on_exceed}: "
            "remove one of the two (max_versions: 0 with on_exceed: mask is the flag's rule)"
        )


def _fanout_conflicts(flags: Mapping[str, Any]) -> tuple[str, ...]:
    problems = []
    if flags["group_rm"]:
        problems.append("--group-rm (slime scores a group's members as Samples)")
    if (
        flags["advantage_estimator"] in CENTERED_ESTIMATORS
        and flags["rewards_normalization"]
        and not flags["custom_reward_post_process_path"]
        and not flags["custom_convert_samples_to_train_data_path"]
    ):
        problems.append(
            "slime's default reward normalisation (it groups rewards by position: with several samples per "
            "rollout it normalises the whole batch as one group); set --custom-reward-post-process-path "
            "slime_strands.reward_norm.post_process_rewards, which groups the samples of one rollout_id"
        )
    return tuple(problems)
