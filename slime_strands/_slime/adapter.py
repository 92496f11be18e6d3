"""Everything that reads slime: its ``args`` (flags), its ``GenerateState`` and its ``Sample``.

slime calls a plain function (``generate``) per sample, so the :class:`Runtime` (client, tokenizer, tools)
that must outlive the calls is kept here, one per distinct configuration (normally one per process: slime's
RolloutManager holds one ``args``). slime is imported lazily and only where it exists.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ..agent.episode import EpisodeSpec
from ..agent.runtime import Runtime
from ..errors import ConfigurationError
from ..provider.client import SGLangClient
from ..settings import PluginSettings
from .advantage import CENTERED_ESTIMATORS
from .config import SlimeConfig
from .partial_rollout import offpolicy_masking
from .sample_writer import SampleContract

__all__ = [
    "check_fanout_flags",
    "client_from_slime_args",
    "episode_spec",
    "runtime_for",
    "sample_contract",
    "score_sample",
    "served_window",
    "slime_generate_state",
    "template_kwargs",
]

_RUNTIMES: dict[tuple[Any, ...], Runtime] = {}
"""The one place runtimes live. slime calls plain functions (``generate`` per sample), so the client pool,
tokenizer and tools that must outlive a call are kept here, keyed by what they are built from (router URL,
pool size, plugin settings, checkpoint); :func:`runtime_for` is its only writer (:func:`served_window` reads
the window a runtime's client uses, for the rollout metrics). A process sees
one key per slime configuration (normally one), so entries are never evicted."""
_TOP_P_PARAM = "return_top_p_token_ids"


def client_from_slime_args(args: Any, settings: PluginSettings) -> SGLangClient:
    """The client for slime's router, its pool as large as slime's own (``sglang_server_concurrency`` x the
    number of engines, as ``slime.utils.http_utils.get_rollout_num_engines`` counts them)."""
    return SGLangClient(
        _router_url(args),
        max_connections=_pool_size(args),
        timeout=settings.request_timeout_s,
        max_retries=settings.max_retries,
        retry_delay=settings.retry_delay_s,
    )


def _router_url(args: Any) -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"


def _pool_size(args: Any) -> int:
    return int(_arg(args, "sglang_server_concurrency") or 512) * _rollout_num_engines(args)


def _rollout_num_engines(args: Any) -> int:
    engines = _arg(args, "rollout_num_engines")
    if engines is not None:
        return max(1, int(engines))
    gpus = int(_arg(args, "rollout_num_gpus") or 0)
    per_engine = int(_arg(args, "rollout_num_gpus_per_engine") or 1)
    return max(1, gpus // max(1, per_engine))


def runtime_for(args: Any) -> Runtime:
    """The runtime of this configuration, built (and its slime flags checked) on first use.

    Raises ConfigurationError for invalid plugin settings and for slime flags the plugin cannot honour
    (both checked once per ``args``: :class:`~slime_strands._slime.config.SlimeConfig`).
    """
    settings = SlimeConfig.of(args).settings
    key = _runtime_key(args, settings)
    runtime = _RUNTIMES.get(key)
    if runtime is None:
        client = client_from_slime_args(args, settings)
        runtime = _RUNTIMES[key] = Runtime(settings, client, tokenizer_path=_arg(args, "hf_checkpoint"))
    return runtime


def _runtime_key(args: Any, settings: PluginSettings) -> tuple[Any, ...]:
    return (_router_url(args), _pool_size(args), settings, _arg(args, "hf_checkpoint"))


def served_window(args: Any) -> int | None:
    """The server's context window the runtime of this configuration sizes turns by (reported, or named by a
    refusal and not contradicted); None before an episode of it ran in this process, or while no answer said."""
    runtime = _RUNTIMES.get(_runtime_key(args, SlimeConfig.of(args).settings))
    return None if runtime is None else runtime.client.window.tokens


def check_fanout_flags(args: Any) -> None:
    """Raise ConfigurationError for slime flags that cannot take ``list[Sample]`` from generate (fan-out).

    slime main scores a group's members as samples under ``--group-rm``; its default reward normalisation
    groups rewards by position and, with more samples than ``rollout_batch_size x n_samples_per_prompt``,
    normalises the whole batch as ONE group. (``--partial-rollout`` reads each member of an aborted group as a
    Sample: a fanned-out episode answers as one, see ``slime_strands._slime.partial_rollout``.)
    """
    problems = []
    if _arg(args, "group_rm"):
        problems.append("--group-rm (slime scores a group's members as Samples)")
    if (
        _arg(args, "advantage_estimator") in CENTERED_ESTIMATORS
        and _arg(args, "rewards_normalization")
        and not _arg(args, "custom_reward_post_process_path")
        and not _arg(args, "custom_convert_samples_to_train_data_path")
    ):
        problems.append(
            "slime's default reward normalisation (it groups rewards by position: with several samples per "
            "rollout it normalises the whole batch as one group); set --custom-reward-post-process-path "
            "slime_strands.reward_norm.post_process_rewards, which groups the samples of one rollout_id"
        )
    if problems:
        raise ConfigurationError(
            "context_management / collect_subagents make generate return list[Sample] (one per trajectory "
            f"segment), which slime cannot take with: {'; '.join(problems)}"
        )


async def score_sample(args: Any, sample: Any) -> Any:
    """The reward slime's per-sample reward step would give ``sample`` (``rm_hub.async_rm``: the sample's
    ``custom_rm_path``, else ``--custom-rm-path``, else ``--rm-type``). Without slime, the custom reward
    function is imported by its dotted path as slime's ``load_function`` does."""
    try:
        from slime.rollout.rm_hub import async_rm
    except ImportError:
        pass
    else:
        return await async_rm(args, sample)
    path = getattr(sample, "custom_rm_path", None) or _arg(args, "custom_rm_path")
    if not path:
        raise ConfigurationError(
            "scoring a fanned-out episode without slime needs a reward function: set --custom-rm-path"
        )
    module_name, _, attr = str(path).rpartition(".")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(f"--custom-rm-path {path!r} cannot be imported: {exc}") from exc
    return await function(args, sample)


