"""Writes to a session's durable workflow state and its append-only checkpoint log.

Every state write is a compare-and-set on ``ChatSession.version`` (optimistic concurrency): the
writer updates the row only if the version it read is still there, and bumps it. A writer holding
an outdated copy gets ``StaleSessionError`` instead of silently overwriting someone else's change
(an operator's reset while a turn was running, say). Checkpoint sequence numbers are allocated
under the session row lock, in a short transaction, so they are gap-free per session and never clash.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, F, Func, JSONField, Max, TextField, Value, When
from django.db.models.functions import Cast, Concat
from django.db.models.sql import InsertQuery
from django.utils import timezone
from pydantic import BaseModel, ValidationError

from agents.call_records import llm_calls_insert_sql
from agents.workflows import MAX_RETRIES, Workflow, WorkflowDecision, get_workflow
from core import events as run_channel
from core.db import update_sql
from sessions.locks import HELD_SQL, SessionBusyError, session_lease_take_in_transaction
from sessions.models import TURN_UNFINISHED, ChatSession, Checkpoint, SessionLease, Turn
from sessions.selectors import (
    last_good_checkpoint,
    prune_candidates,
    sessions_over_checkpoint_limit,
    stuck_turns_find,
)

logger = logging.getLogger(__name__)

__all__ = [
    "StaleSessionError",
    "TransitionOutcome",
    "checkpoint_before_call",
    "checkpoint_record",
    "checkpoints_prune",
    "session_create",
    "session_hand_back",
    "session_hand_off",
    "session_reset",
    "session_resume_from",
    "session_resume_last_good",
    "stuck_turns_find",
    "transition_apply",
    "turn_complete_write",
    "turn_failure_record",
    "turn_insert",
    "turn_insert_with_checkpoint",
    "turn_write_unfinished",
]


class StaleSessionError(Exception):
    """The session changed since this copy was read (its version moved on); reload and decide again."""

    def __init__(self, session: ChatSession) -> None:
        super().__init__(
            f"session {session.pk} changed since it was read (version {session.version} is outdated); "
            "reload it and try again"
        )
        self.session_id = session.pk
        self.expected_version = session.version


@dataclass(frozen=True)
class TransitionOutcome:
    """What ``transition_apply`` did. ``applied`` is False when the decision was refused (nothing changed)."""

    applied: bool
    from_state: str
    to_state: str
    errors: list[str] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    # The values of the user's message the workflow refused (a date in the past, 15 passengers), applied
    # or not: what the reply should explain. ``errors`` has these and the transition's own refusals.
    slot_errors: list[str] = field(default_factory=list)


def _actor_name(actor: Any) -> str:
    if actor is None:
        return "system"
    getter = getattr(actor, "get_username", None)
    return str(getter()) if callable(getter) else str(actor)


def _status_for(workflow: Workflow, current: str, state: str) -> str:
    # A session handed to a human or closed keeps that status; the machine's state does not override it.
    if current in (ChatSession.Status.NEEDS_HUMAN, ChatSession.Status.CLOSED):
        return current
    if workflow.failed_state and state == workflow.failed_state:
        return ChatSession.Status.FAILED
    if state in workflow.terminal_states:
        return ChatSession.Status.COMPLETED
    return ChatSession.Status.ACTIVE


def _compare_and_set(session: ChatSession, **fields: Any) -> None:
    """Write ``fields`` only if the row still has ``session.version``; bump it; mirror it on the instance."""
    expected = session.version
    now = timezone.now()
    updated = ChatSession.objects.filter(pk=session.pk, version=expected).update(
        **fields, version=expected + 1, updated_at=now
    )
    if updated != 1:
        raise StaleSessionError(session)
    for name, value in fields.items():
        setattr(session, name, value)
    session.version = expected + 1
    session.updated_at = now


def _compare_and_set_with_checkpoint(
    session: ChatSession, fields: dict[str, Any], *, reason: str, turn: Turn | None, transition: str, detail: str
) -> Checkpoint:
    """``_compare_and_set`` and ``checkpoint_record`` in one statement: the row written only if it still has
    ``session.version``, and its checkpoint taken from the row as written. ``StaleSessionError`` when the version
    moved; an ``IntegrityError`` (``checkpoint_number_taken``), and nothing written, when another writer took the
    checkpoint's number while this statement waited for the row."""
    expected = session.version
    now = timezone.now()
    update, update_params = update_sql(
        ChatSession.objects.filter(pk=session.pk, version=expected), **fields, version=expected + 1, updated_at=now
    )
    sql = (
        f"WITH u AS ({update} RETURNING id, state, data, retry_count), c AS ("
        f"{checkpoint_insert_sql('u')} RETURNING {', '.join(_CHECKPOINT_COLUMNS)})"
        f" SELECT (SELECT count(*) FROM u), {', '.join('c.' + c for c in _CHECKPOINT_COLUMNS)}"
        " FROM (SELECT 1) AS one LEFT JOIN c ON true"
    )
    params = [*update_params, turn.pk if turn is not None else None, transition[:140], reason, detail, now]
    with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if not row or not row[0]:
        raise StaleSessionError(session)
    for name, value in fields.items():
        setattr(session, name, value)
    session.version = expected + 1
    session.updated_at = now
    return _checkpoint_from_row(row[1:])


