"""Branches of a chat: a session forked at one of its turns (an edit of that turn's message, a regenerated reply,
or a fork through the API or MCP) continues on a new session, from the checkpoint taken before that turn.

The new branch is a ``ChatSession`` of the same person and agent: its workflow state, slots and retry count are
the checkpoint's; the turns before the fork point are copied, answered and marked as written to memory (their
memories are the originals', recalled on every branch that shares them: ``memory`` reads the branch rule from
``sessions.selectors.turns_off_branch``); the checkpoints before the fork point are copied too, so the new branch
can itself be forked at any of its turns. Nothing runs again: a tool that acted before the fork point (a
booking) acted once, on the branch it was called on, and the new branch carries its outcome in its slots. The
source stays as it was.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from agents.workflows import get_workflow
from core import events as run_channel
from core.errors import Refusal
from sessions.locks import SessionBusyError, session_lease_take_in_transaction
from sessions.models import TURN_UNFINISHED, ChatSession, Checkpoint, SessionLease, Turn
from sessions.selectors import turn_checkpoint_before_call
from sessions.services.checkpoints import checkpoint_record
from sessions.services.transitions import status_for


class ForkRefused(Refusal):
    """The session cannot be forked at that turn (no such turn, or its checkpoint is gone)."""

    code = "fork_refused"
    status = 409
    default_message = "This chat cannot be branched at that turn."

    def __init__(self, code: str, message: str, *, status: int = 409) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


# The turn columns a branch copies as they are (the rest: its own id and session, and memories written now).
_TURN_COPIED = (
    "seq",
    "user_message",
    "assistant_message",
    "status",
    "idempotency_key",
    "error",
    "state_before",
    "state_after",
    "steps",
    "step_limit_hit",
    "staff_replies",
    "truncated",
    "is_demo",
    "composition",
    "retrieval",
    "prompt_tokens",
    "started_at",
    "created_at",
    "completed_at",
)


def session_fork(*, session: ChatSession, at_turn: int, actor: Any = None) -> ChatSession:
    """A new branch of ``session``'s chat that replaces its turn ``at_turn``: the state, slots and retry count of
    the checkpoint taken before that turn, its summary when the summary ends before it, and copies of the turns
    (and checkpoints) before it. The caller sends the branch's message (the edited one, or the same one again).

    Refused with ``SessionBusyError`` (409 ``session_busy``) while a turn runs on ``session`` or one is
    unfinished (the sweep finishes it first): the fork takes the session's turn lease for its transaction, so
    no turn starts on the source while it copies. ``ForkRefused`` for a turn the session does not have, or
    whose checkpoint is gone."""
    with transaction.atomic():
        if not session_lease_take_in_transaction(session.pk):
            raise SessionBusyError("A message on this chat is still being answered; branch it when it has finished.")
        source = ChatSession.objects.select_for_update().get(pk=session.pk)
        if source.status == ChatSession.Status.CLOSED:
            raise ForkRefused("session_closed", "This chat is closed; it cannot be branched.")
        if Turn.objects.filter(session=source, status__in=TURN_UNFINISHED).exists():
            raise SessionBusyError("A message on this chat is still being answered; branch it when it has finished.")
        turn = Turn.objects.filter(session=source, seq=at_turn).first()
        if turn is None:
            raise ForkRefused("no_such_turn", f"This chat has no turn {at_turn}.", status=404)
        checkpoint = turn_checkpoint_before_call(turn=turn)
        if checkpoint is None:
            raise ForkRefused(
                "checkpoint_gone", f"The state before turn {at_turn} is no longer kept; this turn cannot be branched."
            )
        branch = _branch_create(source=source, at_turn=at_turn, checkpoint=checkpoint)
        copied = _turns_copy(source=source, branch=branch, below=at_turn)
        _checkpoints_copy(source=source, branch=branch, below=checkpoint.seq, turns=copied)
        who = _actor_name(actor)
        checkpoint_record(
            session=branch,
            reason=Checkpoint.Reason.FORK,
            transition=f"{source.state} -> {checkpoint.state}",
            detail=f"branched from {source.pk} at turn #{at_turn} (checkpoint #{checkpoint.seq}) by {who}",
        )
        if source.chat_root is None:
            ChatSession.objects.filter(pk=source.pk).update(chat_root=source.pk)
            session.chat_root = source.pk
        SessionLease.objects.filter(session_id=source.pk).delete()
        # The chat's open pages (any tab, on any branch) learn that it moved to a new branch, and follow it.
        _chat_changed_on_commit(branch)
    return branch


def branch_switch(*, session: ChatSession) -> None:
    """Make ``session`` the branch its chat is on (the person moved to it: a version chosen in the chat): the
    chat's open pages, on any branch, follow it (``sessions.selectors.chat_current_branch``)."""
    with transaction.atomic():
        ChatSession.objects.filter(pk=session.pk).update(updated_at=timezone.now())
        _chat_changed_on_commit(session)


