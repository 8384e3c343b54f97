"""OpenTelemetry traces of each turn, exported over OTLP/HTTP when an endpoint is configured.

``span(name, **attributes)`` is the one function the runtime calls::

    with span("turn", session_id=str(session.id)):
        with span("llm.call", purpose="chat") as s:
            s.set_attribute("tokens.prompt", 812)

With ``OTEL_EXPORTER_OTLP_ENDPOINT`` unset, tracing is off: ``span`` yields a shared no-op
object and costs one settings lookup per process plus a function call. The provider is
built lazily on the first span of each process (web workers and Celery workers fork, and a
span processor's export thread must belong to the process that uses it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from observability.logging import current_log_context

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, Any] = {"configured": False, "tracer": None, "provider": None}


class NoopSpan:
    """Stands in for a span when tracing is off: accepts and drops everything."""

    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        return None

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        return None

    def record_exception(self, exception: BaseException, attributes: dict[str, Any] | None = None) -> None:
        return None

    def is_recording(self) -> bool:
        return False


NOOP_SPAN = NoopSpan()


def _attribute(value: Any) -> Any:
    # OpenTelemetry accepts str/bool/int/float (and sequences of them); anything else becomes text.
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str | bool | int | float) for v in value):
        return list(value)
    return str(value)


def _otlp_traces_endpoint(base: str) -> str:
    # The standard variable names the collector's base URL; the HTTP exporter wants the traces path.
    base = base.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


def configure_tracing(
    *, exporter: SpanExporter | None = None, service_name: str | None = None, batch: bool | None = None
) -> TracerProvider | None:
    """Set up the tracer for this process; returns the provider, or ``None`` when tracing stays off.

    With no ``exporter``, one is made from ``settings.OTEL_EXPORTER_OTLP_ENDPOINT`` (unset: off).
    Tests pass an in-memory exporter; spans are then exported synchronously (``batch=False``).
    """
    from django.conf import settings
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    with _lock:
        old = _state.get("provider")
        if old is not None:
            old.shutdown()
        _state.update(configured=True, tracer=None, provider=None)
        if exporter is None:
            endpoint = getattr(settings, "OTEL_EXPORTER_OTLP_ENDPOINT", "") or ""
            if not endpoint:
                return None
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(
                endpoint=_otlp_traces_endpoint(endpoint),
                timeout=float(getattr(settings, "OTEL_EXPORTER_OTLP_TIMEOUT", 5.0)),
            )
            if batch is None:
                batch = True
        name = service_name or getattr(settings, "OTEL_SERVICE_NAME", "") or "agent-runtime"
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
        _state.update(provider=provider, tracer=provider.get_tracer("observability"))
        logger.info("tracing on", extra={"otel_service": name})
        return provider


def reset_tracing() -> None:
    """Turn tracing off and forget the provider; the next ``span`` reads the settings again."""
    with _lock:
        provider = _state.get("provider")
        if provider is not None:
            provider.shutdown()
        _state.update(configured=False, tracer=None, provider=None)


def _tracer() -> Tracer | None:
    if not _state["configured"]:
        try:
            configure_tracing()
        except Exception:  # a broken exporter must never break a turn
            logger.exception("tracing setup failed; tracing stays off")
            _state.update(configured=True, tracer=None, provider=None)
    return _state["tracer"]


def tracing_enabled() -> bool:
    """True when spans are recorded and exported in this process."""
    return _tracer() is not None


@contextmanager
def span(name: str, /, **attributes: Any) -> Iterator[Any]:
    """A span around a block of work, a child of the current span; a no-op when tracing is off.

    Yields the span (``set_attribute``, ``add_event``, ``record_exception``). Exceptions raised in
    the block are recorded on the span, which is marked as an error, and re-raised unchanged.
    ``None`` attributes are skipped; the bound log ids (session, turn) are added to every span.
    ``name`` is positional-only so that ``span("tool", name="search_flights")`` works.
    """
    tracer = _tracer()
    if tracer is None:
        yield NOOP_SPAN
        return
    attrs = {f"app.{k}": _attribute(v) for k, v in current_log_context().items()}
    attrs.update({k: _attribute(v) for k, v in attributes.items() if v is not None})
    with tracer.start_as_current_span(name, attributes=attrs) as current:
        yield current


# OpenTelemetry's GenAI semantic conventions: what a model call's span says in the shared vocabulary.
GENAI_OPERATIONS = {"reply": "chat", "summarize": "chat", "extract": "chat", "route": "chat", "slots": "chat"}


def genai_annotate(
    *,
    provider: str,
    model: str,
    purpose: str,
    prompt_tokens: int,
    completion_tokens: int,
    finish_reason: str,
    outcome: str,
) -> None:
    """Put the GenAI conventions' attributes on the current span (the turn's ``llm.call``), and name it as they
    do ("chat <model>"); nothing when no span is recording (tracing off, or a call outside one)."""
    from opentelemetry import trace

    current = trace.get_current_span()
    # Only a model call's own span (named llm.call, or renamed by an earlier attempt of the same call).
    name = str(getattr(current, "name", ""))
    if not current.is_recording() or not (name == "llm.call" or name.startswith("chat ")):
        return
    operation = GENAI_OPERATIONS.get(purpose, "chat")
    current.set_attributes(
        {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "openai" if provider == "openai" else provider,
            "gen_ai.system": "openai" if provider == "openai" else provider,
            "gen_ai.request.model": model,
            "gen_ai.response.model": model,
            "gen_ai.usage.input_tokens": int(prompt_tokens),
            "gen_ai.usage.output_tokens": int(completion_tokens),
            "gen_ai.response.finish_reasons": [finish_reason] if finish_reason else [],
            "app.llm.purpose": purpose,
            "app.llm.outcome": outcome,
        }
    )
    if outcome not in ("ok", "truncated"):
        current.set_attribute("error.type", outcome)
    current.update_name(f"{operation} {model}")


def memory_annotate(current: Any, *, operation: str, user_id: Any = None, kept: int | None = None) -> None:
    """The memory operation of a span (``retrieval``: search; a write: update), in the GenAI vocabulary's
    proposed memory attributes (open-telemetry/semantic-conventions-genai#140, not yet stable)."""
    current.set_attribute("gen_ai.operation.name", f"{operation}_memory")
    current.set_attribute("gen_ai.memory.operation", operation)
    if kept is not None:
        current.set_attribute("gen_ai.memory.result_count", kept)
