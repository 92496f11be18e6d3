"""RecordingOnlyTracer: the agents slime-strands builds skip Strands' message payloads for spans nobody
records, and record exactly Strands' spans and events when OpenTelemetry does."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from helpers import Call, ModelTurn, final, make_model
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from rollout_tools import add
from strands.telemetry import tracer as strands_tracer

from slime_strands.agent.episode import build_agent
from slime_strands.agent.tracing import RecordingOnlyTracer, use_recording_only_tracer
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_trajectory_invariants

SCRIPT = [
    ModelTurn(reasoning="add them", calls=[Call("add", {"a": 2, "b": 3})]),
    ModelTurn(reasoning="again", calls=[Call("add", {"a": 5, "b": 1}), Call("add", {"a": 1, "b": 1})]),
    final("The sum is 6."),
]


@pytest.fixture
def process_tracer():
    """Restores Strands' process-wide tracer after the test."""
    saved = strands_tracer._tracer_instance
    yield
    strands_tracer._tracer_instance = saved


def _with_provider(tracer: Any, provider: TracerProvider) -> Any:
    """A tracer that records into ``provider`` (as if it were the global provider), set process-wide."""
    tracer.tracer_provider = provider
    tracer.tracer = provider.get_tracer(tracer.service_name)
    strands_tracer._tracer_instance = tracer
    return tracer


def _run(tokenizer, tracer_factory) -> tuple[list[Any], Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with SGLangTestServer(tokenizer) as server:
        server.script(*(turn.text() for turn in SCRIPT))
        model = make_model(tokenizer, server)
        agent = build_agent(model, tools=[add], system_prompt="You add numbers.")
        agent.tracer = _with_provider(tracer_factory(), provider)  # the agent's span, and every other span
        result = asyncio.run(agent.invoke_async("What is 2 + 3, then 5 + 1 and 1 + 1?"))
        assert "The sum is 6." in str(result)
        assert_trajectory_invariants(model.token_manager, server=server)
    return exporter.get_finished_spans(), model


_VOLATILE = re.compile(r"call_[0-9a-f]+|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _shape(spans: list[Any]) -> list[Any]:
    """Spans by name with their attributes and events, times and generated ids left out."""

    def clean(attributes: Any) -> dict[str, Any]:
        return {
            k: _VOLATILE.sub("<id>", str(v))
            for k, v in dict(attributes or {}).items()
            if "time" not in k and "latency" not in k and "duration" not in k
        }

    return [
        (span.name, clean(span.attributes), [(e.name, clean(e.attributes)) for e in span.events])
        for span in sorted(spans, key=lambda s: (s.start_time, s.name))
    ]


def test_agents_we_build_use_the_recording_only_tracer(process_tracer):
    strands_tracer._tracer_instance = None
    assert use_recording_only_tracer()
    assert isinstance(strands_tracer.get_tracer(), RecordingOnlyTracer)
    installed = strands_tracer.get_tracer()
    assert use_recording_only_tracer() and strands_tracer.get_tracer() is installed, "idempotent"


def test_a_tracer_class_of_the_process_is_kept(process_tracer):
    class Custom(strands_tracer.Tracer):
        pass

    custom = Custom()
    strands_tracer._tracer_instance = custom
    assert not use_recording_only_tracer()
    assert strands_tracer.get_tracer() is custom


def test_recording_spans_get_exactly_strands_events(tokenizer, process_tracer):
    stock, _ = _run(tokenizer, strands_tracer.Tracer)
    ours, model = _run(tokenizer, RecordingOnlyTracer)
    assert model.stats.turns == 3
    names = [s.name for s in ours]
    assert names.count("chat") == 3 and "invoke_agent" in " ".join(names) and "execute_tool add" in names
    chat = next(s for s in ours if s.name == "chat")
    assert any(e.name == "gen_ai.user.message" for e in chat.events), "the conversation is recorded"
    assert _shape(ours) == _shape(stock)


def test_spans_a_sampler_drops_cost_no_payload(tokenizer, process_tracer):
    """A non-recording span gets no payload built: messages that cannot even be iterated are not touched."""

    class Unreadable(list):
        def __iter__(self):
            raise AssertionError("the tracer read the messages of a span nobody records")

    provider = TracerProvider(sampler=ALWAYS_OFF)
    tracer = _with_provider(RecordingOnlyTracer(), provider)
    span = tracer.start_model_invoke_span(messages=Unreadable(), system_prompt="secret", model_id="m")
    assert not span.is_recording()
    stock = _with_provider(strands_tracer.Tracer(), provider)
    with pytest.raises(AssertionError, match="nobody records"):
        stock.start_model_invoke_span(messages=Unreadable(), model_id="m")


def test_an_episode_runs_with_the_recording_only_tracer(tokenizer, process_tracer):
    """Without any tracer provider (the default): spans do not record and the episode runs as before."""
    strands_tracer._tracer_instance = None
    with SGLangTestServer(tokenizer) as server:
        server.script(*(turn.text() for turn in SCRIPT))
        model = make_model(tokenizer, server)
        agent = build_agent(model, tools=[add])
        assert isinstance(strands_tracer.get_tracer(), RecordingOnlyTracer)
        assert "The sum is 6." in str(asyncio.run(agent.invoke_async("Add 2 and 3, then 5+1, 1+1.")))
        assert_trajectory_invariants(model.token_manager, server=server)
        assert model.stats.turns == 3
