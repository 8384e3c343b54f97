"""Tier 2's last round trip: the rows of every candidate (vectors left out), and the episodes next to the
best candidates in their chat session, which get a share of that candidate's score."""

from __future__ import annotations

from typing import Any

from memory.models import Memory
from memory.retrieval import tuning
from memory.retrieval.result import HybridCandidate
from memory.retrieval.sql import LIGHT_FIELDS, RecentWindow, light_memories, window_params

# The neighbours of the best candidates (the episodes just before and after each in its own chat session,
# within NEIGHBOUR_MAX_GAP), then the rows of every candidate and neighbour.
_NEIGHBOUR_SQL = """(SELECT {a}.id FROM memory_memory {a}
                 WHERE {a}.source_session_id = c.source_session_id AND {a}.kind = 'episodic' AND NOT {a}.archived
                   AND {a}.user_id = c.user_id AND {a}.occurred_at {op} c.occurred_at
                   AND {a}.occurred_at {within} c.occurred_at {sign} %(gap)s AND {a}.id <> c.id
                   AND NOT COALESCE({a}.source_turn_id IN (SELECT w.id FROM chat_sessions_turn w
                                    WHERE w.session_id = %(wsession)s AND w.seq > %(wfloor)s), false)
                   AND NOT COALESCE({a}.source_turn_id = ANY((SELECT chat_turns_off_branch(%(user)s,
                                    %(wsession)s::uuid))::bigint[]), false)
                 ORDER BY {a}.occurred_at {order} LIMIT 1)"""
_NEIGHBOURS_AND_ROWS_SQL = f"""
        WITH src AS MATERIALIZED (
            SELECT c.id,
              {_NEIGHBOUR_SQL.format(a="p", op="<", within=">=", sign="-", order="DESC")} AS before_id,
              {_NEIGHBOUR_SQL.format(a="n", op=">", within="<=", sign="+", order="ASC")} AS after_id
            FROM memory_memory c
            WHERE c.id = ANY(%(sources)s::bigint[]) AND c.user_id = %(user)s AND c.kind = 'episodic'
              AND c.source_session_id IS NOT NULL
        ), wanted AS (
            SELECT unnest(%(ids)s::bigint[]) AS id UNION SELECT before_id FROM src UNION SELECT after_id FROM src
        )
        SELECT {", ".join(f"m.{f.column}" for f in LIGHT_FIELDS)}, src.before_id, src.after_id, s.workflow
        FROM memory_memory m LEFT JOIN src ON src.id = m.id
          LEFT JOIN chat_sessions_chatsession s ON s.id = m.source_session_id AND m.kind = 'episodic'
        WHERE m.user_id = %(user)s AND m.id IN (SELECT id FROM wanted)
"""


def neighbours_and_rows(
    *,
    user_id: int,
    by_id: dict[int, HybridCandidate],
    window: RecentWindow | None = None,
    workflows: dict[int, str] | None = None,
) -> dict[int, Memory]:
    """Load the rows of every candidate (vectors left out), and give the episodes just before and after a
    strong candidate part of its score: one round trip. ``workflows`` is filled with the workflow of each
    episode's chat session (an agent's scope: ``relevance.scope_weights``).

    A conversation's answer often sits in the turn next to the one that matches the words ("Yes, in
    Paris!" after "Where did you go?"): neighbours of the best candidates become candidates themselves.
    Only where the neighbours are real: episodes of the same chat session, close in time. Rows written one
    after another (an import, the API) are not a conversation, and have no neighbours.
    """
    if not by_id:
        return {}
    top = sorted(by_id.values(), key=lambda c: -c.fused)[: tuning.NEIGHBOUR_SOURCES] if tuning.NEIGHBOUR_WEIGHT else []
    params = {
        "sources": [c.memory_id for c in top],
        "ids": list(by_id),
        "user": user_id,
        "gap": tuning.NEIGHBOUR_MAX_GAP,
        **window_params(window),
    }
    rows: dict[int, Memory] = {}
    links: dict[int, tuple[Any, ...]] = {}
    for memory, (before_id, after_id, workflow) in light_memories(_NEIGHBOURS_AND_ROWS_SQL, params):
        rows[memory.id] = memory
        links[memory.id] = (before_id, after_id)
        if workflow is not None and workflows is not None:
            workflows[memory.id] = workflow
    for parent in top:
        if parent.memory_id not in rows:
            continue
        for neighbour in links[parent.memory_id]:
            if neighbour is None or neighbour not in rows:
                continue
            cand = by_id.setdefault(neighbour, HybridCandidate(neighbour))
            cand.fused += tuning.NEIGHBOUR_WEIGHT * parent.fused
            cand.similarity = max(cand.similarity, tuning.NEIGHBOUR_WEIGHT * parent.similarity)
            cand.text_share = max(cand.text_share, tuning.NEIGHBOUR_WEIGHT * parent.text_share)
    return rows
