"""Agent metrics for wandb: slime's rollout / eval log hooks.

    --custom-rollout-log-function-path slime_strands.metrics.log_rollout
    --custom-eval-rollout-log-function-path slime_strands.metrics.log_eval_rollout

slime's RolloutManager calls them positionally: ``fn(rollout_id, args, samples, rollout_extra_metrics,
rollout_time)`` with the step's flat list of Samples, and ``fn(rollout_id, args, data, extra_metrics)`` with
``data = {dataset: {"rewards": [...], "truncated": [...], "samples": [...]}}`` (eval samples in prompt order,
``n_samples_per_eval_prompt`` per prompt). Both aggregate each sample's
:class:`~slime_strands.agent.record.EpisodeRecord` (written by :func:`slime_strands.rollout.generate`), log through slime's own tracking (wandb / tensorboard, on slime's
``rollout/step`` / ``eval/step`` axes) and return False so slime's default logging still runs. Without slime
the dict goes to the Python log. A logging problem never propagates: it is logged and the step goes on.

Keys (``<p>`` = ``rollout/strands`` or ``eval/strands/<dataset>``):
``<p>/<x>_mean|_p50|_p99|_max`` (nearest-rank percentiles) for turns, tool_calls, tool_iters, tool_time_s,
generation_time_s, wall_time_s, response_tokens; ``<p>/<x>_mean`` for client_overhead_s, prompt_tokens,
generated_tokens; ``<p>/tool_error_rate`` (failed runs / tool calls; malformed calls are not failures);
``<p>/parse_errors_per_sample/<kind>`` (malformed calls of that kind per sample: ``inside_reasoning`` calls
never become attempts, so a per-attempt rate would not be a rate); ``<p>/termination/<reason>`` and
``<p>/status/<status>`` (fractions of samples: status counts every sample, everything else only samples that
carry an episode record; termination names come from ``record.TREATMENTS``); ``<p>/remove_sample_rate``; ``<p>/cache_hit_rate`` (cached / prompt tokens);
``<p>/tool_token_share`` (tool tokens / response tokens); ``<p>/tool_outputs_truncated_per_sample``;
``<p>/regenerated_rate``; ``<p>/samples`` (episodes). ``rollout/strands/context_window``: the server's context
window the process sizes turns by (what the server reports, or what a refusal named and nothing it served
contradicts; a change is logged at WARNING too), once an episode of this configuration ran in the process.
Long-horizon episodes (``context_management``, ``collect_subagents``): ``<p>/segments_mean|_p50|_p99|_max`` (samples per episode: trajectory segments),
``<p>/compactions_mean`` and ``<p>/compacted_rate`` (episodes compacted at least once),
``<p>/tokens_saved_mean`` (tokens the compactions of an episode removed from its context) and
``<p>/tokens_saved_per_compaction``, ``<p>/subagents_mean`` (collected sub-agent segments per episode).
Partial rollout (episodes continued where slime's abort stopped them): ``<p>/continued_episodes`` and
``<p>/continued_rate``, ``<p>/continued_more_than_once`` (episodes), ``<p>/turns_saved`` (turns the continuations
did not generate again, summed over the step's episodes) and ``<p>/turns_saved_mean`` (per continued
episode), ``<p>/offpolicy_masked_tokens`` (generated tokens ``--mask-offpolicy-in-partial-rollout`` took out of
the loss) and ``<p>/offpolicy_masked_share`` (of the generated tokens).
An episode of several samples is counted once, from the sample that holds its last segment (every sibling
carries the episode's record); ``status/*`` counts every sample, as slime's trainer sees them. Eval adds ``eval/strands/<dataset>/accuracy`` (reward == 1) and
``.../pass@<k>`` (unbiased; k = 1, 2, 4, ... up to the samples per prompt, averaged over the prompts with at
least k samples, as slime's ``--log-passrate`` does).
"""