def checkpoint_number_taken(exc: IntegrityError) -> bool:
    """The error of a checkpoint numbered with a number another writer took (``checkpoint_seq_unique``)."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == "checkpoint_seq_unique"


# --- creation -------------------------------------------------------------------------------------------
def session_create(*, user: Any, agent: Any, title: str = "") -> ChatSession:
    """A new session for ``user`` with ``agent``, in the initial state of the agent's workflow."""
    workflow = get_workflow(agent.workflow or "free_chat")
    return ChatSession.objects.create(
        user=user,
        agent=agent,
        title=title[:200],
        workflow=workflow.name,
        workflow_version=workflow.version,  # a workflow declared as data: this session stays on this version
        state=workflow.initial_state,
        last_good_state=workflow.initial_state,
        data={},
    )


def session_delete(*, session: ChatSession) -> None:
    """Delete a session with its turns and checkpoints, holding its turn lease until the delete commits.

    Raises ``sessions.locks.SessionBusyError`` when a turn is running: deleting under it would leave it
    writing into rows that are gone. The lease is taken inside the caller's transaction (the admin's delete
    view runs in one) and deleted with the session: a turn that asks for it meanwhile waits for the commit,
    so no turn starts on the session before the rows are gone."""
    with transaction.atomic():
        if not session_lease_take_in_transaction(session.pk):
            raise SessionBusyError("A message on this session is still being answered; try again when it has finished.")
        session_id = session.pk
        session.delete()
        SessionLease.objects.filter(session_id=session_id).delete()
        # Its open pages learn it is gone once the delete commits.
        transaction.on_commit(lambda: run_channel.session_changed(session_id))


# --- the checkpoint log -----------------------------------------------------------------------------------
def checkpoint_record(
    *,
    session: ChatSession,
    reason: str,
    turn: Turn | None = None,
    transition: str = "",
    detail: str = "",
) -> Checkpoint:
    """Append a checkpoint with the session's state, data and retry count as stored right now.

    The row lock serializes sequence numbers per session; the snapshot is read under the same lock, so
    it is what the database holds, even if the caller's copy is older.
    """
    if reason not in Checkpoint.Reason.values:
        raise ValueError(f"unknown checkpoint reason {reason!r}")
    fast = _checkpoint_insert(session_id=session.pk, turn=turn, reason=reason, transition=transition, detail=detail)
    if fast is not None:
        return fast
    # The session is gone (the ORM says so below), or another writer took the next number while this one waited
    # for the row lock: read the last number again after the lock, in a statement of its own.
    # No savepoint inside a caller's transaction: a failure here fails the caller's work as a whole.
    with transaction.atomic(savepoint=False):
        row = ChatSession.objects.select_for_update().values("state", "data", "retry_count").get(pk=session.pk)
        # A statement of its own, after the row lock is granted: it sees a checkpoint committed meanwhile.
        last = Checkpoint.objects.filter(session_id=session.pk).aggregate(m=Max("seq"))["m"] or 0
        return Checkpoint.objects.create(
            session_id=session.pk,
            seq=last + 1,
            turn=turn,
            state=row["state"],
            data=row["data"],
            retry_count=row["retry_count"],
            transition=transition[:140],
            reason=reason,
            detail=detail,
        )


