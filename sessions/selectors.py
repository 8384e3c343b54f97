"""Reads about sessions: one's own sessions and their turns; workflow state: checkpoint timelines, recovery
candidates, retention; the summaries still to be written."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Count, Exists, F, Max, OuterRef, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from agents.workflows import get_workflow
from core.db import instances_from_rows, refresh_from, select_columns
from sessions.models import TURN_UNFINISHED, ChatSession, Checkpoint, SessionLease, Turn

# Checkpoints that mark a change of state are history worth keeping forever; the rest can be pruned.
PRUNE_KEEP_REASONS: tuple[str, ...] = (
    Checkpoint.Reason.TRANSITION,
    Checkpoint.Reason.RESET,
    Checkpoint.Reason.RESUME,
    Checkpoint.Reason.FAILED,
    Checkpoint.Reason.HANDOFF,
    Checkpoint.Reason.FORK,
)


def own_sessions(user: Any) -> QuerySet[ChatSession]:
    """The sessions ``user`` may see through the API and MCP: their own (with their agent)."""
    return ChatSession.objects.filter(user=user).select_related("agent")


def own_session(user: Any, session_id: UUID | str) -> ChatSession | None:
    """One of ``user``'s sessions, or None for any other id: someone else's as much as a missing one, or a
    string that is no UUID."""
    try:
        key = session_id if isinstance(session_id, UUID) else UUID(session_id)
    except ValueError:
        return None
    return own_sessions(user).filter(pk=key).first()


def session_turns(*, session: ChatSession) -> QuerySet[Turn]:
    """The session's turns, oldest first (the API's message list, MCP's transcript)."""
    return Turn.objects.filter(session=session).order_by("seq")


def session_checkpoints(*, session: ChatSession) -> QuerySet[Checkpoint]:
    """The session's checkpoint timeline, oldest first."""
    return Checkpoint.objects.filter(session=session).select_related("turn").order_by("seq")


def last_good_checkpoint(*, session: ChatSession) -> Checkpoint | None:
    """The newest checkpoint whose state is not the workflow's failed state (where "resume" goes back to)."""
    failed = get_workflow(session.workflow, session.workflow_version).failed_state
    qs = Checkpoint.objects.filter(session=session).order_by("-seq")
    if failed:
        qs = qs.exclude(state=failed)
    return qs.first()


def turn_checkpoint_before_call(*, turn: Turn) -> Checkpoint | None:
    """The first checkpoint written for ``turn``: the state the session was in when the turn began."""
    return Checkpoint.objects.filter(turn=turn, reason=Checkpoint.Reason.BEFORE_CALL).order_by("seq").first()


def stuck_turns_find(*, older_than: timedelta | datetime) -> QuerySet[Turn]:
    """Turns a crash left behind: running since before the cutoff, or saved but never started.

    ``older_than`` is an age (``timedelta``) or an absolute cutoff. The runtime resumes each from its
    last checkpoint. Uses the ``turn_stuck_sweep`` index (status, started_at).
    """
    cutoff = timezone.now() - older_than if isinstance(older_than, timedelta) else older_than
    return (
        Turn.objects.filter(
            Q(status=Turn.Status.RUNNING, started_at__lt=cutoff)
            | Q(status=Turn.Status.PENDING, started_at__isnull=True, created_at__lt=cutoff)
        )
        .select_related("session")
        .order_by("created_at")
    )


def orphaned_turns_find(*, older_than: timedelta | datetime) -> QuerySet[Turn]:
    """``stuck_turns_find`` narrowed to the turns nobody runs: their session's lease is free or has run out (its
    runner died, or let it go). A turn whose runner is alive is never among them, however long it runs."""
    live = SessionLease.objects.filter(session_id=OuterRef("session_id"), expires_at__gte=Now())
    return stuck_turns_find(older_than=older_than).exclude(Exists(live))


def unclaimed_lease_owners(*, older_than: timedelta) -> list[str]:
    """The owners of leases handed over (to a turn worker, with a task) more than ``older_than`` ago and still
    unclaimed: each one's task is either still queued, or lost."""
    cutoff = timezone.now() - older_than
    rows = SessionLease.objects.filter(handed_over_at__lt=cutoff, expires_at__gte=Now()).values_list("owner", flat=True)
    return [str(owner) for owner in rows]


