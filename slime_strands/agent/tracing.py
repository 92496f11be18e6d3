"""Strands' tracer without the work nobody records: message payloads are built only for recording spans.

Strands' ``Tracer`` (``strands.telemetry.tracer``) starts a span for every event-loop cycle and every model
call and, BEFORE knowing whether anything records it, serialises the whole conversation into span events
(``_add_event_messages``: one JSON dump per message, through a custom encoder) and the system prompt
(``_add_system_prompt_event``). Without an OpenTelemetry SDK tracer provider (the default: OTel's API hands
out non-recording spans) or with a sampler that drops the span, ``span.add_event`` discards it all: the
work is O(history) per model call for nothing (about 10% of a turn's CPU at 512 agents, and growing with
the trajectory).

:class:`RecordingOnlyTracer` is that ``Tracer`` with one change: those two methods return at once for a span
that is not recording (``span.is_recording()``, OTel's documented test for exactly this: "avoid expensive
computations of span attributes"). Recording spans get exactly Strands' events. The decision is taken per
span, so a tracer provider configured later (``StrandsTelemetry().setup_otlp_exporter()``) is traced in full.

Strands reads its tracer from a process-wide singleton (``get_tracer()``, used by the event loop, the tool
executor and ``Agent``): :func:`use_recording_only_tracer` puts a ``RecordingOnlyTracer`` there, unless the
process already installed a tracer of its own class. It relies on two private names of strands-agents
(the singleton and the two methods); when they are gone it does nothing and Strands keeps its own tracer.
"""

from __future__ import annotations

import logging
from typing import Any

from strands.telemetry import tracer as strands_tracer

__all__ = ["RecordingOnlyTracer", "use_recording_only_tracer"]

logger = logging.getLogger(__name__)

_HOOKS = ("_add_event_messages", "_add_system_prompt_event")


class RecordingOnlyTracer(strands_tracer.Tracer):
    """Strands' ``Tracer`` that builds message and system-prompt events only for spans that record them."""

    def _add_event_messages(self, span: Any, messages: Any) -> None:
        if span is not None and span.is_recording():
            super()._add_event_messages(span, messages)

    def _add_system_prompt_event(
        self, span: Any, system_prompt: str | None = None, system_prompt_content: list[Any] | None = None
    ) -> None:
        if span is not None and span.is_recording():
            super()._add_system_prompt_event(span, system_prompt, system_prompt_content)


def use_recording_only_tracer() -> bool:
    """Make Strands' process-wide tracer a :class:`RecordingOnlyTracer` (idempotent). A tracer of another
    class set by the process is kept. Returns whether the process-wide tracer is a RecordingOnlyTracer."""
    if not hasattr(strands_tracer, "_tracer_instance") or not all(
        callable(getattr(strands_tracer.Tracer, name, None)) for name in _HOOKS
    ):
        logger.debug("strands-agents changed its tracer internals: its own Tracer is kept")
        return False
    current = strands_tracer._tracer_instance
    if isinstance(current, RecordingOnlyTracer):
        return True
    if current is not None and type(current) is not strands_tracer.Tracer:
        return False
    strands_tracer._tracer_instance = RecordingOnlyTracer()  # type: ignore[assignment]
    return True
