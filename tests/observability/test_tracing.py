from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from observability.logging import log_context
from observability.tracing import NOOP_SPAN, configure_tracing, reset_tracing, span, tracing_enabled
from tests.world import make_agent


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    configure_tracing(exporter=memory, batch=False)
    yield memory
    reset_tracing()


def test_turn_spans_nest_and_carry_attributes(exporter: InMemorySpanExporter) -> None:
    with log_context(session_id="s-1", turn_id=7):
        with span("turn", agent="booker"):
            with span("retrieval"):
                pass
            with span("context.build"):
                pass
            with span("llm.call", purpose="chat", model=None) as current:
                current.set_attribute("tokens.prompt", 812)
            with span("tool", name="search_flights"):
                pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"turn", "retrieval", "context.build", "llm.call", "tool"}
    turn = spans["turn"]
    for child in ("retrieval", "context.build", "llm.call", "tool"):
        assert spans[child].parent is not None
        assert spans[child].parent.span_id == turn.context.span_id
        assert spans[child].context.trace_id == turn.context.trace_id
    assert turn.attributes["agent"] == "booker"
    assert turn.attributes["app.session_id"] == "s-1"
    assert turn.attributes["app.turn_id"] == 7
    assert spans["llm.call"].attributes["purpose"] == "chat"
    assert spans["llm.call"].attributes["tokens.prompt"] == 812
    assert "model" not in spans["llm.call"].attributes
    assert spans["tool"].attributes["name"] == "search_flights"


def test_an_error_is_recorded_and_reraised(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError, match="boom"):
        with span("tool", name="broken"):
            raise ValueError("boom")
    (finished,) = exporter.get_finished_spans()
    assert finished.status.status_code is StatusCode.ERROR
    assert any(event.name == "exception" for event in finished.events)


def test_off_without_an_endpoint(settings: pytest.FixtureRequest) -> None:
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = ""  # type: ignore[attr-defined]
    reset_tracing()
    try:
        assert tracing_enabled() is False
        with span("turn", session_id="x") as current:
            assert current is NOOP_SPAN
            current.set_attribute("ignored", 1)
    finally:
        reset_tracing()


def test_on_with_an_endpoint(settings: pytest.FixtureRequest) -> None:
    # Nothing listens there; the batch exporter only sends in the background, and shutdown gives up quickly.
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = "http://127.0.0.1:9/"  # type: ignore[attr-defined]
    settings.OTEL_EXPORTER_OTLP_TIMEOUT = 0.2  # type: ignore[attr-defined]
    reset_tracing()
    try:
        assert tracing_enabled() is True
        with span("turn") as current:
            assert current is not NOOP_SPAN
            assert current.is_recording()
    finally:
        reset_tracing()


@pytest.mark.django_db
def test_a_turns_spans_speak_the_genai_conventions(exporter: InMemorySpanExporter, alice: Any, settings: Any) -> None:
    """A turn on a real OpenAI-compatible HTTP endpoint (the local fake): its model call's span carries
    gen_ai.* attributes and is named as the conventions say; retrieval says it searched memory."""
    from orchestrator.runtime import turn_run
    from sessions.services import session_create
    from tests.fakes.openai_server import FakeOpenAIServer, stream

    with FakeOpenAIServer() as server:
        settings.LLM_PROFILES = {"default": server.profile(max_retries=0)}
        server.enqueue(stream("Hello there."))
        agent = make_agent("chat")
        turn_run(session=session_create(user=alice, agent=agent), message="Hi")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    call = spans["chat fake-model"]
    attrs = call.attributes
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.model"] == "fake-model"
    assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
    assert list(attrs["gen_ai.response.finish_reasons"]) == ["stop"]
    assert spans["retrieval"].attributes["gen_ai.operation.name"] == "search_memory"
    assert call.parent is not None and call.parent.span_id == spans["turn"].context.span_id