def slime_generate_state(args: Any) -> Any:
    """slime's ``GenerateState`` singleton (tokenizer, abort flag), or None when slime is not installed."""
    try:
        from slime.rollout.sglang_rollout import GenerateState
    except ImportError:
        return None
    return GenerateState(args)


def sample_contract(args: Any, sampling_params: Mapping[str, Any], evaluation: bool) -> SampleContract:
    """What slime's trainer will demand of this sample; eval samples are never trained on."""
    if evaluation:
        return SampleContract(reward_key=_arg(args, "eval_reward_key") or _arg(args, "reward_key"))
    custom = sampling_params.get("custom_params")
    top_p = (isinstance(custom, Mapping) and bool(custom.get(_TOP_P_PARAM))) or (
        float(_arg(args, "rollout_top_p") or 1.0) != 1.0
    )
    routing = None
    if _arg(args, "use_rollout_routing_replay"):
        routing = (int(args.num_layers), int(args.moe_router_topk))
    return SampleContract(
        routing=routing,
        top_p=top_p,
        speculative=bool(_arg(args, "sglang_speculative_algorithm")),
        reward_key=_arg(args, "reward_key"),
        mask_offpolicy=offpolicy_masking(args),
    )


def episode_spec(
    args: Any,
    sample: Any,
    sampling_params: Mapping[str, Any],
    evaluation: bool,
    settings: PluginSettings,
    contract: SampleContract,
) -> EpisodeSpec:
    """The episode's inputs from slime's sample, sampling params (copied, never mutated) and flags."""
    params = dict(sampling_params)
    if contract.top_p:  # slime's trainer asserts top-p spans on every sample: always ask for them
        params["custom_params"] = {**dict(params.get("custom_params") or {}), _TOP_P_PARAM: True}
    # slime puts the whole response budget in max_new_tokens: it caps each turn AND the whole trajectory.
    budget_flag = "eval_max_response_len" if evaluation else "rollout_max_response_len"
    budget = params.get("max_new_tokens") or _arg(args, budget_flag) or _arg(args, "rollout_max_response_len")
    context = settings.max_context_len
    if context is None and evaluation:
        context = _arg(args, "eval_max_context_len")
    if context is None:
        context = _arg(args, "rollout_max_context_len")
    return EpisodeSpec(
        prompt=sample.prompt,
        sampling_params=params,
        max_response_tokens=int(budget) if budget else None,
        max_context_tokens=int(context) if context else None,
        evaluation=evaluation,
        routing_key=getattr(sample, "session_id", None),
        return_routed_experts=contract.routing is not None,
        chat_template_kwargs=template_kwargs(args, sample),
        model_id=_arg(args, "hf_checkpoint"),
    )


def template_kwargs(args: Any, sample: Any) -> dict[str, Any]:
    """Chat-template variables: ``--apply-chat-template-kwargs`` (parsed once per ``args``), then the sample's
    own ``apply_chat_template_kwargs`` (which win)."""
    merged = dict(SlimeConfig.of(args).template_kwargs)
    own = getattr(sample, "apply_chat_template_kwargs", None)
    if own:
        if not isinstance(own, Mapping):
            raise ConfigurationError(f"a sample's apply_chat_template_kwargs must be a mapping, got {own!r}")
        merged.update(own)
    return merged


def _arg(args: Any, name: str) -> Any:
    return getattr(args, name, None)