# The checkpoint's columns, in the order a ``RETURNING`` of them gives (``_checkpoint_from_row`` reads it).
_CHECKPOINT_COLUMNS = tuple(f.column for f in Checkpoint._meta.concrete_fields)


def checkpoint_insert_sql(source: str, *, turn: str = "%s", tables: str = "") -> str:
    """An ``INSERT`` of one checkpoint taken from ``source`` (a CTE with the session's id, state, data and retry
    count, as written or locked by the same statement), numbered after the session's last one, returning its
    row. Its parameters, positional: the turn's id (unless ``turn`` is an expression), the transition, the
    reason, the detail and the time. ``tables``: what to select from, when more than ``source``."""
    return (
        "INSERT INTO chat_sessions_checkpoint"
        " (session_id, seq, turn_id, state, data, retry_count, transition, reason, detail, created_at)"
        f" SELECT {source}.id, COALESCE((SELECT MAX(k.seq) FROM chat_sessions_checkpoint k"
        f" WHERE k.session_id = {source}.id), 0) + 1, {turn}, {source}.state, {source}.data, {source}.retry_count,"
        f" %s, %s, %s, %s FROM {tables or source}"
    )


_CHECKPOINT_INSERT = (
    "WITH s AS (SELECT id, state, data, retry_count FROM chat_sessions_chatsession WHERE id = %s FOR UPDATE) "
    + checkpoint_insert_sql("s")
    + f" ON CONFLICT (session_id, seq) DO NOTHING RETURNING {', '.join(_CHECKPOINT_COLUMNS)}"
)


def _checkpoint_insert(
    *, session_id: Any, turn: Turn | None, reason: str, transition: str, detail: str
) -> Checkpoint | None:
    """``checkpoint_record`` in one statement: the session row locked, its state read and the next number taken
    together. None when it wrote nothing: no such session, or a checkpoint committed by another writer while
    this statement waited for the row lock (its snapshot predates it, so its number was taken: the caller reads
    again in statements of their own)."""
    params = [session_id, turn.pk if turn is not None else None, transition[:140], reason, detail, timezone.now()]
    with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
        cursor.execute(_CHECKPOINT_INSERT, params)
        row = cursor.fetchone()
    return None if row is None else _checkpoint_from_row(row)


def _checkpoint_from_row(row: Any) -> Checkpoint:
    values = dict(zip(_CHECKPOINT_COLUMNS, row, strict=True))
    data = values["data"]
    if isinstance(data, str):  # a driver that leaves jsonb as text
        data = json.loads(data)
    checkpoint = Checkpoint(**{**values, "data": data})
    checkpoint._state.adding = False
    checkpoint._state.db = "default"
    return checkpoint


def checkpoint_before_call(*, session: ChatSession, turn: Turn) -> Checkpoint:
    """The checkpoint taken before every model call: where to resume if the process dies during the call."""
    return checkpoint_record(
        session=session,
        reason=Checkpoint.Reason.BEFORE_CALL,
        turn=turn,
        detail=f"before a model call, turn #{turn.seq}",
    )


