"""One sample, from slime's side: its ``Sample``, sampling params and ``GenerateState`` into the episode's inputs,
the trainer's demands on it, and slime's reward for it.

Every flag comes from the :class:`~slime_strands._slime.config.SlimeConfig` of slime's args (read once per args
object); slime's namespace itself reaches only slime's own functions (``GenerateState``, ``rm_hub.async_rm``).
slime is imported lazily and only where it exists.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ..agent.episode import EpisodeSpec
from ..errors import ConfigurationError
from ..provider.images import Vision
from .config import SlimeConfig
from .sample_writer import SampleContract

__all__ = ["episode_spec", "sample_contract", "score_sample", "slime_generate_state", "template_kwargs"]

_TOP_P_PARAM = "return_top_p_token_ids"


async def score_sample(config: SlimeConfig, sample: Any) -> Any:
    """The reward slime's per-sample reward step would give ``sample`` (``rm_hub.async_rm``: the sample's
    ``custom_rm_path``, else ``--custom-rm-path``, else ``--rm-type``). Without slime, the custom reward
    function is imported by its dotted path as slime's ``load_function`` does."""
    try:
        from slime.rollout.rm_hub import async_rm
    except ImportError:
        pass
    else:
        return await async_rm(config.namespace, sample)
    path = getattr(sample, "custom_rm_path", None) or config.custom_rm_path
    if not path:
        raise ConfigurationError(
            "scoring a fanned-out episode without slime needs a reward function: set --custom-rm-path"
        )
    module_name, _, attr = str(path).rpartition(".")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(f"--custom-rm-path {path!r} cannot be imported: {exc}") from exc
    return await function(config.namespace, sample)


def slime_generate_state(config: SlimeConfig) -> Any:
    """slime's ``GenerateState`` singleton (tokenizer, abort flag), or None when slime is not installed."""
    try:
        from slime.rollout.sglang_rollout import GenerateState
    except ImportError:
        return None
    return GenerateState(config.namespace)


def sample_contract(
    config: SlimeConfig, sampling_params: Mapping[str, Any], evaluation: bool, vision: Vision | None = None
) -> SampleContract:
    """What slime's trainer will demand of this sample (a vision-language model's: its images, made with
    ``vision``); eval samples are never trained on."""
    if evaluation:
        return SampleContract(reward_key=config.eval_reward_key or config.reward_key, vision=vision)
    custom = sampling_params.get("custom_params")
    top_p = (isinstance(custom, Mapping) and bool(custom.get(_TOP_P_PARAM))) or config.rollout_top_p != 1.0
    bound = config.settings.staleness
    return SampleContract(
        routing=config.routing,
        top_p=top_p,
        speculative=config.speculative,
        reward_key=config.reward_key,
        mask_offpolicy=config.mask_offpolicy,
        max_versions=bound.max_versions if bound.masks else None,
        vision=vision,
    )


def episode_spec(
    config: SlimeConfig,
    sample: Any,
    sampling_params: Mapping[str, Any],
    evaluation: bool,
    contract: SampleContract,
) -> EpisodeSpec:
    """The episode's inputs from slime's sample, sampling params (copied, never mutated) and flags."""
    params = dict(sampling_params)
    if contract.top_p:  # slime's trainer asserts top-p spans on every sample: always ask for them
        params["custom_params"] = {**dict(params.get("custom_params") or {}), _TOP_P_PARAM: True}
    # slime puts the whole response budget in max_new_tokens: it caps each turn AND the whole trajectory.
    budget = config.eval_max_response_len if evaluation else config.rollout_max_response_len
    budget = params.get("max_new_tokens") or budget or config.rollout_max_response_len
    context = config.settings.max_context_len
    if context is None and evaluation:
        context = config.eval_max_context_len
    if context is None:
        context = config.rollout_max_context_len
    return EpisodeSpec(
        prompt=sample.prompt,
        sampling_params=params,
        max_response_tokens=int(budget) if budget else None,
        max_context_tokens=int(context) if context else None,
        evaluation=evaluation,
        routing_key=getattr(sample, "session_id", None),
        return_routed_experts=contract.routing is not None,
        chat_template_kwargs=template_kwargs(config, sample),
        model_id=config.hf_checkpoint,
    )


def template_kwargs(config: SlimeConfig, sample: Any) -> dict[str, Any]:
    """Chat-template variables: ``--apply-chat-template-kwargs`` (parsed once per args), then the sample's own
    ``apply_chat_template_kwargs`` (which win)."""
    merged = dict(config.template_kwargs)
    own = getattr(sample, "apply_chat_template_kwargs", None)
    if own:
        if not isinstance(own, Mapping):
            raise ConfigurationError(f"a sample's apply_chat_template_kwargs must be a mapping, got {own!r}")
        merged.update(own)
    return merged