def sessions_over_checkpoint_limit(*, keep_last: int) -> QuerySet[Any]:
    """Ids of sessions with more than ``keep_last`` checkpoints (the only ones pruning can touch)."""
    return (
        Checkpoint.objects.values("session_id")
        .annotate(n=Count("id"))
        .filter(n__gt=keep_last)
        .order_by("session_id")
        .values_list("session_id", flat=True)
    )


def prune_candidates(*, session_id: Any, keep_last: int) -> QuerySet[Checkpoint]:
    """Checkpoints of one session the retention policy would delete: older than its newest ``keep_last``, not a
    state change (see ``PRUNE_KEEP_REASONS``), and not one a branch needs: the first checkpoint of each turn (the
    state a fork at that turn, an edit or a regenerate, starts from) and any a live branch was forked from.
    Uses the (session, seq) unique index."""
    newest = list(
        Checkpoint.objects.filter(session_id=session_id).order_by("-seq").values_list("seq", flat=True)[:keep_last]
    )
    if len(newest) < keep_last:
        return Checkpoint.objects.none()
    turn_starts = (
        Checkpoint.objects.filter(session_id=session_id, reason=Checkpoint.Reason.BEFORE_CALL, turn__isnull=False)
        .order_by("turn_id", "seq")
        .distinct("turn_id")
        .values("pk")
    )
    forked_from = ChatSession.objects.filter(parent_id=session_id, forked_from__isnull=False).values("forked_from_id")
    return (
        Checkpoint.objects.filter(session_id=session_id, seq__lt=newest[-1])
        .exclude(reason__in=PRUNE_KEEP_REASONS)
        .exclude(pk__in=turn_starts)
        .exclude(pk__in=forked_from)
    )


def summaries_waiting() -> QuerySet[ChatSession]:
    """The sessions whose requested summary has not been written yet (requested past the turn it reaches)."""
    return ChatSession.objects.filter(summary_requested_seq__gt=F("summary_through_seq"))


def session_failure_message(*, session: ChatSession) -> str:
    """The clear message for a session in the failed state: what is kept, and the two ways forward."""
    workflow = get_workflow(session.workflow, session.workflow_version)
    known = ", ".join(f"{k}={v}" for k, v in (session.data or {}).items() if v not in (None, ""))
    resume_at = session.last_good_state or workflow.initial_state
    kept = f" I still have what you told me: {known}." if known else ""
    return (
        f"Sorry — this did not work after {session.retry_count} attempts, so I stopped.{kept} "
        f"You can resume from the last good step ({resume_at}) or start over."
    )


_AGENT_MODEL: Any = ChatSession._meta.get_field("agent").related_model
_USER_MODEL: Any = ChatSession._meta.get_field("user").related_model
_WIDTHS = (len(ChatSession._meta.concrete_fields), len(_AGENT_MODEL._meta.concrete_fields))
_UNFINISHED = [str(status) for status in TURN_UNFINISHED]
# The session with its agent and user, its last turn number and whether a turn of it is unfinished: what
# ``ChatSession.objects.select_related("agent", "user").annotate(...)`` reads, written once here because
# building and compiling that queryset cost more than running it, on every turn.
_SESSION_FOR_TURN_SQL = f"""
    SELECT {select_columns(ChatSession, "s")}, {select_columns(_AGENT_MODEL, "a")}, {select_columns(_USER_MODEL, "u")},
           (SELECT t.seq FROM {Turn._meta.db_table} t WHERE t.session_id = s.id ORDER BY t.seq DESC LIMIT 1),
           EXISTS (SELECT 1 FROM {Turn._meta.db_table} t WHERE t.session_id = s.id AND t.status = ANY(%(unfinished)s))
    FROM {ChatSession._meta.db_table} s
    JOIN {_AGENT_MODEL._meta.db_table} a ON a.id = s.agent_id
    JOIN {_USER_MODEL._meta.db_table} u ON u.id = s.user_id
    WHERE s.id = %(session)s
"""