# --- transitions -----------------------------------------------------------------------------------------
def _as_decision(workflow: Workflow, decision: Any) -> WorkflowDecision:
    if isinstance(decision, workflow.decision_schema):
        return decision
    raw = decision.model_dump() if isinstance(decision, BaseModel) else decision
    return workflow.decision_schema.model_validate(raw)


def transition_apply(
    *,
    session: ChatSession,
    turn: Turn | None,
    decision: Any,
    today: date | None = None,
    also: Callable[[], object] | None = None,
) -> TransitionOutcome:
    """Apply a validated decision (``next_state`` + ``slots``) to the session, or record why not.

    The transition must be in the workflow's table and the target state's required slots must be
    known; otherwise an ``invalid_transition`` checkpoint is written and neither state nor data change.
    Invalid slot values are dropped and reported; valid ones are merged. A change of state resets the
    retry counter. Every applied decision writes a ``transition`` checkpoint in the same transaction.
    Raises ``StaleSessionError`` when the session changed since ``session`` was read.
    """
    workflow = get_workflow(session.workflow, session.workflow_version)
    from_state = session.state
    try:
        parsed = _as_decision(workflow, decision)
    except ValidationError as exc:
        errors = [f"decision does not fit {workflow.decision_schema.__name__}: {e['msg']}" for e in exc.errors()]
        cp = checkpoint_record(
            session=session, reason=Checkpoint.Reason.INVALID_TRANSITION, turn=turn, detail="; ".join(errors)
        )
        if also is not None:
            also()
        return TransitionOutcome(False, from_state, from_state, errors, cp)

    step = workflow.step(state=from_state, data=session.data or {}, decision=parsed, today=today)
    arrow = f"{from_state} -> {parsed.next_state}"
    if not step.applied:
        cp = checkpoint_record(
            session=session,
            reason=Checkpoint.Reason.INVALID_TRANSITION,
            turn=turn,
            transition=arrow,
            detail="; ".join(step.errors),
        )
        logger.info("rejected %s on session %s: %s", arrow, session.pk, step.errors)
        if also is not None:
            also()
        return TransitionOutcome(False, from_state, from_state, list(step.errors), cp, list(step.slot_errors))

    fields: dict[str, Any] = {"state": step.to_state, "data": step.data, "last_transition": arrow}
    if step.changed_state:
        fields["retry_count"] = 0
        if step.to_state != workflow.failed_state:
            fields["last_good_state"] = step.to_state
    fields["status"] = _status_for(workflow, session.status, step.to_state)
    detail_parts = [f"confidence {parsed.confidence:.2f}"]
    if parsed.reasoning:
        detail_parts.append(parsed.reasoning[:300])
    if step.slot_errors:
        detail_parts.append("slots refused: " + "; ".join(step.slot_errors))
    # One statement (the write, then its checkpoint); in a transaction with ``also``, the audit row of what
    # brought it about (an action's tool call), so the outcome and its record stand or fall together.
    detail = " | ".join(detail_parts)
    # A statement alone is atomic; with ``also``, or inside a caller's transaction, a transaction (a savepoint).
    guard = transaction.atomic() if also is not None or connection.in_atomic_block else contextlib.nullcontext()
    try:
        with guard:
            cp = _compare_and_set_with_checkpoint(
                session, fields, reason=Checkpoint.Reason.TRANSITION, turn=turn, transition=arrow, detail=detail
            )
            if also is not None:
                also()
    except IntegrityError as exc:
        if not checkpoint_number_taken(exc):
            raise
        # Another writer numbered a checkpoint while this statement waited for the row: nothing was written.
        # Again, in a transaction, the number read after the row lock.
        with transaction.atomic():
            _compare_and_set(session, **fields)
            cp = checkpoint_record(
                session=session, reason=Checkpoint.Reason.TRANSITION, turn=turn, transition=arrow, detail=detail
            )
            if also is not None:
                also()
    return TransitionOutcome(True, from_state, step.to_state, list(step.errors), cp, list(step.slot_errors))


