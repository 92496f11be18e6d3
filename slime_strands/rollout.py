"""slime's custom generate function: one Strands agent episode per Sample, token-in/token-out.

    --custom-generate-function-path slime_strands.rollout.generate

Per sample: an :class:`SGLangModel` (shared :class:`SGLangClient`, slime's tokenizer), a Strands ``Agent``
with ``NullConversationManager`` and the configured tools, a :class:`ToolLimiter` and an abort guard. The
TokenManager's trajectory becomes the Sample's ``tokens`` / ``loss_mask`` / ``rollout_log_probs``.

Statuses: COMPLETED on a normal end; TRUNCATED when a tool limit, the response budget, the context window
or a per-turn ``length`` finish ended it; ABORTED only when slime aborted (``GenerateState.aborted``) or the
server answered ``abort`` (no reward is set: slime skips scoring, and with ``--partial-rollout`` the sample
comes back here and is regenerated from its prompt, stale tokens discarded). Infrastructure failures
(server unreachable after retries, template / tokenizer errors) give a FAILED sample slime can still
train around: ``remove_sample = True``, ``reward = 0.0``, a one-token masked response, the reason in
``metadata["strands"]["error"]``. No exception escapes, except cancellation (slime cancels pending
rollouts on abort and must see it).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from strands import Agent
from strands.agent.conversation_manager import NullConversationManager
from strands.hooks import AfterToolCallEvent, AfterToolsEvent, BeforeToolsEvent, HookProvider, HookRegistry
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException

from .client import SGLangClient, SGLangError
from .limits import StopWhen, ToolLimiter
from .model import (
    INVALID_TOOL_NAME,
    SGLANG_SAMPLING_KEYS,
    GenerationAbortedError,
    ResponseBudgetExhaustedError,
    SGLangModel,
)
from .settings import PluginSettings, settings_from_args

__all__ = ["generate", "get_client"]

logger = logging.getLogger(__name__)

_CLIENTS: dict[tuple[Any, ...], SGLangClient] = {}
_TOKENIZERS: dict[str, Any] = {}
_CONTEXT_LENGTHS: dict[str, int | None] = {}
# slime's sampling params that SGLang does not need for an agent turn (``custom_params`` asks for top-p
# token ids that only slime's own single-turn generate consumes).
_DROPPED_SAMPLING_KEYS = frozenset({"custom_params"})


async def generate(
    args: Any, sample: Any, sampling_params: Mapping[str, Any], evaluation: bool = False
) -> Any:
    """Run one agent episode for ``sample`` and fill its trajectory fields; never raises (except cancel)."""
    started = time.perf_counter()
    metrics: dict[str, Any] = {"evaluation": bool(evaluation)}
    try:
        settings = settings_from_args(args)
        await _run_episode(args, sample, sampling_params, evaluation, settings, metrics)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # infrastructure failure: the rollout step must go on
        logger.warning(
            "slime-strands: sample %s failed: %s: %s", getattr(sample, "index", "?"), type(exc).__name__, exc
        )
        _mark_failed(args, sample, exc, metrics)
    metrics["wall_time_s"] = time.perf_counter() - started
    if not isinstance(getattr(sample, "metadata", None), dict):
        sample.metadata = {}
    sample.metadata["strands"] = metrics
    return sample


def get_client(args: Any, settings: PluginSettings | None = None) -> SGLangClient:
    """The process-wide client for slime's router (one connection pool shared by every sample)."""
    settings = settings or settings_from_args(args)
    key = (
        getattr(args, "sglang_router_ip", None),
        getattr(args, "sglang_router_port", None),
        settings.request_timeout_s,
        settings.max_retries,
        settings.retry_delay_s,
    )
    client = _CLIENTS.get(key)
    if client is None:
        client = SGLangClient.from_slime_args(
            args,
            timeout=settings.request_timeout_s,
            max_retries=settings.max_retries,
            retry_delay=settings.retry_delay_s,
        )
        _CLIENTS[key] = client
    return client


# -- the episode -----------------------------------------------------------------------------------