from __future__ import annotations

import importlib
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._slime.config import SlimeConfig
from ._slime.staleness import staleness_metrics
from .agent.record import EpisodeRecord, has_malformed_record
from .errors import SlimeStrandsError
from .strict_reader import is_number
from .workers import worker_metrics

__all__ = [
    "SERVER_KEYS",
    "aggregate",
    "log_eval_rollout",
    "log_rollout",
    "mean_pass_at_k",
    "pass_at_k",
    "server_metrics",
]

logger = logging.getLogger(__name__)

_DISTRIBUTIONS = (
    "turns",
    "tool_calls",
    "tool_iters",
    "tool_time_s",
    "generation_time_s",
    "wall_time_s",
    "response_tokens",
)
_MEANS = ("client_overhead_s", "prompt_tokens", "generated_tokens")
SERVER_KEYS = ("context_window",)
"""Rollout keys read from the process's client (:func:`server_metrics`), not from the samples."""
# Where slime keeps ``log(args, metrics, step_key)`` and ``compute_rollout_step(args, rollout_id)`` across
# versions (newest first).
_LOGGING_MODULES = (
    "slime.observability.logging_utils",
    "slime.utils.logging_utils",
    "slime.utils.tracking_utils",
)
_STEP_MODULES = ("slime.observability.metric_utils", "slime.utils.metric_utils")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: probability that k of n samples (c correct) contain a correct one."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k) as a product: no huge binomials.
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def mean_pass_at_k(groups: Iterable[Sequence[bool]], k: int) -> float:
    """:func:`pass_at_k` averaged over the groups (one per prompt: its samples' correctness) holding at least
    ``k`` samples, as slime's ``--log-passrate`` averages it; ValueError when none does."""
    eligible = [group for group in groups if len(group) >= k]
    if not eligible:
        raise ValueError(f"pass@{k} needs a prompt with at least {k} samples")
    return sum(pass_at_k(len(g), sum(g), k) for g in eligible) / len(eligible)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def _number(value: Any) -> float | None:
    if not is_number(value, finite=True):
        return None
    return float(value)


def _flatten(samples: Any) -> list[Any]:
    """slime passes a flat list; some paths pass groups (lists of samples): accept both."""
    out: list[Any] = []
    for item in samples or []:
        if isinstance(item, (list, tuple)):
            out.extend(_flatten(item))
        else:
            out.append(item)
    return out


def aggregate(samples: Iterable[Any]) -> dict[str, float]:
    """Step-level agent metrics (un-prefixed keys) from samples; samples from other generators only count
    towards ``status/*``. Empty input gives an empty dict."""
    flat = _flatten(samples)
    if not flat:
        return {}
    out: dict[str, float] = {}
    statuses = Counter(getattr(getattr(s, "status", None), "value", "unknown") for s in flat)
    out.update({f"status/{name}": count / len(flat) for name, count in statuses.items()})
    pairs = [(s, r) for s in flat if (r := EpisodeRecord.of(s)) is not None and r.closes_episode]
    if not pairs:
        return out
    records = [r for _, r in pairs]
    n = len(records)
    out["samples"] = float(n)
    for key in _DISTRIBUTIONS:
        out.update(_distribution(key, [_number(getattr(r, key)) for r in records]))
    out.update(_distribution("segments", [float(max(1, len(r.segments))) for r in records]))
    for key in _MEANS:
        out[f"{key}_mean"] = sum(float(getattr(r, key)) for r in records) / n

    def total(key: str) -> float:
        return float(sum(getattr(r, key) for r in records))

    if total("tool_calls"):
        out["tool_error_rate"] = total("tool_errors") / total("tool_calls")
    if total("prompt_tokens"):
        out["cache_hit_rate"] = total("cached_tokens") / total("prompt_tokens")
    if total("response_tokens"):
        out["tool_token_share"] = 1.0 - total("generated_tokens") / total("response_tokens")
    out["tool_outputs_truncated_per_sample"] = total("tool_outputs_truncated") / n
    compactions = total("compactions")
    out["compactions_mean"] = compactions / n
    out["compacted_rate"] = sum(1 for r in records if r.compactions) / n
    out["tokens_saved_mean"] = total("tokens_saved") / n
    if compactions:
        out["tokens_saved_per_compaction"] = total("tokens_saved") / compactions
    out["subagents_mean"] = total("subagents") / n
    out["regenerated_rate"] = sum(1 for r in records if r.regenerations > 0) / n
    out.update(_continuation_metrics(records))
    out.update(staleness_metrics(records))
    parse_errors: Counter[str] = Counter()
    for r in records:
        parse_errors.update(r.parse_errors)
    out.update({f"parse_errors_per_sample/{kind}": count / n for kind, count in parse_errors.items()})
    terminations = Counter(r.treatment.metric for r in records)
    out.update({f"termination/{name}": count / n for name, count in terminations.items()})
    out["remove_sample_rate"] = sum(bool(getattr(s, "remove_sample", False)) for s, _ in pairs) / n
    return out


