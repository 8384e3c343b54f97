"""SQL pieces every stage shares: "in force now", "not in the prompt's window", and the light rows (every
column but the vectors) with the ``Memory`` built from each.

Every query here filters on the requesting user: no path returns another user's memory (shared
procedures, with no user, are everyone's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from memory.models import Memory
from sessions.selectors import turns_off_branch

CURRENT_SQL = (
    "NOT archived AND valid_from <= %(now)s AND (valid_to IS NULL OR valid_to > %(now)s) "
    "AND (expires_at IS NULL OR expires_at > %(now)s)"
)
# Not an episode of a turn the prompt still shows (params wsession, wfloor: see RecentWindow). COALESCE:
# a memory with no session or turn compares as NULL, and is kept.
# Not said on a turn off the branch the prompt is for (params offbranch: see RecentWindow.off_branch; the
# branch rule of docs/memory.md, "Branches").
ON_BRANCH_SQL = "NOT COALESCE(source_turn_id = ANY(%(offbranch)s::bigint[]), false)"
NOT_IN_WINDOW_SQL = (
    "NOT COALESCE(kind = 'episodic' AND source_session_id = %(wsession)s AND source_turn_id IN "
    "(SELECT w.id FROM chat_sessions_turn w WHERE w.session_id = %(wsession)s AND w.seq > %(wfloor)s), false)"
    f" AND {ON_BRANCH_SQL}"
)


@dataclass(frozen=True)
class RecentWindow:
    """The turns of a chat session that its prompt shows (those numbered above ``after_seq``): their episodes
    are not sent to the model a second time as memories. ``off_branch``: the turns whose memories are not
    recalled for this session (``branch_window``)."""

    session_id: Any
    after_seq: int
    off_branch: tuple[int, ...] = ()


def branch_window(*, user_id: Any, window: RecentWindow | None) -> RecentWindow:
    """``window`` with the turns whose memories its session does not recall (said on another branch of its chat,
    or left behind by a fork; ``sessions.selectors.turns_off_branch``). With no session: those left behind."""
    session_id = window.session_id if window is not None else None
    off = tuple(turns_off_branch(user_id=user_id, session_id=session_id))
    if window is None:
        return RecentWindow(session_id=None, after_seq=0, off_branch=off)
    return RecentWindow(session_id=window.session_id, after_seq=window.after_seq, off_branch=off)


def window_params(window: RecentWindow | None) -> dict[str, Any]:
    return {
        "wsession": window.session_id if window else None,
        "wfloor": window.after_seq if window else 0,
        "offbranch": list(window.off_branch) if window else [],
    }


# Every column but the vectors (not needed past the search; parsing 384 floats a row is not free).
LIGHT_FIELDS = [f for f in Memory._meta.concrete_fields if f.name not in ("embedding", "search_vector")]
LIGHT_COLUMNS = ", ".join(f.column for f in LIGHT_FIELDS)
_LIGHT_ATTNAMES = [f.attname for f in LIGHT_FIELDS]


def light_memories(sql: str, params: dict[str, Any]) -> list[tuple[Memory, tuple[Any, ...]]]:
    """Run ``sql`` (its columns: ``LIGHT_COLUMNS``, then any extras) and build each row's ``Memory`` (its
    vectors deferred), with the row's extra columns. ``Memory.objects.raw`` does the same at twice the cost
    per row; none of these fields converts its database value (checked in tests/memory)."""
    width = len(_LIGHT_ATTNAMES)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall()
    alias = connection.alias
    return [(Memory.from_db(alias, _LIGHT_ATTNAMES, row[:width]), row[width:]) for row in fetched]
