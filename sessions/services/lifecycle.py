"""What people do to a session as a whole: create it, delete it, start it over, resume it from a checkpoint.

Resets and resumes are operators' and users' actions (the admin, the chat's failed state): version-checked
writes (``versioned``), each with its checkpoint; the old data stays in the checkpoint log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents.workflows import get_workflow
from core import events as run_channel
from core.text import title_from
from sessions.locks import SessionBusyError, session_lease_take_in_transaction
from sessions.models import ChatSession, Checkpoint, SessionLease, Turn
from sessions.selectors import last_good_checkpoint
from sessions.services.checkpoints import checkpoint_record
from sessions.services.transitions import status_for
from sessions.services.versioned import compare_and_set


def _actor_name(actor: Any) -> str:
    if actor is None:
        return "system"
    getter = getattr(actor, "get_username", None)
    return str(getter()) if callable(getter) else str(actor)


# --- creation and deletion -----------------------------------------------------------------------------
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


def session_create_with_history(*, user: Any, agent: Any, exchanges: Sequence[tuple[str, str]]) -> ChatSession:
    """A new session holding a conversation a client brought (a chat UI that sends the whole history with each
    message, for a conversation this app does not hold: edited, branched, begun elsewhere): each (user message,
    reply) saved as an answered turn, so the model sees them and the client's next request finds this session.
    No memory is written from them (what was said elsewhere is not taken as told here), nor any checkpoint: the
    workflow starts from its initial state."""
    with transaction.atomic():
        session = session_create(user=user, agent=agent, title=title_from(exchanges[0][0]) if exchanges else "")
        now = timezone.now()
        Turn.objects.bulk_create(
            Turn(
                session=session,
                seq=seq,
                user_message=said,
                assistant_message=reply,
                status=Turn.Status.COMPLETED,
                state_before=session.state,
                state_after=session.state,
                started_at=now,
                completed_at=now,
                memories_written_at=now,  # brought, not told here: the memory-write sweep leaves them
            )
            for seq, (said, reply) in enumerate(exchanges, start=1)
        )
    return session


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


# --- operator and user actions ---------------------------------------------------------------------------
def session_reset(*, session: ChatSession, actor: Any = None) -> ChatSession:
    """Start over: the initial state, no data, no retries. The old data stays in the checkpoint log."""
    workflow = get_workflow(session.workflow, session.workflow_version)
    from_state = session.state
    status = ChatSession.Status.ACTIVE if session.status != ChatSession.Status.CLOSED else ChatSession.Status.CLOSED
    with transaction.atomic():
        compare_and_set(
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
    fields["status"] = status_for(workflow, current, checkpoint.state)
    with transaction.atomic():
        compare_and_set(session, **fields)
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
