"""The records the agents app installs as callbacks: an ``LLMCall`` row per model call (in the ``llm``
library), a ``ToolInvocation`` row per tool call of a session (in the tool registry), an
``EndpointCapability`` row per endpoint for the structured-output format it takes."""

from __future__ import annotations

import contextlib

from django.db import Error as DatabaseError
from django.db import transaction

from agents.llm.capabilities import EndpointKey, LearnedMode
from agents.llm.recording import CallRecord
from agents.models import EndpointCapability, LLMCall, ToolInvocation
from agents.tools.registry import ToolContext, ToolResult
from config.db import reconnect_if_broken

# Column limits of LLMCall (kept here so a long model name or error cannot fail the insert).
_MAX_MODEL = 200
_MAX_FINISH = 30
_MAX_ERROR = 4000


def llm_call_save(record: CallRecord) -> LLMCall:
    """Save the record of one model call (``agents.llm.recording`` logs a failure; the call goes on).

    Model calls are made outside transactions (a request waiting on a model must not hold one open), so
    this is its own short write. When a caller does call inside a transaction, the savepoint keeps a
    failed insert from poisoning the caller's transaction (outside one, the insert is a single autocommit
    statement: no BEGIN and COMMIT round trips around it).
    """
    ctx = record.ctx
    try:
        guard = transaction.atomic() if transaction.get_connection().in_atomic_block else contextlib.nullcontext()
        with guard:
            return LLMCall.objects.create(
                agent_id=ctx.agent_id,
                session_id=ctx.session_id,
                turn_id=ctx.turn_id,
                purpose=ctx.purpose,
                provider=record.provider[:20],
                model=record.model[:_MAX_MODEL],
                prompt_tokens=max(0, record.prompt_tokens),
                prompt_sections=dict(ctx.prompt_sections),
                completion_tokens=max(0, record.completion_tokens),
                latency_ms=record.latency_ms,
                ttft_ms=record.ttft_ms,
                retries=record.retries,
                outcome=record.outcome,
                finish_reason=record.finish_reason[:_MAX_FINISH],
                error=record.error[:_MAX_ERROR],
            )
    except DatabaseError:
        reconnect_if_broken()  # a connection cut during the model call: the turn's next query reconnects
        raise


def tool_invocation_save(result: ToolResult, context: ToolContext) -> ToolInvocation:
    """Save the record of one tool call of a session (the registry logs a failure; the turn goes on)."""
    if context.session is None:  # the registry records only a session's calls
        raise ValueError("a tool invocation is recorded only for a session")
    # A savepoint, so a failed insert cannot poison a transaction the caller may have open.
    with transaction.atomic():
        return ToolInvocation.objects.create(
            session=context.session,
            turn=context.turn,
            name=result.name[:80],
            arguments=result.arguments,
            result=result.content,
            ok=result.ok,
            error_kind=result.error_kind,
            attempts=result.attempts,
            latency_ms=result.latency_ms,
        )


def capability_load(key: EndpointKey) -> LearnedMode | None:
    row = EndpointCapability.objects.filter(
        profile=key.profile[:80], base_url=key.base_url[:500], model=key.model[:200]
    ).first()
    if row is None:
        return None
    return LearnedMode(mode=row.structured_mode, detail=row.detail)  # type: ignore[arg-type]


def capability_save(key: EndpointKey, learned: LearnedMode) -> EndpointCapability:
    # A savepoint: a structured call may run inside a caller's transaction.
    with transaction.atomic():
        row, _ = EndpointCapability.objects.update_or_create(
            profile=key.profile[:80],
            base_url=key.base_url[:500],
            model=key.model[:200],
            defaults={"structured_mode": learned.mode, "detail": learned.detail[:_MAX_ERROR]},
        )
    return row