def session_for_turn(*, session: ChatSession) -> tuple[int, bool]:
    """Read ``session`` again in place, with its agent and user, in one query; return its last turn number and
    whether a turn of it is unfinished. ``ChatSession.DoesNotExist`` when it was deleted."""
    with connection.cursor() as cursor:
        cursor.execute(_SESSION_FOR_TURN_SQL, {"session": session.pk, "unfinished": _UNFINISHED})
        row = cursor.fetchone()
    if row is None:
        raise ChatSession.DoesNotExist("the session was deleted")
    n_session, n_agent = _WIDTHS
    (fresh,) = instances_from_rows(ChatSession, [row[:n_session]])
    (agent,) = instances_from_rows(_AGENT_MODEL, [row[n_session : n_session + n_agent]])
    (user,) = instances_from_rows(_USER_MODEL, [row[n_session + n_agent : -2]])
    ChatSession._meta.get_field("agent").set_cached_value(fresh, agent)
    ChatSession._meta.get_field("user").set_cached_value(fresh, user)
    refresh_from(session, fresh)
    last_seq, unfinished = row[-2], row[-1]
    return int(last_seq or 0), bool(unfinished)


def unfinished_turns(*, session: ChatSession) -> list[Turn]:
    """The session's turns still marked running or pending, oldest first."""
    return list(session.turns.filter(status__in=TURN_UNFINISHED).order_by("seq"))


# --- branches --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BranchVersions:
    """Where one turn of a branch stands among the versions of that turn in its chat: ``index`` (1-based) of
    ``total``, and the session each version is on, in the order they were made."""

    seq: int
    index: int
    total: int
    sessions: tuple[UUID, ...]


def chat_branches(*, session: ChatSession) -> QuerySet[ChatSession]:
    """The branches of ``session``'s chat (itself included), oldest first: one session when never forked. Uses
    ``session_user_branches`` (user, chat_root)."""
    if session.chat_root is None:  # a fork sets it on the session it is made from too
        return ChatSession.objects.filter(pk=session.pk)
    return ChatSession.objects.filter(user_id=session.user_id, chat_root=session.chat_id).order_by("created_at", "pk")


def chat_current_branch(*, user_id: Any, chat_root: UUID | None) -> tuple[UUID, datetime] | None:
    """The branch a chat is on, with when it got there: the one its person did something on last (a message, a
    fork, a version chosen). None for a chat never forked (``chat_root`` None)."""
    if chat_root is None:
        return None
    row = (
        ChatSession.objects.filter(user_id=user_id, chat_root=chat_root)
        .order_by("-updated_at", "pk")
        .values_list("pk", "updated_at")
        .first()
    )
    return (row[0], row[1]) if row else None


def _family(session: ChatSession) -> dict[UUID, tuple[UUID | None, int | None]]:
    """Each branch of the chat: its parent and fork point."""
    rows = chat_branches(session=session).values_list("pk", "parent_id", "fork_seq")
    return {pk: (parent, fork_seq) for pk, parent, fork_seq in rows}


def branch_lineage(*, session: ChatSession) -> list[tuple[UUID, int | None]]:
    """The sessions whose turns ``session``'s branch is made of, with the turn number they end before (None: all
    of them): itself, its parent below its fork point, the parent's parent below the lower of both, ..."""
    family = _family(session)
    lineage: list[tuple[UUID, int | None]] = []
    seen: set[UUID] = set()
    current: UUID | None = session.pk
    below: int | None = None
    while current is not None and current not in seen:
        seen.add(current)
        lineage.append((current, below))
        parent, fork_seq = family.get(current, (None, None))
        if parent is None or fork_seq is None:
            break
        below = fork_seq if below is None else min(below, fork_seq)
        current = parent
    return lineage


