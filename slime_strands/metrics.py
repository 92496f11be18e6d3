"""Agent metrics for wandb: slime's rollout / eval log hooks.

    --custom-rollout-log-function-path slime_strands.metrics.log_rollout
    --custom-eval-rollout-log-function-path slime_strands.metrics.log_eval_rollout

Both aggregate each sample's ``metadata["strands"]`` (written by :func:`slime_strands.rollout.generate`),
log through slime's own tracking (so wandb / tensorboard get them on slime's step axis) and return False so
slime's default logging still runs. A logging problem never propagates: it is logged and the step goes on.

Keys (``<p>`` = ``rollout/strands`` or ``eval/strands/<dataset>``):
``<p>/<x>_mean|_p50|_p99|_max`` for turns, tool_calls, tool_iters, tool_time_s, generation_time_s,
wall_time_s, response_tokens; ``<p>/<x>_mean`` for client_overhead_s, prompt_tokens, generated_tokens;
``<p>/tool_error_rate`` (errors / tool calls), ``<p>/parse_errors_per_sample/<kind>``,
``<p>/termination/<reason>`` and ``<p>/status/<status>`` (fractions of samples), ``<p>/remove_sample_rate``,
``<p>/cache_hit_rate`` (cached / prompt tokens), ``<p>/tool_token_share`` (tool tokens / response tokens),
``<p>/tool_outputs_truncated_per_sample``, ``<p>/regenerated_rate``, ``<p>/samples``. Eval adds
``eval/strands/<dataset>/accuracy`` (reward == 1) and ``.../pass@<k>`` (unbiased, k = 1, 2, 4, ... <= n).
"""

from __future__ import annotations

import importlib
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["aggregate", "log_eval_rollout", "log_rollout", "pass_at_k"]

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
# Where slime keeps its tracking entry point across versions (newest first).
_LOGGING_MODULES = ("slime.observability.logging_utils", "slime.utils.logging_utils")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: probability that k of n samples (c correct) contain a correct one."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k) as a product: no huge binomials.
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
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


def _strands_meta(sample: Any) -> Mapping[str, Any] | None:
    metadata = getattr(sample, "metadata", None)
    meta = metadata.get("strands") if isinstance(metadata, Mapping) else None
    return meta if isinstance(meta, Mapping) else None


def aggregate(samples: Iterable[Any]) -> dict[str, float]:
    """Step-level agent metrics (un-prefixed keys) from samples; samples from other generators only count
    towards ``status/*``. Empty input gives an empty dict."""
    flat = _flatten(samples)
    if not flat:
        return {}
    out: dict[str, float] = {}
    statuses = Counter(getattr(getattr(s, "status", None), "value", "unknown") for s in flat)
    out.update({f"status/{name}": count / len(flat) for name, count in statuses.items()})
    metas = [m for m in map(_strands_meta, flat) if m is not None]
    if not metas:
        return out
    n = len(metas)
    out["samples"] = float(n)
    for key in _DISTRIBUTIONS:
        values = sorted(v for v in (_number(m.get(key)) for m in metas) if v is not None)
        if values:
            out[f"{key}_mean"] = sum(values) / len(values)
            out[f"{key}_p50"] = _percentile(values, 50)
            out[f"{key}_p99"] = _percentile(values, 99)
            out[f"{key}_max"] = values[-1]
    for key in _MEANS:
        values = [v for v in (_number(m.get(key)) for m in metas) if v is not None]
        if values:
            out[f"{key}_mean"] = sum(values) / len(values)

    def total(key: str) -> float:
        return sum(_number(m.get(key)) or 0.0 for m in metas)

    if total("tool_calls"):
        out["tool_error_rate"] = total("tool_errors") / total("tool_calls")
    if total("prompt_tokens"):
        out["cache_hit_rate"] = total("cached_tokens") / total("prompt_tokens")
    if total("response_tokens"):
        out["tool_token_share"] = 1.0 - total("generated_tokens") / total("response_tokens")
    out["tool_outputs_truncated_per_sample"] = total("tool_outputs_truncated") / n
    out["regenerated_rate"] = sum(1 for m in metas if (_number(m.get("regenerations")) or 0) > 0) / n
    parse_errors: Counter[str] = Counter()
    for m in metas:
        kinds = m.get("parse_errors")
        if isinstance(kinds, Mapping):
            parse_errors.update({str(k): int(_number(v) or 0) for k, v in kinds.items()})
    out.update({f"parse_errors_per_sample/{kind}": count / n for kind, count in parse_errors.items()})
    terminations = Counter(str(m.get("termination", "unknown")) for m in metas)
    out.update({f"termination/{reason}": count / n for reason, count in terminations.items()})
    with_meta = [s for s in flat if _strands_meta(s) is not None]
    out["remove_sample_rate"] = sum(bool(getattr(s, "remove_sample", False)) for s in with_meta) / n
    return out


