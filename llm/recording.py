"""Where the record of each model call goes: a recorder the application installs.

The library has no ORM: ``llm_call_record`` hands a ``CallRecord`` to the recorder installed with
``set_call_recorder`` (the agents app installs ``agents.call_records.llm_call_save``, which writes an
``LLMCall`` row). Observers added with ``add_call_observer`` see each record too (the observability app
adds the trace span's GenAI attributes). Recording can never break the call: a recorder or an observer that
raises is logged, the caller gets its reply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from llm.base import CallContext

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallRecord:
    """The figures of one model call, as ``llm_call_record`` received them."""

    ctx: CallContext
    provider: str
    model: str
    outcome: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    retries: int = 0
    finish_reason: str = ""
    error: str = ""


CallRecorder = Callable[[CallRecord], object]
_recorder: CallRecorder | None = None
_observers: list[Callable[[CallRecord], object]] = []


def set_call_recorder(recorder: CallRecorder | None) -> CallRecorder | None:
    """Install ``recorder`` for every call from now on (None: calls are not recorded); returns the previous one."""
    global _recorder
    previous, _recorder = _recorder, recorder
    return previous


def add_call_observer(observer: Callable[[CallRecord], object]) -> None:
    """Show every call's record to ``observer`` from now on, before the recorder (once per observer)."""
    if observer not in _observers:
        _observers.append(observer)


def llm_call_record(
    *,
    ctx: CallContext,
    provider: str,
    model: str,
    outcome: str,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    latency_ms: float = 0.0,
    ttft_ms: float | None = None,
    retries: int = 0,
    finish_reason: str = "",
    error: str = "",
) -> object:
    """Hand the record of one model call to the installed recorder; return what it returned (None when
    none is installed or it failed: the failure is logged, never raised)."""
    recorder = _recorder
    if recorder is None and not _observers:
        return None
    record = CallRecord(
        ctx=ctx,
        provider=provider,
        model=model,
        outcome=outcome,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_ms=latency_ms,
        ttft_ms=ttft_ms,
        retries=retries,
        finish_reason=finish_reason,
        error=error,
    )
    for observer in list(_observers):
        try:
            observer(record)
        except Exception:
            logger.exception("a call observer failed (purpose=%s, model=%s)", ctx.purpose, model)
    if recorder is None:
        return None
    try:
        return recorder(record)
    except Exception:
        # The caller gets its reply even when the record cannot be written (database down, a turn id that
        # no longer exists); the failure is visible in the logs instead.
        logger.exception("could not record LLM call (purpose=%s, model=%s, outcome=%s)", ctx.purpose, model, outcome)
        return None