def turn_failure_record(*, session: ChatSession, turn: Turn | None, reason: str) -> ChatSession:
    """Count a failed turn. Past ``MAX_RETRIES`` the session moves to the workflow's failed state.

    In the failed state the agent apologizes and offers to resume from the last good state (the data is
    kept) or to start over. Workflows without a failed state (free chat) only count.
    """
    workflow = get_workflow(session.workflow, session.workflow_version)
    retries = session.retry_count + 1
    fields: dict[str, Any] = {"retry_count": retries}
    to_failed = bool(workflow.failed_state) and retries > MAX_RETRIES and session.state != workflow.failed_state
    from_state = session.state
    if to_failed:
        assert workflow.failed_state is not None
        fields.update(
            state=workflow.failed_state,
            status=_status_for(workflow, session.status, workflow.failed_state),
            last_transition=f"{from_state} -> {workflow.failed_state}",
        )
    with transaction.atomic():
        _compare_and_set(session, **fields)
        checkpoint_record(
            session=session, reason=Checkpoint.Reason.RETRY, turn=turn, detail=f"failure {retries}: {reason}"[:2000]
        )
        if to_failed:
            checkpoint_record(
                session=session,
                reason=Checkpoint.Reason.FAILED,
                turn=turn,
                transition=f"{from_state} -> {workflow.failed_state}",
                detail=(
                    f"{retries} failed attempts (last: {reason[:300]}); the last good state was "
                    f"{session.last_good_state or workflow.initial_state}"
                ),
            )
    return session


# --- a turn's rows: the statements the orchestrator writes a turn with ------------------------------------
# After the turn's INSERT (``t``): the session row locked and read (``s``), its first title, the checkpoint.
_CHECKPOINT_AND_TITLE = (
    ", s AS (SELECT id, state, data, retry_count FROM chat_sessions_chatsession WHERE id = %s FOR UPDATE)"
    ", titled AS (UPDATE chat_sessions_chatsession SET title = %s WHERE id = %s AND title = '' AND %s <> ''"
    " RETURNING id)"
    f", c AS ({checkpoint_insert_sql('s', turn='t.id', tables='s, t')} RETURNING seq)"
    " SELECT t.id FROM t"
)


def turn_insert_with_checkpoint(*, turn: Turn, title: str) -> bool:
    """Insert the unsaved ``turn``, its before-call checkpoint and the session's first ``title`` (when it has
    none) in one statement: one round trip where a transaction took six. False, and nothing written, when the
    checkpoint could not take its number (another writer took it while this statement waited for the session's
    row lock); ``IntegrityError`` for any other conflict (a turn with the same Idempotency-Key)."""
    query = InsertQuery(Turn)
    query.insert_values([f for f in Turn._meta.local_concrete_fields if not f.primary_key], [turn])
    compiler: Any = query.get_compiler(using="default")
    compiler.returning_fields = [Turn._meta.pk]
    [(insert, insert_params)] = compiler.as_sql()
    detail = f"before a model call, turn #{turn.seq}"
    params = [*insert_params, turn.session_id, title, turn.session_id, title]
    params += ["", Checkpoint.Reason.BEFORE_CALL.value, detail, timezone.now()]
    # A statement alone is atomic; inside a caller's transaction (a test's), a savepoint keeps a refusal from
    # spoiling it.
    guard = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    try:
        with guard, connection.cursor() as cursor:
            cursor.execute("WITH t AS (" + insert + ")" + _CHECKPOINT_AND_TITLE, params)
            (turn_id,) = cursor.fetchone()
    except IntegrityError as exc:
        if checkpoint_number_taken(exc):
            return False
        raise
    turn.pk = turn_id
    turn._state.adding = False
    turn._state.db = "default"
    return True


