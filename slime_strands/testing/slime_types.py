"""A stand-in for slime's ``Sample`` (``slime.utils.types``) for tests and offline use.

slime is not on PyPI, so tests cannot import it. This class mirrors the real one (slime main, 624b824: field
names, order, types, defaults, ``Status`` members and values, the nested ``SpecInfo`` / ``PrefixCacheInfo``,
serialisation and ``append_response_tokens``, the appender every multi-turn example uses) in plain Python
and numpy instead of torch: top-p spans are lists of ints where slime keeps int32 tensors, routed experts a
numpy int32 array where slime keeps a tensor. It deliberately shares no code with the plugin, so tests can
compare the plugin's samples with what slime's own appender builds. :func:`load_sample_class` returns slime's
real class when slime is importable, so the same tests run against real slime where it exists.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

__all__ = ["Sample", "load_sample_class", "real_slime_available"]

_TOP_P_TOKEN_ID_META_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_TOKEN_OFFSET_META_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def decode_int32_meta_array(meta_info: dict[str, Any], keys: str | Iterable[str]) -> np.ndarray | None:
    """slime.utils.misc.decode_int32_meta_array: the first present key; base64 text, bytes or a sequence."""
    if isinstance(keys, str):
        keys = (keys,)
    for key in keys:
        if key in meta_info:
            value = meta_info[key]
            break
    else:
        return None
    if value is None:
        return None
    if isinstance(value, str):
        value = base64.b64decode(value.encode("ascii"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytearray(value), dtype=np.int32)
    return np.asarray(value, dtype=np.int32).reshape(-1)


def _extract_top_p(
    meta_info: dict[str, Any], expected_num_tokens: int | None
) -> tuple[list[int], list[int]] | None:
    token_ids = decode_int32_meta_array(meta_info, _TOP_P_TOKEN_ID_META_KEYS)
    offsets = decode_int32_meta_array(meta_info, _TOP_P_TOKEN_OFFSET_META_KEYS)
    if token_ids is None and offsets is None:
        return None
    if token_ids is None or offsets is None:
        raise ValueError("SGLang top-p token replay must include both token ids and offsets.")
    if offsets.size == 0 or int(offsets[0]) != 0:
        raise ValueError(f"SGLang top-p token offsets must start with 0, got {offsets[:1].tolist()}.")
    if int(offsets[-1]) != token_ids.size:
        raise ValueError(
            f"SGLang top-p token ids/offsets mismatch: offsets[-1]={int(offsets[-1])}, len(token_ids)={token_ids.size}."
        )
    if expected_num_tokens is not None and offsets.size != expected_num_tokens + 1:
        raise ValueError(
            "SGLang top-p token offsets length must equal generated token count + 1: "
            f"len(offsets)={offsets.size}, generated={expected_num_tokens}."
        )
    return [int(t) for t in token_ids], [int(o) for o in offsets]


@dataclass
class Sample:
    """Field-for-field mirror of ``slime.utils.types.Sample``."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        @property
        def spec_accept_rate(self) -> float:
            return (
                self.spec_accept_token_num / self.spec_draft_token_num
                if self.spec_draft_token_num > 0
                else 0.0
            )

        @property
        def spec_accept_length(self) -> float:
            return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct > 0 else 0.0

        def add(self, meta_info: dict) -> None:
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return dict(self.__dict__)

        @staticmethod
        def from_dict(data: dict) -> Sample.SpecInfo:
            names = Sample.SpecInfo.__dataclass_fields__
            return Sample.SpecInfo(**{k: data.get(k, 0) for k in names})

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        @property
        def prefix_cache_hit_rate(self) -> float:
            return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens > 0 else 0.0

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return dict(self.__dict__)

        @staticmethod
        def from_dict(data: dict) -> Sample.PrefixCacheInfo:
            return Sample.PrefixCacheInfo(data.get("cached_tokens", 0), data.get("total_prompt_tokens", 0))

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        """As slime serialises a sample: extra attributes (e.g. ``tool_iters``) included."""
        value = self.__dict__.copy()
        value["status"] = self.status.value
        value["spec_info"] = self.spec_info.to_dict()
        value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value

    @staticmethod
    def from_dict(data: dict) -> Sample:
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        data["spec_info"] = Sample.SpecInfo.from_dict(data.get("spec_info", {}))
        data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(data.get("prefix_cache_info", {}))
        names = set(Sample.__dataclass_fields__)
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    def get_reward_value(self, args: Any) -> Any:
        return self.reward if not getattr(args, "reward_key", None) else self.reward[args.reward_key]  # type: ignore[index]

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    # -- slime's appender ------------------------------------------------------------------------

    def append_response_tokens(
        self,
        args: Any = None,
        *,
        tokens: Any = None,
        log_probs: Any = None,
        trainable: bool = True,
        meta_info: dict | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Append response-side tokens keeping loss mask, logprobs, top-p spans, routed experts, weight
        versions, cache / spec stats and the status aligned (slime's semantics, step for step)."""
        tokens = [int(t) for t in (tokens if tokens is not None else [])]
        log_probs = None if log_probs is None else [float(v) for v in log_probs]
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        if tokens and not trainable:
            if log_probs is not None:
                raise ValueError("non-trainable response tokens should not pass rollout log probabilities.")
            log_probs = [0.0] * len(tokens)
        if text is not None:
            self.response += text
        previous_response_length = self.response_length
        if tokens:
            self.tokens += tokens
            self.response_length += len(tokens)
            if self.loss_mask is None:
                self.loss_mask = [1] * previous_response_length
            self.loss_mask += [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and previous_response_length:
                    raise ValueError(
                        "Cannot append trainable rollout log probabilities to a sample with existing response "
                        "tokens but no existing rollout_log_probs."
                    )
                self.rollout_log_probs = [0.0] * previous_response_length
            self.rollout_log_probs += log_probs
        should_pad_top_p = bool(tokens and not trainable)
        if meta_info is not None or should_pad_top_p:
            self._apply_meta_info(
                args,
                meta_info or {},
                new_token_count=len(tokens),
                pad_missing_top_p=should_pad_top_p,
                update_terminal_info=update_terminal_info,
            )
        self._validate_response_metadata_lengths()

    def _apply_meta_info(
        self,
        args: Any,
        meta_info: dict,
        *,
        new_token_count: int = 0,
        pad_missing_top_p: bool = False,
        update_terminal_info: bool = True,
    ) -> None:
        self._apply_top_p(meta_info, new_token_count, pad_missing_top_p)
        self._apply_routed_experts(args, meta_info)
        if update_terminal_info and "finish_reason" in meta_info:
            self._apply_terminal_info(args, meta_info)

    def _apply_top_p(self, meta_info: dict, new_token_count: int, pad_missing_top_p: bool) -> None:
        """The turn's top-p spans appended (shifted), or empty spans for its tokens when none came."""
        applied_top_p_data = False
        if new_token_count:
            top_p = _extract_top_p(meta_info, new_token_count)
            if top_p is not None:
                applied_top_p_data = True
                if self.rollout_top_p_token_ids is None and self.rollout_top_p_token_offsets is None:
                    self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = top_p
                else:
                    base_ids = list(self.rollout_top_p_token_ids or [])
                    base_offsets = list(self.rollout_top_p_token_offsets or [0])
                    shift = base_offsets[-1]
                    self.rollout_top_p_token_ids = base_ids + top_p[0]
                    self.rollout_top_p_token_offsets = base_offsets + [o + shift for o in top_p[1][1:]]
        if (
            pad_missing_top_p
            and new_token_count
            and self.rollout_top_p_token_offsets is not None
            and not applied_top_p_data
        ):
            if self.rollout_top_p_token_ids is None or not self.rollout_top_p_token_offsets:
                raise ValueError("Cannot append empty top-p spans without existing token ids and offsets.")
            last = self.rollout_top_p_token_offsets[-1]
            self.rollout_top_p_token_offsets = self.rollout_top_p_token_offsets + [last] * new_token_count

    def _apply_routed_experts(self, args: Any, meta_info: dict) -> None:
        """The turn's routing rows, replacing or extending the held ones from ``routed_experts_start_len``."""
        routed_experts = decode_int32_meta_array(meta_info, "routed_experts")
        if routed_experts is None:
            return
        if args is None:
            raise ValueError("args is required to decode routed experts metadata.")
        start_len = int(meta_info.get("routed_experts_start_len", 0) or 0)
        if start_len < 0:
            raise ValueError(f"SGLang routed_experts_start_len must be non-negative, got {start_len}.")
        expected_rows = max(0, len(self.tokens) - 1 - start_len)
        expected_numel = expected_rows * args.num_layers * args.moe_router_topk
        if routed_experts.size != expected_numel:
            raise ValueError(
                "SGLang routed_experts element count does not match sample tokens: "
                f"got={routed_experts.size}, expected={expected_numel} "
                f"(tokens={len(self.tokens)}, routed_experts_start_len={start_len}, "
                f"num_layers={args.num_layers}, moe_router_topk={args.moe_router_topk})."
            )
        routed_experts = routed_experts.reshape(expected_rows, args.num_layers, args.moe_router_topk)
        if start_len == 0:
            self.rollout_routed_experts = routed_experts
            return
        existing = self.rollout_routed_experts
        if existing is None:
            raise ValueError(
                "Cannot append partial routed experts without existing routed experts "
                f"(routed_experts_start_len={start_len})."
            )
        existing = np.asarray(existing, dtype=routed_experts.dtype)
        if existing.shape[0] < start_len:
            raise ValueError(
                "Existing routed experts shorter than routed_experts_start_len: "
                f"existing_rows={existing.shape[0]}, routed_experts_start_len={start_len}."
            )
        self.rollout_routed_experts = np.concatenate([existing[:start_len], routed_experts], axis=0)

    def _apply_terminal_info(self, args: Any, meta_info: dict) -> None:
        """What a finished turn says: speculative and prefix-cache stats, weight version, the status."""
        if getattr(args, "sglang_speculative_algorithm", False):
            self.spec_info.add(meta_info=meta_info)
        self.prefix_cache_info.add(meta_info=meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        match meta_info["finish_reason"]["type"]:
            case "length":
                self.status = Sample.Status.TRUNCATED
            case "abort":
                self.status = Sample.Status.ABORTED
            case "stop":
                self.status = Sample.Status.COMPLETED

    def _validate_response_metadata_lengths(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(
                f"loss_mask length {len(self.loss_mask)} != response_length {self.response_length}"
            )
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"rollout_log_probs length {len(self.rollout_log_probs)} != response_length {self.response_length}"
            )
        if self.rollout_top_p_token_ids is None and self.rollout_top_p_token_offsets is None:
            return
        if self.rollout_top_p_token_ids is None or self.rollout_top_p_token_offsets is None:
            raise ValueError("rollout top-p replay must include both token ids and offsets.")
        offsets = self.rollout_top_p_token_offsets
        if len(offsets) != self.response_length + 1:
            raise ValueError(
                "rollout_top_p_token_offsets length must equal response_length + 1: "
                f"len(offsets)={len(offsets)}, response_length={self.response_length}."
            )
        if int(offsets[-1]) != len(self.rollout_top_p_token_ids):
            raise ValueError(
                "rollout top-p token ids/offsets mismatch: "
                f"offsets[-1]={int(offsets[-1])}, len(token_ids)={len(self.rollout_top_p_token_ids)}."
            )


def real_slime_available() -> bool:
    """Whether ``slime.utils.types`` (the real package, not PyPI's unrelated ``slime``) imports."""
    try:
        from slime.utils.types import Sample as _  # noqa: F401
    except Exception:  # ImportError, or PyPI's unrelated `slime`, or a broken torch install
        return False
    return True


def load_sample_class() -> type:
    """slime's real ``Sample`` when importable, else this stand-in."""
    if real_slime_available():
        from slime.utils.types import Sample as RealSample

        return RealSample
    return Sample
