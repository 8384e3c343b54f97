"""One ``LLMCall`` row per model call, written so that recording can never break the call."""

from __future__ import annotations

import contextlib
import logging

from django.db import Error as DatabaseError
from django.db import transaction

from agents.llm.base import CallContext
from agents.models import LLMCall

logger = logging.getLogger(__name__)

# Column limits of LLMCall (kept here so a long model name or error cannot fail the insert).
_MAX_MODEL = 200
_MAX_FINISH = 30
_MAX_ERROR = 4000


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
) -> LLMCall | None:
    """Save the record of one model call; on a database error log it and return ``None``.

    Model calls are made outside transactions (a request waiting on a model must not hold one
    open), so this is its own short write. When a caller does call inside a transaction, the
    savepoint keeps a failed insert from poisoning the caller's transaction (outside one, the insert
    is a single autocommit statement: no BEGIN and COMMIT round trips around it).
    """
    try:
        guard = transaction.atomic() if transaction.get_connection().in_atomic_block else contextlib.nullcontext()
        with guard:
            return LLMCall.objects.create(
                agent_id=ctx.agent_id,
                session_id=ctx.session_id,
                turn_id=ctx.turn_id,
                purpose=ctx.purpose,
                provider=provider[:20],
                model=model[:_MAX_MODEL],
                prompt_tokens=max(0, prompt_tokens),
                prompt_sections=dict(ctx.prompt_sections),
                completion_tokens=max(0, completion_tokens),
                latency_ms=latency_ms,
                ttft_ms=ttft_ms,
                retries=retries,
                outcome=outcome,
                finish_reason=finish_reason[:_MAX_FINISH],
                error=error[:_MAX_ERROR],
            )
    except DatabaseError:
        from config.db import reconnect_if_broken

        reconnect_if_broken()  # a connection cut during the model call: the turn's next query reconnects
        # Note: the caller gets its reply even when the record cannot be written (database down,
        # a turn id that no longer exists); the failure is visible in the logs instead.
        logger.exception("could not record LLM call (purpose=%s, model=%s, outcome=%s)", ctx.purpose, model, outcome)
        return None