def _eval_metrics(name: str, entry: Mapping[str, Any], args: Any) -> dict[str, float]:
    prefix = f"eval/strands/{name}/"
    samples = _flatten(entry.get("samples"))
    out = {prefix + k: v for k, v in aggregate(samples).items()}
    rewards = [_number(r) for r in entry.get("rewards") or []]
    if not rewards:
        rewards = [_number(getattr(s, "reward", None)) for s in samples]
    correct = [r == 1.0 for r in rewards]
    if not correct:
        return out
    out[prefix + "accuracy"] = sum(correct) / len(correct)
    groups: dict[Any, list[bool]] = defaultdict(list)
    if len(samples) == len(correct) and all(getattr(s, "group_index", None) is not None for s in samples):
        for s, ok in zip(samples, correct, strict=True):
            groups[s.group_index].append(ok)
    else:  # slime orders eval samples prompt by prompt
        size = int(getattr(args, "n_samples_per_eval_prompt", 0) or 1)
        for i, ok in enumerate(correct):
            groups[i // size].append(ok)
    n = min(len(g) for g in groups.values())
    k = 1
    while k <= n:
        out[prefix + f"pass@{k}"] = sum(pass_at_k(len(g), sum(g), k) for g in groups.values()) / len(groups)
        k *= 2
    return out


def _rollout_step(args: Any, rollout_id: int) -> int:
    """slime's step axis (``compute_rollout_step``): rollout id, or train steps with
    ``--wandb-always-use-train-step``."""
    try:
        from slime.utils.metric_utils import compute_rollout_step

        return int(compute_rollout_step(args, rollout_id))
    except Exception:
        if getattr(args, "wandb_always_use_train_step", False):
            return rollout_id * args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
        return rollout_id


def _emit(args: Any, metrics: dict[str, float], step_key: str) -> None:
    """Through slime's tracking when slime is installed; else the Python log (offline use, tests)."""
    for module_name in _LOGGING_MODULES:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            continue
        if hasattr(module, "log"):
            module.log(args, metrics, step_key=step_key)
            return
    logger.info("slime-strands metrics: %s", metrics)


def log_rollout(
    rollout_id: int, args: Any, samples: Any, rollout_extra_metrics: Any = None, rollout_time: Any = None
) -> bool:
    """slime's rollout log hook: logs ``rollout/strands/*``; returns False (slime's own logging still runs)."""
    try:
        metrics = {f"rollout/strands/{k}": v for k, v in aggregate(samples).items()}
        if metrics:
            metrics["rollout/step"] = _rollout_step(args, rollout_id)
            _emit(args, metrics, step_key="rollout/step")
    except Exception:
        logger.warning("slime-strands: rollout metrics failed (training continues)", exc_info=True)
    return False


def log_eval_rollout(rollout_id: int, args: Any, data: Any, extra_metrics: Any = None) -> bool:
    """slime's eval log hook: per dataset accuracy, pass@k and agent metrics; returns False."""
    try:
        metrics: dict[str, float] = {}
        for name, entry in (data or {}).items():
            if isinstance(entry, Mapping):
                metrics.update(_eval_metrics(str(name), entry, args))
        if metrics:
            metrics["eval/step"] = _rollout_step(args, rollout_id)
            _emit(args, metrics, step_key="eval/step")
    except Exception:
        logger.warning("slime-strands: eval metrics failed (training continues)", exc_info=True)
    return False