def _chat_changed_on_commit(session: ChatSession) -> None:
    branches = list(ChatSession.objects.filter(chat_root=session.chat_id).values_list("pk", flat=True))

    def signal() -> None:
        for pk in branches:
            run_channel.session_changed(pk)

    transaction.on_commit(signal)


def _actor_name(actor: Any) -> str:
    if actor is None:
        return "system"
    getter = getattr(actor, "get_username", None)
    return str(getter()) if callable(getter) else str(actor)


def _branch_create(*, source: ChatSession, at_turn: int, checkpoint: Checkpoint) -> ChatSession:
    workflow = get_workflow(source.workflow, source.workflow_version)
    failed = bool(workflow.failed_state) and checkpoint.state == workflow.failed_state
    # The summary folds turns in order: it stands for the branch only when it ends before the fork point.
    summary_kept = source.summary_through_seq < at_turn
    return ChatSession.objects.create(
        user_id=source.user_id,
        agent_id=source.agent_id,
        title=source.title if at_turn > 1 else "",  # a branch of the first message takes its title from its own
        workflow=source.workflow,
        workflow_version=source.workflow_version,
        state=checkpoint.state,
        data=dict(checkpoint.data or {}),
        retry_count=checkpoint.retry_count,
        last_transition=f"{source.state} -> {checkpoint.state} (branched at turn #{at_turn})",
        last_good_state=source.last_good_state if failed else checkpoint.state,
        status=status_for(workflow, ChatSession.Status.ACTIVE, checkpoint.state),
        summary=source.summary if summary_kept else "",
        summary_through_seq=source.summary_through_seq if summary_kept else 0,
        summary_requested_seq=source.summary_through_seq if summary_kept else 0,
        parent=source,
        fork_seq=at_turn,
        chat_root=source.chat_root or source.pk,
        forked_from=checkpoint,
    )


def _turns_copy(*, source: ChatSession, branch: ChatSession, below: int) -> dict[int, int]:
    """Copy ``source``'s turns numbered below ``below`` into ``branch``; return the new turn ids by the old."""
    columns = ", ".join(_TURN_COPIED)
    table = Turn._meta.db_table
    with connection.cursor() as cursor:
        # In one statement, with their own times (``created_at`` would be now through the ORM): the copies are
        # history, answered, and their memories are the originals' (written: the sweep never extracts them).
        cursor.execute(
            f"INSERT INTO {table} (session_id, {columns}, memories_written_at)"
            f" SELECT %(branch)s, {columns}, %(now)s FROM {table}"
            " WHERE session_id = %(source)s AND seq < %(below)s ORDER BY seq RETURNING id, seq",
            {"branch": branch.pk, "source": source.pk, "below": below, "now": timezone.now()},
        )
        new_by_seq = {seq: pk for pk, seq in cursor.fetchall()}
    old = Turn.objects.filter(session=source, seq__lt=below).values_list("pk", "seq")
    return {pk: new_by_seq[seq] for pk, seq in old}


def _checkpoints_copy(*, source: ChatSession, branch: ChatSession, below: int, turns: dict[int, int]) -> None:
    """Copy ``source``'s checkpoints numbered below ``below`` into ``branch``, pointing at the copied turns."""
    copies = [
        Checkpoint(
            session=branch,
            seq=row.seq,
            turn_id=turns.get(row.turn_id) if row.turn_id is not None else None,
            state=row.state,
            data=row.data,
            retry_count=row.retry_count,
            transition=row.transition,
            reason=row.reason,
            detail=row.detail,
        )
        for row in Checkpoint.objects.filter(session=source, seq__lt=below).order_by("seq")
    ]
    created = Checkpoint.objects.bulk_create(copies)
    if created:
        # Their own times, as the turns': the copied log reads as it happened.
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Checkpoint._meta.db_table} c SET created_at = o.created_at"
                f" FROM {Checkpoint._meta.db_table} o"
                " WHERE c.session_id = %(branch)s AND o.session_id = %(source)s AND o.seq = c.seq",
                {"branch": branch.pk, "source": source.pk},
            )