async def _run_episode(
    args: Any,
    sample: Any,
    sampling_params: Mapping[str, Any],
    evaluation: bool,
    settings: PluginSettings,
    metrics: dict[str, Any],
) -> None:
    status = type(sample).Status
    if sample.status == status.ABORTED:
        _discard_partial(sample, metrics)  # partial rollout: regenerate from the prompt
    state = _generate_state(args)
    aborted: Callable[[], bool] = (lambda: bool(state.aborted)) if state is not None else (lambda: False)
    if aborted():
        sample.status = status.ABORTED
        metrics["termination"] = "abort"
        return

    tokenizer = state.tokenizer if state is not None else await _load_tokenizer(args.hf_checkpoint)
    system_prompt, history, prompt = _split_prompt(sample.prompt, settings.system_prompt)
    params = _sglang_params(sampling_params)
    # slime puts the whole response budget in max_new_tokens: it caps each turn AND the whole trajectory.
    budget_arg = "eval_max_response_len" if evaluation else "rollout_max_response_len"
    budget = params.get("max_new_tokens") or _arg(args, budget_arg) or _arg(args, "rollout_max_response_len")
    model = SGLangModel(
        tokenizer=tokenizer,
        client=get_client(args, settings),
        model_id=_arg(args, "hf_checkpoint"),
        params=params,
        enable_thinking=settings.enable_thinking,
        tool_parser=settings.tool_parser,
        context_length=await _context_length(args, settings),
        max_response_tokens=budget,
        max_tool_output_tokens=settings.max_tool_output_tokens,
        max_calls_per_turn=settings.max_calls_per_turn,
        routing_key=getattr(sample, "session_id", None),
        return_routed_experts=bool(_arg(args, "use_rollout_routing_replay")),
    )
    limiter = ToolLimiter(max_tool_iters=settings.max_tool_iters, max_tool_calls=settings.max_tool_calls)
    guard = StopWhen(aborted, "slime aborted the rollout")
    tool_stats = _ToolStats()
    agent = Agent(
        model=model,
        tools=_load_tools(settings),
        hooks=[limiter, guard, tool_stats],
        system_prompt=system_prompt,
        messages=history,  # type: ignore[arg-type]  # plain dicts in Strands' Message shape
        callback_handler=None,
        conversation_manager=NullConversationManager(),
    )
    termination, error = "end_turn", None
    try:
        await agent.invoke_async(prompt)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        termination, error = _classify(exc)
    finally:
        agent.cleanup()
    if termination == "end_turn" and guard.triggered:
        termination = "abort"
    elif termination == "end_turn" and limiter.limit_reached:
        termination = "tool_limit"

    metrics.update(
        termination=termination,
        turns=model.stats.turns,
        tool_iters=limiter.tool_iter_count,
        tool_calls=limiter.tool_call_count,
        tool_errors=tool_stats.errors,
        parse_errors=dict(model.parse_errors),
        tool_time_s=tool_stats.seconds,
        generation_time_s=model.stats.generation_time_s,
        client_overhead_s=model.stats.overhead_s,
        prompt_tokens=model.stats.prompt_tokens,
        cached_tokens=model.stats.cached_tokens,
        tool_outputs_truncated=model.stats.tool_outputs_truncated,
    )
    if error is not None:
        metrics["error"] = error
    sample.tool_iters = limiter.tool_iter_count
    sample.tool_calls = limiter.tool_call_count
    sample.non_generation_time = (
        float(getattr(sample, "non_generation_time", 0.0) or 0.0) + tool_stats.seconds
    )

    if termination == "failure":
        raise _EpisodeFailure(error or "unknown failure", model)
    await _fill_trajectory(args, sample, model, metrics, allow_empty=termination == "abort")
    if termination == "abort":
        sample.status = status.ABORTED
    elif termination == "end_turn":
        sample.status = status.COMPLETED
    else:
        sample.status = status.TRUNCATED


class _EpisodeFailure(Exception):
    def __init__(self, message: str, model: SGLangModel) -> None:
        super().__init__(message)
        self.model = model


