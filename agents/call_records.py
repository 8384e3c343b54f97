"""The records the agents app installs as callbacks: an ``LLMCall`` row per model call (in the ``llm``
library), a ``ToolInvocation`` row per tool call of a session (in the tool registry), an
``EndpointCapability`` row per endpoint for the structured-output format it takes."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
from collections.abc import Iterator
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import Error as DatabaseError
from django.db import connection, transaction
from django.utils import timezone

from agents.models import EndpointCapability, LLMCall, ToolInvocation
from agents.tools.execution import ToolResult
from agents.tools.registry import ToolContext
from core.db import reconnect_if_broken
from core.text import storable_text
from llm.capabilities import EndpointKey, LearnedMode
from llm.recording import CallRecord

logger = logging.getLogger(__name__)

# Column limits of LLMCall (kept here so a long model name or error cannot fail the insert).
_MAX_MODEL = 200
_MAX_FINISH = 30
_MAX_ERROR = 4000


# The model calls of turns being answered in this process, held until the turn's outcome is written: then they
# go in with it, in the same statement (``orchestrator.finish.complete_turn``), or, however the turn ends
# otherwise (failed, handed off, cut short), in one insert when it ends (``llm_calls_held``). A process that
# dies mid-turn loses the records of that turn's calls (the turn itself is recovered from its checkpoint).
_held: dict[int, list[LLMCall]] = {}
_held_lock = threading.Lock()


@contextlib.contextmanager
def llm_calls_held(turn_id: int) -> Iterator[None]:
    """Hold the records of turn ``turn_id``'s model calls until it ends; write what is left then."""
    with _held_lock:
        _held.setdefault(turn_id, [])
    try:
        yield
    finally:
        with _held_lock:
            rest = _held.pop(turn_id, [])
        if rest:
            try:
                llm_calls_insert(rest)
            except DatabaseError:
                logger.exception("could not save the records of %s model calls of turn %s", len(rest), turn_id)
                reconnect_if_broken()


def llm_calls_summary(turn_id: int) -> dict[str, Any]:
    """What turn ``turn_id``'s model calls held here cost so far: how many, and their prompt and completion tokens,
    in all and by purpose (the turn's record keeps it: ``composition["calls"]``)."""
    with _held_lock:
        calls = list(_held.get(turn_id) or [])
    by_purpose: dict[str, dict[str, int]] = {}
    for call in calls:
        row = by_purpose.setdefault(call.purpose or "other", {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0})
        row["calls"] += 1
        row["prompt_tokens"] += int(call.prompt_tokens or 0)
        row["completion_tokens"] += int(call.completion_tokens or 0)
    return {
        "calls": len(calls),
        "prompt_tokens": sum(row["prompt_tokens"] for row in by_purpose.values()),
        "completion_tokens": sum(row["completion_tokens"] for row in by_purpose.values()),
        "by_purpose": by_purpose,
    }


def llm_calls_take(turn_id: int) -> list[LLMCall]:
    """The held records of ``turn_id``'s calls, handed to the caller (which writes them, or gives them back)."""
    with _held_lock:
        calls = _held.get(turn_id)
        if not calls:
            return []
        _held[turn_id] = []
        return calls


def llm_calls_give_back(turn_id: int, calls: list[LLMCall]) -> None:
    """Records taken for a write that did not happen: held again, for the turn's end."""
    with _held_lock:
        if turn_id in _held:
            _held[turn_id][:0] = calls
            return
    llm_calls_insert(calls)


def llm_calls_insert(calls: list[LLMCall]) -> None:
    """Insert the records in one statement, each with the time of its call (``bulk_create`` would stamp them all
    with the time of the insert: ``created_at`` is ``auto_now_add``)."""
    if not calls:
        return
    guard = transaction.atomic() if transaction.get_connection().in_atomic_block else contextlib.nullcontext()
    with guard, connection.cursor() as cursor:
        cursor.execute(llm_calls_insert_sql("calls"), {"calls": llm_calls_json(calls)})


def llm_calls_json(calls: list[LLMCall]) -> str:
    """The records as a JSON array of their columns (``jsonb_populate_recordset`` inserts them)."""
    return json.dumps([_columns(call) for call in calls], cls=DjangoJSONEncoder)


_LLMCALL_COLUMNS = tuple(f.column for f in LLMCall._meta.concrete_fields if not f.primary_key)


