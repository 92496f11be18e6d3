"""A stand-in for slime's ``Sample`` (``slime.utils.types``) for tests and offline use.

slime is not on PyPI, so tests cannot import it. This class mirrors the real one (slime 0.3.x: field
names, types, defaults, ``Status`` members and values, the nested ``SpecInfo`` / ``PrefixCacheInfo``
and the helpers the rollout path touches) without importing torch. :func:`load_sample_class` returns
slime's real class when slime is importable, so the same tests run against real slime where it exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["Sample", "load_sample_class", "real_slime_available"]


@dataclass
class Sample:
    """Field-for-field mirror of ``slime.utils.types.Sample``."""

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    mopd_teacher_log_probs: dict[str, list[float]] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

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