def turn_write_unfinished(*, turn: Turn, **fields: Any) -> bool:
    """Write ``fields`` to the turn only while it is unfinished: the fence against a second runner. False when
    it is finished (or gone) already, and nothing was written; the instance is updated with the plain values.

    A runner whose connection was cut during the model call lost its lease with it; the next message or the
    sweep may have finished the turn meanwhile. A lease check before the write cannot see that (the lease is
    free again), the turn's status can: a finished turn is never written twice."""
    written = bool(Turn.objects.filter(pk=turn.pk, status__in=TURN_UNFINISHED).update(**fields))
    if written:
        for name, value in fields.items():
            if not hasattr(value, "resolve_expression"):  # plain values; an expression is read back by the caller
                setattr(turn, name, value)
    return written


_COMPLETE = """
WITH held AS (
    SELECT {held} AS ok
), s AS (
    UPDATE chat_sessions_chatsession SET updated_at = %(now)s{session_sets}
    WHERE id = %(session)s AND (SELECT ok FROM held)
      AND EXISTS (SELECT 1 FROM chat_sessions_turn WHERE id = %(turn)s AND status = ANY(%(unfinished)s))
    RETURNING state, status, version, retry_count, updated_at, data
), t AS (
    UPDATE chat_sessions_turn SET status = %(status)s, assistant_message = %(reply)s, steps = %(steps)s,
        retrieval = %(retrieval)s::jsonb, prompt_tokens = %(prompt_tokens)s, completed_at = %(now)s,
        state_after = (SELECT state FROM s), error = '',
        composition = COALESCE(%(composition)s::jsonb, composition),
        is_demo = is_demo OR %(is_demo)s, truncated = truncated OR %(truncated)s
    WHERE id = %(turn)s AND status = ANY(%(unfinished)s) AND EXISTS (SELECT 1 FROM s)
    RETURNING id
), calls AS (
    {insert_calls} WHERE EXISTS (SELECT 1 FROM t)
)
SELECT (SELECT ok FROM held), (SELECT count(*) FROM t), s.state, s.status, s.version, s.retry_count,
    s.updated_at, s.data
FROM (SELECT 1) AS one LEFT JOIN s ON true
"""
_RESET_FAILURES = ", retry_count = 0, version = CASE WHEN retry_count > 0 THEN version + 1 ELSE version END"


@dataclass(frozen=True)
class CompleteWrite:
    """What ``turn_complete_write`` found: whether the lease was held, whether the turn was completed, and the
    session's row as written (state, status, version, retry count, updated at, data) when it was."""

    held: bool
    completed: bool
    session_row: tuple[Any, ...] = ()


def turn_complete_write(
    *,
    session_id: Any,
    turn_id: int,
    lease_owner: Any,
    fields: dict[str, Any],
    calls_json: str,
    resets_failures: bool,
    now: Any,
) -> CompleteWrite:
    """Complete an unfinished turn in one statement, only while ``lease_owner`` holds the session's lease: the
    session touched (its failure count reset when ``resets_failures``), the turn's ``fields`` written (status,
    reply, steps, retrieval, prompt tokens; composition, is_demo and truncated when given), and its model calls'
    records (``calls_json``, ``agents.call_records.llm_calls_json``) inserted with it."""
    sql = _COMPLETE.format(
        held=HELD_SQL,
        session_sets=_RESET_FAILURES if resets_failures else "",
        insert_calls=llm_calls_insert_sql("calls"),
    )
    params = {
        "lease_owner": lease_owner,
        "now": now,
        "session": session_id,
        "turn": turn_id,
        "unfinished": [str(s) for s in TURN_UNFINISHED],
        "status": str(fields["status"]),
        "reply": fields["assistant_message"],
        "steps": fields["steps"],
        "retrieval": json.dumps(fields["retrieval"], cls=DjangoJSONEncoder),
        "prompt_tokens": fields["prompt_tokens"],
        "composition": json.dumps(fields["composition"], cls=DjangoJSONEncoder) if "composition" in fields else None,
        "is_demo": bool(fields.get("is_demo")),
        "truncated": bool(fields.get("truncated")),
        "calls": calls_json,
    }
    with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return CompleteWrite(held=bool(row[0]), completed=bool(row[1]), session_row=tuple(row[2:]) if row[1] else ())