def _columns(call: LLMCall) -> dict[str, Any]:
    return {f.column: getattr(call, f.attname) for f in LLMCall._meta.concrete_fields if not f.primary_key}


def _reference_or_null(column: str) -> str:
    """``r.<column>``, or NULL when it names a row that is gone: the record of a call whose session (or turn, or
    agent) was deleted while the model answered is kept, with that reference cleared, as the deletion itself
    clears it on the records written before (``on_delete=SET_NULL``), instead of failing on the foreign key."""
    for field in LLMCall._meta.concrete_fields:
        if field.column == column and field.is_relation:
            target = field.related_model._meta  # type: ignore[union-attr]
            return f"(SELECT x.{target.pk.column} FROM {target.db_table} x WHERE x.{target.pk.column} = r.{column})"
    return f"r.{column}"


def llm_calls_insert_sql(param: str) -> str:
    """An ``INSERT`` of the records passed as JSON in the named parameter ``param`` (for a statement's CTE)."""
    columns = ", ".join(_LLMCALL_COLUMNS)
    values = ", ".join(_reference_or_null(column) for column in _LLMCALL_COLUMNS)
    table = LLMCall._meta.db_table
    return (
        f"INSERT INTO {table} ({columns}) SELECT {values} "
        f"FROM jsonb_populate_recordset(NULL::{table}, %({param})s::jsonb) AS r"
    )


def llm_call_save(record: CallRecord) -> LLMCall:
    """Save the record of one model call (``llm.recording`` logs a failure; the call goes on).

    A call of a turn being answered here (``llm_calls_held``) is held, and written with the turn's outcome.

    Model calls are made outside transactions (a request waiting on a model must not hold one open), so
    this is its own short write. When a caller does call inside a transaction, the savepoint keeps a
    failed insert from poisoning the caller's transaction (outside one, the insert is a single autocommit
    statement: no BEGIN and COMMIT round trips around it).
    """
    ctx = record.ctx
    call = _unsaved(record)
    if ctx.turn_id is not None:
        with _held_lock:
            held = _held.get(ctx.turn_id)
            if held is not None:
                held.append(call)
                return call
    try:
        llm_calls_insert([call])  # kept when its session was deleted meanwhile (``llm_calls_insert_sql``)
        return call
    except DatabaseError:
        reconnect_if_broken()  # a connection cut during the model call: the turn's next query reconnects
        raise


def _unsaved(record: CallRecord) -> LLMCall:
    ctx = record.ctx
    return LLMCall(
        agent_id=ctx.agent_id,
        session_id=ctx.session_id,
        turn_id=ctx.turn_id,
        purpose=ctx.purpose,
        # Text from outside (an endpoint's model name, finish reason, error) as PostgreSQL stores it: a NUL there
        # must not fail the turn whose outcome these records are written with.
        provider=storable_text(record.provider)[:20],
        model=storable_text(record.model)[:_MAX_MODEL],
        prompt_tokens=max(0, record.prompt_tokens),
        prompt_sections=dict(ctx.prompt_sections),
        completion_tokens=max(0, record.completion_tokens),
        latency_ms=record.latency_ms if math.isfinite(record.latency_ms) else 0.0,
        ttft_ms=record.ttft_ms if record.ttft_ms is not None and math.isfinite(record.ttft_ms) else None,
        retries=record.retries,
        outcome=record.outcome,
        finish_reason=storable_text(record.finish_reason)[:_MAX_FINISH],
        error=storable_text(record.error)[:_MAX_ERROR],
        created_at=timezone.now(),
    )


def tool_invocation_save(result: ToolResult, context: ToolContext) -> ToolInvocation:
    """Save the record of one tool call of a session (the registry logs a failure; the turn goes on). One
    statement; in a caller's transaction, a savepoint, so a failed insert cannot poison it."""
    guard = transaction.atomic() if transaction.get_connection().in_atomic_block else contextlib.nullcontext()
    with guard:
        return tool_invocation_insert(result, context)


def tool_invocation_insert(result: ToolResult, context: ToolContext) -> ToolInvocation:
    """The record of one tool call, written as part of the caller's transaction (an action's outcome: a failed
    insert fails the outcome too, and both are written when the turn is recovered; the action is idempotent)."""
    if context.session is None:  # the registry records only a session's calls
        raise ValueError("a tool invocation is recorded only for a session")
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
