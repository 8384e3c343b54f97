"""Tier 1: exact lookups of one user (profile facts, pinned memories, recent actions) and the candidate
procedures, in one round trip; and the procedures' triggers."""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings

from memory.models import Memory
from memory.retrieval import tuning
from memory.retrieval.sql import (
    CURRENT_SQL,
    LIGHT_COLUMNS,
    NOT_IN_WINDOW_SQL,
    ON_BRANCH_SQL,
    RecentWindow,
    light_memories,
    window_params,
)
from memory.retrieval.words import WORD

if TYPE_CHECKING:
    from agents.models import Agent


PROCEDURE = "procedure"  # the reason label of procedures in the combined tier-1 query
_TIER1_REASONS = ("profile fact", "pinned", "recent action", PROCEDURE)
# Tier 1 in one round trip: four short lookups, each on its own index, each numbered in its own order.
# (Hand-written: the same query through the ORM took longer to compile than to run.)
_TIER1_SQL = f"""
(SELECT {LIGHT_COLUMNS}, 0 AS lookup_branch, row_number() OVER (ORDER BY fact_key, valid_from DESC) AS lookup_rank
   FROM memory_memory WHERE user_id = %(user)s AND {CURRENT_SQL}
    AND kind = 'semantic' AND valid_to IS NULL AND fact_key <> '' AND {ON_BRANCH_SQL}
   ORDER BY fact_key, valid_from DESC LIMIT %(profile)s)  -- index memory_user_profile
UNION ALL
(SELECT {LIGHT_COLUMNS}, 1, row_number() OVER (ORDER BY importance DESC, id)
   FROM memory_memory WHERE user_id = %(user)s AND {CURRENT_SQL} AND pinned AND kind <> 'procedural'
    AND {ON_BRANCH_SQL}
   ORDER BY importance DESC, id LIMIT %(pinned)s)  -- index memory_user_pinned
UNION ALL
(SELECT {LIGHT_COLUMNS}, 2, row_number() OVER (ORDER BY created_at DESC, id DESC)
   FROM memory_memory WHERE user_id = %(user)s AND {CURRENT_SQL} AND kind = 'episodic'
    AND source_turn_id IS NOT NULL AND {NOT_IN_WINDOW_SQL}
    AND (%(scoped)s = '' OR EXISTS (SELECT 1 FROM chat_sessions_chatsession s
                                    WHERE s.id = source_session_id AND s.workflow = %(scoped)s))
   ORDER BY created_at DESC, id DESC LIMIT %(recent)s)  -- index memory_user_recent_actions
UNION ALL
(SELECT {LIGHT_COLUMNS}, 3, row_number() OVER (ORDER BY pinned DESC, importance DESC, id)
   FROM memory_memory WHERE (user_id = %(user)s OR user_id IS NULL) AND {CURRENT_SQL} AND kind = 'procedural'
    AND (agent_id IS NULL OR agent_id = %(agent)s) AND (workflow = '' OR workflow = %(workflow)s)
   ORDER BY pinned DESC, importance DESC, id LIMIT %(procedures)s)
"""


def exact_lookups(
    *, user: Any, now: datetime, agent: Agent | None = None, workflow: str = "", window: RecentWindow | None = None
) -> dict[str, list[Memory]]:
    """Tier 1's lookups of one user and the candidate procedures (trigger not checked yet), by reason.

    Recent actions are the episodes of the user's latest turns with an agent (those the prompt does not
    show already): what they were doing last time, in this workflow where it has a scope (a booking turn's
    recent actions are its bookings', not the small talk of a free chat: ``relevance.scope_weights``). Episodes written through the API or an import are
    records, not recent actions; they compete on relevance like any other memory."""
    params = {
        **window_params(window),
        "user": user.pk,
        "now": now,
        "agent": agent.pk if agent else None,
        "workflow": workflow,
        "scoped": "" if workflow in tuning.SCOPE_OPEN_WORKFLOWS else workflow,
        "profile": tuning.PROFILE_LIMIT,
        "pinned": tuning.PINNED_LIMIT,
        "recent": int(settings.MEMORY_RECENT_ACTIONS),
        "procedures": 50,
    }
    # Each row carries its lookup (branch) and its place in that lookup's order (rank).
    rows = light_memories(_TIER1_SQL, params)
    grouped: dict[str, list[Memory]] = {reason: [] for reason in _TIER1_REASONS}
    for memory, (branch, _rank) in sorted(rows, key=lambda r: r[1]):
        grouped[_TIER1_REASONS[branch]].append(memory)
    return grouped


def tier1_from(grouped: dict[str, list[Memory]]) -> list[tuple[Memory, str]]:
    tier1: list[tuple[Memory, str]] = []
    seen: set[int] = set()
    for reason, memories in grouped.items():
        if reason == PROCEDURE:
            continue
        for memory in memories:
            if memory.id not in seen:
                tier1.append((memory, reason))
                seen.add(memory.id)
    return tier1


def trigger_matches(trigger: str, query: str) -> bool:
    """A trigger is phrases separated by commas or '|'; one phrase found as whole words matches.
    An empty trigger always matches (a standing instruction for the agent or workflow)."""
    phrases = [p.strip().lower() for p in re.split(r"[,|]", trigger) if p.strip()]
    if not phrases:
        return True
    text = " ".join(WORD.findall(query.lower()))
    return any(re.search(rf"\b{re.escape(' '.join(WORD.findall(p)))}\b", text) for p in phrases if WORD.search(p))