def turn_origin(family: dict[UUID, tuple[UUID | None, int | None]], session_id: UUID, seq: int) -> UUID:
    """The session where turn ``seq`` of ``session_id``'s branch was said (the others hold copies of it)."""
    current = session_id
    seen = {current}
    while True:
        parent, fork_seq = family.get(current, (None, None))
        if parent is None or fork_seq is None or seq >= fork_seq or parent not in family or parent in seen:
            return current
        current = parent
        seen.add(current)


def branch_versions(*, session: ChatSession) -> dict[int, BranchVersions]:
    """For each turn of ``session`` that has more than one version in its chat (an edited message, a
    regenerated reply), which version it is and where the others are; empty for a chat never forked.

    The versions of turn n are the branches where a turn n was said (not copied) after the same turns before
    it, oldest first."""
    family = _family(session)
    if len(family) < 2:
        return {}
    last = dict(
        Turn.objects.filter(session_id__in=list(family))
        .values("session_id")
        .annotate(m=Max("seq"))
        .values_list("session_id", "m")
    )
    versions: dict[int, BranchVersions] = {}
    for seq in range(1, int(last.get(session.pk) or 0) + 1):
        before = turn_origin(family, session.pk, seq - 1) if seq > 1 else None
        said = [
            pk
            for pk in family  # oldest first
            if (last.get(pk) or 0) >= seq
            and turn_origin(family, pk, seq) == pk
            and (before is None or turn_origin(family, pk, seq - 1) == before)
        ]
        mine = turn_origin(family, session.pk, seq)
        if len(said) > 1 and mine in said:
            versions[seq] = BranchVersions(seq=seq, index=said.index(mine) + 1, total=len(said), sessions=tuple(said))
    return versions


def turns_off_branch(*, user_id: Any, session_id: UUID | None = None) -> list[int]:
    """Ids of the turns of ``user_id``'s chats whose memories are not recalled on ``session_id``'s branch (or,
    with no session, in general): every turn of the session's own chat that is not on its branch, and every turn
    of any chat that a fork left behind (said at or after the turn a branch was made at: an edited message, a
    regenerated reply), unless it is on this branch. Empty for a user who never branched a chat. The rule is the
    database function ``chat_turns_off_branch`` (migration 0012), which retrieval reads inside its own statements;
    docs/memory.md, "Branches"."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT chat_turns_off_branch(%s, %s)", [user_id, session_id])
        row = cursor.fetchone()
    return sorted(int(pk) for pk in (row[0] if row and row[0] else []))


@dataclass(frozen=True)
class TurnBranch:
    """Where a turn of a branched chat stands: on its chat's branch ``number`` of ``total`` (oldest first), and
    whether a fork left it behind (a branch was made at it or before it: an edit, a regenerate)."""

    session_id: UUID
    seq: int
    number: int
    total: int
    left_behind: bool


def turn_branches(*, turn_ids: list[int]) -> dict[int, TurnBranch]:
    """``TurnBranch`` of each of ``turn_ids`` that belongs to a branched chat (the others are not in it)."""
    turns = list(
        Turn.objects.filter(pk__in=turn_ids, session__chat_root__isnull=False).values_list(
            "pk", "session_id", "seq", "session__chat_root", "session__user_id"
        )
    )
    if not turns:
        return {}
    roots = {root for _pk, _session, _seq, root, _user in turns}
    users = {user for _pk, _session, _seq, _root, user in turns}
    branches = list(
        ChatSession.objects.filter(chat_root__in=roots, user_id__in=users)
        .order_by("created_at", "pk")
        .values_list("pk", "chat_root", "parent_id", "fork_seq")
    )
    numbers: dict[UUID, int] = {}
    totals: dict[UUID | None, int] = {}
    for pk, root, _parent, _fork_seq in branches:
        totals[root] = totals.get(root, 0) + 1
        numbers[pk] = totals[root]
    # Left behind: off every branch but those that still have it, by the rule retrieval reads.
    left_behind = {pk for user in users for pk in turns_off_branch(user_id=user)}
    return {
        pk: TurnBranch(
            session_id=session_id,
            seq=seq,
            number=numbers.get(session_id, 1),
            total=totals.get(root, 1),
            left_behind=pk in left_behind,
        )
        for pk, session_id, seq, root, _user in turns
    }