def _classify(exc: BaseException) -> tuple[str, str | None]:
    """Map what ended the agent loop to a termination reason (walking Strands' exception wrapping)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, GenerationAbortedError):
            return "abort", str(current)
        if isinstance(current, ResponseBudgetExhaustedError):
            return "response_budget", None
        if isinstance(current, MaxTokensReachedException):
            return "max_tokens", None
        if isinstance(current, ContextWindowOverflowException):
            return "context_full", None
        if isinstance(current, SGLangError):
            return "failure", f"{type(current).__name__}: {current}"
        current = current.__cause__ or current.__context__
    return "failure", f"{type(exc).__name__}: {exc}"


async def _fill_trajectory(
    args: Any, sample: Any, model: SGLangModel, metrics: dict[str, Any], *, allow_empty: bool
) -> None:
    tm = model.token_manager
    tokens, prompt_len = tm.token_ids, tm.prompt_length
    if len(tokens) == prompt_len and not allow_empty:
        # Nothing generated (e.g. the prompt alone fills the context): slime needs a non-empty response.
        raise _EpisodeFailure(
            metrics.get("error") or f"no token generated ({metrics.get('termination')})", model
        )
    sample.tokens = tokens
    sample.response_length = len(tokens) - prompt_len
    sample.loss_mask = tm.loss_mask[prompt_len:]
    sample.rollout_log_probs = tm.logprobs[prompt_len:]
    sample.response = await asyncio.get_running_loop().run_in_executor(
        None, functools.partial(model.tokenizer.decode, tokens[prompt_len:], skip_special_tokens=False)
    )
    final_chars = await _final_turn_chars(model, sample.response)
    if final_chars is not None:
        metrics["final_turn_chars"] = final_chars
    turns = tm.turns
    sample.weight_versions = [t.weight_version for t in turns if t.weight_version is not None]
    metrics["response_tokens"] = sample.response_length
    metrics["generated_tokens"] = tm.generated_length
    prefix_cache = getattr(sample, "prefix_cache_info", None)
    if prefix_cache is not None and hasattr(prefix_cache, "add"):
        for turn in turns:
            prefix_cache.add(
                {"cached_tokens": turn.cached_tokens or 0, "prompt_tokens": turn.prompt_tokens or 0}
            )
    if model.routed_experts:
        sample.rollout_routed_experts = _decode_routed_experts(args, model.routed_experts[-1], len(tokens))


async def _final_turn_chars(model: SGLangModel, response: str) -> int | None:
    """Length of the last assistant turn at the end of ``response``, so rewards grade only the final answer
    (never tool output or earlier turns) without knowing the chat template. None if it cannot be located."""
    tm = model.token_manager
    last = next((s for s in reversed(tm.segments) if s.kind == "generated"), None)
    if last is None:
        return None
    tail = await asyncio.get_running_loop().run_in_executor(
        None, functools.partial(model.tokenizer.decode, tm.token_ids[last.start :], skip_special_tokens=False)
    )
    return len(tail) if tail and response.endswith(tail) else None


def _decode_routed_experts(args: Any, encoded: str, n_tokens: int) -> Any:
    """The last turn's routing covers the whole trajectory: ``len(tokens) - 1`` rows (slime's R3 layout)."""
    import base64

    import numpy as np

    flat = np.frombuffer(base64.b64decode(encoded), dtype=np.int32)
    layers, topk = _arg(args, "num_layers"), _arg(args, "moe_router_topk")
    if layers and topk:
        return flat.reshape(n_tokens - 1, int(layers), int(topk))
    return flat.reshape(n_tokens - 1, -1)


def _mark_failed(args: Any, sample: Any, exc: Exception, metrics: dict[str, Any]) -> None:
    """A sample slime cannot crash on: FAILED, masked one-token response, numeric reward, removed from loss."""
    status = type(sample).Status
    model = exc.model if isinstance(exc, _EpisodeFailure) else None
    prompt_ids = (
        model.token_manager.token_ids[: model.token_manager.prompt_length] if model is not None else []
    )
    tokenizer = model.tokenizer if model is not None else None
    filler = getattr(tokenizer, "eos_token_id", None)
    if not prompt_ids:
        prompt_ids = list(sample.tokens or []) or [filler if isinstance(filler, int) else 0]
    filler_id = filler if isinstance(filler, int) else prompt_ids[-1]
    sample.tokens = [*prompt_ids, filler_id]
    sample.response_length = 1
    sample.loss_mask = [0]
    sample.rollout_log_probs = [0.0]
    sample.response = getattr(tokenizer, "eos_token", None) or ""
    sample.remove_sample = True
    sample.reward = 0.0
    sample.status = getattr(status, "FAILED", status.TRUNCATED)
    metrics.setdefault("termination", "failure")
    metrics["error"] = metrics.get("error") or f"{type(exc).__name__}: {exc}"
    metrics.setdefault("response_tokens", 1)
    metrics.setdefault("generated_tokens", 0)


def _discard_partial(sample: Any, metrics: dict[str, Any]) -> None:
    """A sample re-entering after an abort (partial rollout) restarts from its prompt."""
    previous = sample.metadata.get("strands", {}) if isinstance(sample.metadata, dict) else {}
    metrics["regenerations"] = int(previous.get("regenerations", 0)) + 1
    sample.tokens = []
    sample.response = ""
    sample.response_length = 0
    sample.loss_mask = None
    sample.rollout_log_probs = None
    sample.rollout_routed_experts = None
    sample.weight_versions = []
    sample.reward = None
    sample.status = type(sample).Status.PENDING


# -- inputs ----------------------------------------------------------------------------------------


def _split_prompt(prompt: Any, default_system: str) -> tuple[str | None, list[dict[str, Any]], Any]:
    """(system prompt, earlier messages, last user turn) from a string or a list of chat messages."""
    if isinstance(prompt, str):
        return default_system or None, [], prompt
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(
            f"sample.prompt must be a string or a non-empty list of messages, got {type(prompt).__name__}"
        )
    system = default_system or None
    messages = list(prompt)
    if messages[0].get("role") == "system":
        system = _text(messages.pop(0).get("content"))
    if not messages or messages[-1].get("role") != "user":
        raise ValueError("the prompt's last message must come from the user")
    history = []
    for message in messages[:-1]:
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise ValueError(f"unsupported role {role!r} in the prompt")
        history.append({"role": role, "content": [{"text": _text(message.get("content"))}]})
    return system, history, [{"text": _text(messages[-1].get("content"))}]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _sglang_params(sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh dict of the SGLang sampling params (slime shares one dict across eval samples)."""
    return {
        k: v
        for k, v in sampling_params.items()
        if k in SGLANG_SAMPLING_KEYS and k not in _DROPPED_SAMPLING_KEYS and v is not None
    }


