from __future__ import annotations

import json
import logging
import threading

import pytest

from observability.logging import (
    JsonFormatter,
    PlainFormatter,
    bind_log_context,
    clear_log_context,
    current_log_context,
    log_context,
    reset_log_context,
)
from observability.tracing import configure_tracing, reset_tracing, span


def _record(msg: str = "hello %s", args: tuple[object, ...] = ("world",), **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("orchestrator.runtime", logging.WARNING, __file__, 1, msg, args, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_lines_carry_bound_ids_and_extra_fields() -> None:
    with log_context(session_id="abc", turn_id=42):
        line = JsonFormatter().format(_record(retries=3))
    data = json.loads(line)
    assert data["message"] == "hello world"
    assert data["level"] == "WARNING"
    assert data["logger"] == "orchestrator.runtime"
    assert data["session_id"] == "abc"
    assert data["turn_id"] == 42
    assert data["retries"] == 3
    assert data["ts"].endswith("+00:00")


def test_context_is_restored_after_the_block_and_none_is_skipped() -> None:
    clear_log_context()
    token = bind_log_context(session_id="outer")
    with log_context(turn_id=1, tool=None):
        assert current_log_context() == {"session_id": "outer", "turn_id": 1}
    assert current_log_context() == {"session_id": "outer"}
    reset_log_context(token)
    assert current_log_context() == {}
    assert "session_id" not in json.loads(JsonFormatter().format(_record()))


def test_threads_do_not_see_each_others_ids() -> None:
    seen: dict[str, dict[str, object]] = {}

    def work(name: str) -> None:
        with log_context(session_id=name):
            seen[name] = json.loads(JsonFormatter().format(_record()))

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["a"]["session_id"] == "a"
    assert seen["b"]["session_id"] == "b"


def test_exceptions_and_unserialisable_values() -> None:
    try:
        raise RuntimeError("kaput")
    except RuntimeError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    record.obj = object()
    data = json.loads(JsonFormatter().format(record))
    assert "RuntimeError: kaput" in data["exc_info"]
    assert data["obj"].startswith("<object object")


def test_plain_format_appends_ids() -> None:
    with log_context(session_id="s9"):
        text = PlainFormatter().format(_record())
    assert "WARNING orchestrator.runtime hello world" in text
    assert text.endswith("[session_id=s9]")


def test_trace_ids_are_logged_inside_a_span() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    configure_tracing(exporter=InMemorySpanExporter(), batch=False)
    try:
        with span("turn") as current:
            data = json.loads(JsonFormatter().format(_record()))
            assert data["trace_id"] == format(current.get_span_context().trace_id, "032x")
    finally:
        reset_tracing()


def test_settings_make_json_the_default_format() -> None:
    import os

    from django.conf import settings

    if os.environ.get("LOG_FORMAT", "json") != "json":
        pytest.skip("LOG_FORMAT is set in this environment: the default is not what the settings read")
    assert settings.LOG_FORMAT == "json"
    assert settings.LOGGING["handlers"]["console"]["formatter"] == "json"
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler.formatter, JsonFormatter)


def test_beat_and_the_http_client_log_warnings_not_a_line_per_task_or_request() -> None:
    """The default logging: Celery beat's "Sending due task" (several a minute) and httpx's line per request are
    INFO and left out; their warnings are kept, and the app's own INFO lines too."""
    assert not logging.getLogger("celery.beat").isEnabledFor(logging.INFO)
    assert logging.getLogger("celery.beat").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert logging.getLogger("orchestrator.runtime").isEnabledFor(logging.INFO)