def server_metrics(args: Any) -> dict[str, float]:
    """What the process knows of the server (un-prefixed :data:`SERVER_KEYS`): the context window its client
    sizes turns by, once an episode of this configuration ran here and the window is known."""
    try:
        window = SlimeConfig.of(args).served_window
    except (AttributeError, SlimeStrandsError):  # not args this plugin ran with (no router, bad settings)
        return {}
    return {} if window is None else {"context_window": float(window)}


def _continuation_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Partial rollout: how many episodes continued, the turns that saved, what off-policy masking took."""
    continued = [r for r in records if r.continuations]
    out = {
        "continued_episodes": float(len(continued)),
        "continued_rate": len(continued) / len(records),
        "continued_more_than_once": float(sum(r.continuations > 1 for r in continued)),
        "turns_saved": float(sum(r.turns_saved for r in continued)),
        "offpolicy_masked_tokens": float(sum(r.offpolicy_masked_tokens for r in records)),
    }
    if continued:
        out["turns_saved_mean"] = out["turns_saved"] / len(continued)
    generated = sum(r.generated_tokens for r in records)
    if generated:
        out["offpolicy_masked_share"] = out["offpolicy_masked_tokens"] / generated
    return out


def _distribution(key: str, numbers: Iterable[float | None]) -> dict[str, float]:
    values = sorted(v for v in numbers if v is not None)
    if not values:
        return {}
    return {
        f"{key}_mean": sum(values) / len(values),
        f"{key}_p50": _percentile(values, 50),
        f"{key}_p99": _percentile(values, 99),
        f"{key}_max": values[-1],
    }


def _eval_metrics(name: str, entry: Mapping[str, Any], args: Any) -> dict[str, float]:
    prefix = f"eval/strands/{name}/"
    samples = _flatten(entry.get("samples"))
    out = {prefix + k: v for k, v in aggregate(samples).items()}
    rewards = [_number(r) for r in entry.get("rewards") or []]
    if not rewards:
        rewards = [_number(getattr(s, "reward", None)) for s in samples]
    if all(r is None for r in rewards):  # nothing graded (or not a scalar reward): no accuracy to report
        return out
    correct = [r == 1.0 for r in rewards]
    out[prefix + "accuracy"] = sum(correct) / len(correct)
    groups: dict[Any, list[bool]] = defaultdict(list)
    if len(samples) == len(correct) and all(getattr(s, "group_index", None) is not None for s in samples):
        for s, ok in zip(samples, correct, strict=True):
            groups[s.group_index].append(ok)
    else:  # slime's eval leaves group_index unset and orders samples prompt by prompt
        size = _eval_group_size(args, name)
        for i, ok in enumerate(correct):
            groups[i // size].append(ok)
    k, largest = 1, max(len(g) for g in groups.values())
    while k <= largest:
        out[prefix + f"pass@{k}"] = mean_pass_at_k(groups.values(), k)
        k *= 2
    return out


def _eval_group_size(args: Any, name: str) -> int:
    """Samples per prompt of one eval dataset: its ``--eval-config`` entry, else the global flag."""
    for cfg in getattr(args, "eval_datasets", None) or []:
        cfg_name = cfg.get("name") if isinstance(cfg, Mapping) else getattr(cfg, "name", None)
        if cfg_name == name:
            n = cfg.get("n_samples_per_eval_prompt") if isinstance(cfg, Mapping) else None
            n = n if n is not None else getattr(cfg, "n_samples_per_eval_prompt", None)
            if n:
                return max(1, int(n))
    return max(1, int(getattr(args, "n_samples_per_eval_prompt", 0) or 1))


def _slime_function(modules: Sequence[str], name: str) -> Any:
    """``name`` from the first of ``modules`` that imports and has it; None without slime."""
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            continue
        function = getattr(module, name, None)
        if callable(function):
            return function
    return None


def _rollout_step(args: Any, rollout_id: int) -> int:
    """slime's step axis (``compute_rollout_step``): the rollout id, or train steps with
    ``--wandb-always-use-train-step``."""
    compute = _slime_function(_STEP_MODULES, "compute_rollout_step")
    if compute is not None:
        try:
            return int(compute(args, rollout_id))
        except Exception:
            pass
    if getattr(args, "wandb_always_use_train_step", False):
        try:
            return rollout_id * args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
        except Exception:
            pass
    return rollout_id


def _emit(args: Any, metrics: dict[str, float], rollout_id: int, step_key: str) -> None:
    """``metrics`` (if any) at slime's step ``step_key``: through slime's tracking when slime is installed,
    else the Python log (offline use, tests)."""
    if not metrics:
        return
    metrics[step_key] = _rollout_step(args, rollout_id)
    log = _slime_function(_LOGGING_MODULES, "log")
    if log is not None:
        log(args, metrics, step_key=step_key)
    else:
        logger.info("slime-strands metrics: %s", metrics)


def _warn_malformed(samples: list[Any]) -> None:
    """A ``metadata["strands"]`` that is not an episode record is a writer bug: say so, do not drop it silently."""
    bad = sum(has_malformed_record(s) for s in samples)
    if bad:
        logger.warning("slime-strands: %d sample(s) with a malformed metadata['strands'] skipped", bad)


def log_rollout(
    rollout_id: int, args: Any, samples: Any, rollout_extra_metrics: Any = None, rollout_time: Any = None
) -> bool:
    """slime's rollout log hook: logs ``rollout/strands/*``; returns False (slime's logging still runs)."""
    try:
        flat = _flatten(samples)
        _warn_malformed(flat)
        found = {
            **aggregate(flat),
            **server_metrics(args),
            **worker_metrics(),
        }  # records came back from workers
        metrics = {f"rollout/strands/{k}": v for k, v in found.items()}
        _emit(args, metrics, rollout_id, step_key="rollout/step")
    except Exception:
        logger.warning("slime-strands: rollout metrics failed (training continues)", exc_info=True)
    return False


def log_eval_rollout(rollout_id: int, args: Any, data: Any, extra_metrics: Any = None) -> bool:
    """slime's eval log hook: per dataset accuracy, pass@k and agent metrics; returns False."""
    try:
        metrics: dict[str, float] = {}
        for name, entry in (data or {}).items():
            if isinstance(entry, Mapping):
                _warn_malformed(_flatten(entry.get("samples")))
                metrics.update(_eval_metrics(str(name), entry, args))
        _emit(args, metrics, rollout_id, step_key="eval/step")
    except Exception:
        logger.warning("slime-strands: eval metrics failed (training continues)", exc_info=True)
    return False