def _arg(args: Any, name: str | None) -> Any:
    return getattr(args, name, None) if name else None


def _generate_state(args: Any) -> Any:
    """slime's GenerateState singleton, or None when slime is not installed (tests, offline use)."""
    try:
        from slime.rollout.sglang_rollout import GenerateState
    except ImportError:
        return None
    return GenerateState(args)


async def _load_tokenizer(path: str) -> Any:
    """Without slime: load the checkpoint's tokenizer once per process (off the event loop)."""
    if path not in _TOKENIZERS:
        from transformers import AutoTokenizer

        loop = asyncio.get_running_loop()
        _TOKENIZERS[path] = await loop.run_in_executor(
            None, functools.partial(AutoTokenizer.from_pretrained, path, trust_remote_code=True)
        )
    return _TOKENIZERS[path]


async def _context_length(args: Any, settings: PluginSettings) -> int | None:
    """Context window: plugin setting, then ``--rollout-max-context-len``, then the checkpoint's config."""
    explicit = settings.max_context_len or _arg(args, "rollout_max_context_len")
    if explicit:
        return int(explicit)
    path = _arg(args, "hf_checkpoint")
    if not path:
        return None  # the model asks the server
    if path not in _CONTEXT_LENGTHS:
        _CONTEXT_LENGTHS[path] = await asyncio.get_running_loop().run_in_executor(
            None, _config_context_length, path
        )
    return _CONTEXT_LENGTHS[path]


def _config_context_length(path: str) -> int | None:
    try:
        from transformers import AutoConfig

        value = getattr(
            AutoConfig.from_pretrained(path, trust_remote_code=True), "max_position_embeddings", None
        )
    except Exception:  # no config.json (tokenizer-only folder): ask the server instead
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


@functools.lru_cache(maxsize=32)
def _import_tool(path: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"tool path {path!r} must be dotted: package.module.tool")
    return getattr(importlib.import_module(module_name), attr)


def _load_tools(settings: PluginSettings) -> list[Any]:
    tools = [_import_tool(path) for path in settings.tools]
    if any(path.startswith("slime_strands.sandbox") for path in settings.tools):
        from .sandbox import configure_sandbox

        configure_sandbox(settings.sandbox)
    return tools


class _ToolStats(HookProvider):
    """Strands hook: wall time of tool batches and failed tool results (malformed calls counted elsewhere)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.errors = 0
        self._started: float | None = None

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolsEvent, self._before)
        registry.add_callback(AfterToolsEvent, self._after)
        registry.add_callback(AfterToolCallEvent, self._after_call)

    def _before(self, event: BeforeToolsEvent) -> None:
        self._started = time.perf_counter()

    def _after(self, event: AfterToolsEvent) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def _after_call(self, event: AfterToolCallEvent) -> None:
        if event.cancel_message is not None or event.tool_use.get("name") == INVALID_TOOL_NAME:
            return  # limits, aborts and malformed calls are not tool failures
        if (event.result or {}).get("status") == "error":
            self.errors += 1