# --- hand-off ---------------------------------------------------------------------------------------------
def turn_staff_reply_append(*, session: ChatSession, turn: Turn, reply: dict[str, Any], signed: str) -> None:
    """A person's reply added to ``turn``: ``signed`` appended to its text and ``reply`` to its staff replies,
    in one statement, so two staff replying at once both land (a read-modify-write kept only the last one);
    the session's ``updated_at`` moves on."""
    Turn.objects.filter(pk=turn.pk).update(
        assistant_message=Case(
            When(assistant_message="", then=Value(signed)),
            default=Concat(F("assistant_message"), Value("\n\n" + signed)),
            output_field=TextField(),
        ),
        staff_replies=Func(
            F("staff_replies"),
            Cast(Value(json.dumps([reply])), JSONField()),
            template="%(expressions)s",
            arg_joiner=" || ",
        ),
    )
    ChatSession.objects.filter(pk=session.pk).update(updated_at=timezone.now())


def session_hand_off(*, session: ChatSession, detail: str, turn: Turn | None = None) -> bool:
    """Hand the session to a person (``NEEDS_HUMAN``: the agent stops answering it) and checkpoint it, with the
    turn that did it if one did; the instance is read again. False, and nothing written, when it was with a
    person already. The one place a session is handed off: by its turn (the workflow, the routing, the model,
    the step limit) or by staff. A ``turn`` that did it records the state it left the session in."""
    changed = (
        ChatSession.objects.filter(pk=session.pk)
        .exclude(status=ChatSession.Status.NEEDS_HUMAN)
        .update(status=ChatSession.Status.NEEDS_HUMAN, version=F("version") + 1, updated_at=timezone.now())
    )
    session.refresh_from_db(from_queryset=ChatSession.objects.select_related("agent", "user"))
    if changed:
        checkpoint_record(session=session, reason=Checkpoint.Reason.HANDOFF, turn=turn, detail=detail[:500])
    if turn is not None:
        Turn.objects.filter(pk=turn.pk).update(state_after=session.state)
        turn.state_after = session.state
    return bool(changed)


def turn_insert(*, turn: Turn, title: str) -> None:
    """Save the new ``turn`` with its before-call checkpoint and the session's first ``title`` (when it has
    none): in one statement (``turn_insert_with_checkpoint``), or in a transaction of a few when another writer
    (a staff action) took the checkpoint's number meanwhile."""
    if turn_insert_with_checkpoint(turn=turn, title=title):
        return
    with transaction.atomic():
        turn.save(force_insert=True)
        checkpoint_before_call(session=turn.session, turn=turn)
        if title:
            ChatSession.objects.filter(pk=turn.session_id, title="").update(title=title)


def session_hand_back(*, session: ChatSession, actor: Any = None) -> ChatSession:
    """Give a handed-off session back to the agent (its failure count reset), and checkpoint it."""
    ChatSession.objects.filter(pk=session.pk).update(
        status=ChatSession.Status.ACTIVE, retry_count=0, version=F("version") + 1, updated_at=timezone.now()
    )
    session.refresh_from_db(from_queryset=ChatSession.objects.select_related("agent", "user"))
    checkpoint_record(session=session, reason=Checkpoint.Reason.RESUME, detail=f"handoff resumed by {actor or 'staff'}")
    return session


