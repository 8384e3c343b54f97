"""The state machine's writes: a turn's decision applied to the session (or refused), and a failed turn counted.

Each writes its checkpoint with it (``transition``, ``invalid_transition``, ``retry``, ``failed``); every state
write is version-checked (``versioned``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from django.db import IntegrityError, connection, transaction
from pydantic import BaseModel, ValidationError

from agents.workflows import MAX_RETRIES, Workflow, WorkflowDecision, get_workflow
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services.checkpoints import checkpoint_number_taken, checkpoint_record
from sessions.services.versioned import compare_and_set, compare_and_set_with_checkpoint

# The name the session's services have always logged under.
logger = logging.getLogger(__name__)


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


def status_for(workflow: Workflow, current: str, state: str) -> str:
    """The session's status in ``state`` of ``workflow``, from its ``current`` status."""
    # A session handed to a human or closed keeps that status; the machine's state does not override it.
    if current in (ChatSession.Status.NEEDS_HUMAN, ChatSession.Status.CLOSED):
        return current
    if workflow.failed_state and state == workflow.failed_state:
        return ChatSession.Status.FAILED
    if state in workflow.terminal_states:
        return ChatSession.Status.COMPLETED
    return ChatSession.Status.ACTIVE


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
    fields["status"] = status_for(workflow, session.status, step.to_state)
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
            cp = compare_and_set_with_checkpoint(
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
            compare_and_set(session, **fields)
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
            status=status_for(workflow, session.status, workflow.failed_state),
            last_transition=f"{from_state} -> {workflow.failed_state}",
        )
    with transaction.atomic():
        compare_and_set(session, **fields)
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
