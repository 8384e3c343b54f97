"""Structured logs: a JSON formatter and ids bound to the current context.

The turn runtime binds ``session_id`` and ``turn_id`` (``bind_log_context`` or the
``log_context`` context manager); every record logged while they are bound carries them,
whatever logger wrote it. Context variables keep concurrent requests, threads and
asyncio tasks apart.

Note: this module is imported by the LOGGING setting, so it must not import Django models.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

# Note: the default is read-only; bindings always set a new mapping, never mutate the current one.
_LOG_CONTEXT: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "log_context", default=MappingProxyType({})
)

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is logged as a field.
_RECORD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys() | {"message", "asctime", "taskName"}
)


def _clean(ids: Mapping[str, Any]) -> dict[str, Any]:
    # Ids are logged as text: UUIDs, model pks and strings all read the same in a log search.
    return {k: (v if isinstance(v, int | float | bool | str) else str(v)) for k, v in ids.items() if v is not None}


def bind_log_context(**ids: Any) -> contextvars.Token[Mapping[str, Any]]:
    """Add ids (``session_id=…``, ``turn_id=…``) to every log record in the current context.

    ``None`` values are ignored. Returns a token for ``reset_log_context`` to undo this binding.
    """
    merged = {**_LOG_CONTEXT.get(), **_clean(ids)}
    return _LOG_CONTEXT.set(merged)


def reset_log_context(token: contextvars.Token[Mapping[str, Any]]) -> None:
    """Undo one ``bind_log_context`` call."""
    _LOG_CONTEXT.reset(token)


def clear_log_context() -> None:
    """Forget every bound id (start of a request or a Celery task, so ids do not leak between them)."""
    _LOG_CONTEXT.set(MappingProxyType({}))


def current_log_context() -> dict[str, Any]:
    """The ids bound in the current context."""
    return dict(_LOG_CONTEXT.get())


@contextmanager
def log_context(**ids: Any) -> Iterator[dict[str, Any]]:
    """Bind ids for the duration of a ``with`` block, then restore the previous ones."""
    token = bind_log_context(**ids)
    try:
        yield current_log_context()
    finally:
        _LOG_CONTEXT.reset(token)


def _trace_ids() -> dict[str, str]:
    # Link log lines to traces when a span is recording; free when tracing is off.
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - opentelemetry is a runtime dependency
        return {}
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    return {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the bound ids, ``extra`` fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update(_LOG_CONTEXT.get())
        payload.update(_trace_ids())
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            payload["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(payload, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """The classic one-line format, with the bound ids appended (LOG_FORMAT=plain)."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None, style: Any = "%", **kwargs: Any) -> None:
        super().__init__(fmt or "%(asctime)s %(levelname)s %(name)s %(message)s", datefmt, style, **kwargs)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = _LOG_CONTEXT.get()
        if ids:
            text += " [" + " ".join(f"{k}={v}" for k, v in ids.items()) + "]"
        return text