# --- operator and user actions ---------------------------------------------------------------------------
def session_reset(*, session: ChatSession, actor: Any = None) -> ChatSession:
    """Start over: the initial state, no data, no retries. The old data stays in the checkpoint log."""
    workflow = get_workflow(session.workflow, session.workflow_version)
    from_state = session.state
    status = ChatSession.Status.ACTIVE if session.status != ChatSession.Status.CLOSED else ChatSession.Status.CLOSED
    with transaction.atomic():
        _compare_and_set(
            session,
            state=workflow.initial_state,
            data={},
            retry_count=0,
            status=status,
            last_good_state=workflow.initial_state,
            last_transition=f"{from_state} -> {workflow.initial_state} (reset)",
        )
        checkpoint_record(
            session=session,
            reason=Checkpoint.Reason.RESET,
            transition=f"{from_state} -> {workflow.initial_state}",
            detail=f"reset by {_actor_name(actor)}",
        )
    return session


def session_resume_from(
    *,
    session: ChatSession,
    checkpoint: Checkpoint,
    actor: Any = None,
    reason: str = Checkpoint.Reason.RESUME,
) -> ChatSession:
    """Put the session back in the state and data of ``checkpoint`` (one of its own), with no retries.

    ``reason`` is ``resume`` for people; crash recovery may pass ``recovered``.
    """
    if checkpoint.session_id != session.pk:
        raise ValueError("that checkpoint belongs to another session")
    workflow = get_workflow(session.workflow, session.workflow_version)
    if checkpoint.state not in workflow.specs:
        raise ValueError(f"checkpoint state {checkpoint.state!r} is not a state of {workflow.name}")
    from_state = session.state
    fields: dict[str, Any] = {
        "state": checkpoint.state,
        "data": dict(checkpoint.data or {}),
        "retry_count": 0,
        "last_transition": f"{from_state} -> {checkpoint.state} (from checkpoint #{checkpoint.seq})",
    }
    if checkpoint.state != workflow.failed_state:
        fields["last_good_state"] = checkpoint.state
    # Resuming is the way out of FAILED (and of COMPLETED, when an operator rewinds a finished session).
    current = ChatSession.Status.ACTIVE if session.status != ChatSession.Status.CLOSED else session.status
    fields["status"] = _status_for(workflow, current, checkpoint.state)
    with transaction.atomic():
        _compare_and_set(session, **fields)
        checkpoint_record(
            session=session,
            reason=reason,
            transition=f"{from_state} -> {checkpoint.state}",
            detail=f"resumed from checkpoint #{checkpoint.seq} by {_actor_name(actor)}",
        )
    return session


def session_resume_last_good(*, session: ChatSession, actor: Any = None) -> ChatSession:
    """Resume from the newest checkpoint that is not in the failed state; start over if there is none."""
    checkpoint = last_good_checkpoint(session=session)
    if checkpoint is None:
        return session_reset(session=session, actor=actor)
    return session_resume_from(session=session, checkpoint=checkpoint, actor=actor)


# --- retention -------------------------------------------------------------------------------------------
def checkpoints_prune(
    *,
    keep_last: int | None = None,
    dry_run: bool = False,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> int:
    """Delete old checkpoints: per session keep the newest ``keep_last`` and every one whose reason is in
    ``PRUNE_KEEP_REASONS`` (transitions, resets, resumes, failures, handoffs). Returns how many went
    (or would go, with ``dry_run``). ``on_progress(done, total, deleted)`` is called after each session.
    """
    keep = int(keep_last if keep_last is not None else getattr(settings, "CHECKPOINT_KEEP_LAST", 50))
    if keep < 1:
        raise ValueError("keep_last must be at least 1")
    session_ids = list(sessions_over_checkpoint_limit(keep_last=keep))
    total = 0
    for index, session_id in enumerate(session_ids, start=1):
        doomed = prune_candidates(session_id=session_id, keep_last=keep)
        if dry_run:
            total += doomed.count()
        else:
            deleted, _ = Checkpoint.objects.filter(pk__in=list(doomed.values_list("pk", flat=True))).delete()
            total += deleted
        if on_progress is not None:
            on_progress(index, len(session_ids), total)
    return total
