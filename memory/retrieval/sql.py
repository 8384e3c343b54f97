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

CURRENT_SQL = (
    "NOT archived AND valid_from <= %(now)s AND (valid_to IS NULL OR valid_to > %(now)s) "
    "AND (expires_at IS NULL OR expires_at > %(now)s)"
)
# Not an episode of a turn the prompt still shows (params wsession, wfloor: see RecentWindow). COALESCE:
# a memory with no session or turn compares as NULL, and is kept.
# Not said on a turn off the branch the prompt is for (the branch rule, docs/memory.md "Branches"): the database
# function of sessions' migration 0012, read once per statement (an InitPlan); params user, wsession.
ON_BRANCH_SQL = (
    "NOT COALESCE(source_turn_id = ANY((SELECT chat_turns_off_branch(%(user)s, %(wsession)s::uuid))::bigint[]), false)"
)
NOT_IN_WINDOW_SQL = (
    "NOT COALESCE(kind = 'episodic' AND source_session_id = %(wsession)s AND source_turn_id IN "
    "(SELECT w.id FROM chat_sessions_turn w WHERE w.session_id = %(wsession)s AND w.seq > %(wfloor)s), false)"
    f" AND {ON_BRANCH_SQL}"
)


@dataclass(frozen=True)
class RecentWindow:
    """The turns of a chat session that its prompt shows (those numbered above ``after_seq``): their episodes
    are not sent to the model a second time as memories."""

    session_id: Any
    after_seq: int


def window_params(window: RecentWindow | None) -> dict[str, Any]:
    return {"wsession": window.session_id if window else None, "wfloor": window.after_seq if window else 0}


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
