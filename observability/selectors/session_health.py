"""Is a session spiralling: one session's per-turn figures, the death-spiral signals among them and its verdict;
and the sessions most at risk in a window (resets, FAILED moves, retried calls, step-limit hits)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.db import connection
from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce

from agents.models import LLMCall, ToolInvocation
from observability.selectors.indicators import least_squares_slope, relative_change
from sessions.models import ChatSession, Checkpoint, Turn


@dataclass(frozen=True)
class TurnHealth:
    seq: int
    turn_id: int
    created_at: dt.datetime
    prompt_tokens: int
    calls: int
    retries: int
    steps: int
    step_limit_hit: bool
    degraded: bool
    tool_errors: int
    state_before: str
    state_after: str
    status: str


@dataclass(frozen=True)
class SessionHealth:
    """Is this session spiralling? The per-turn figures and the signals read from them."""

    session: ChatSession
    turns: list[TurnHealth]
    tokens_growth: float | None
    tokens_slope_per_turn: float | None
    retries: int
    calls: int
    resets: int
    failures: int
    retry_checkpoints: int
    invalid_transitions: int
    state_revisits: int
    state_path: list[str]
    step_limit_hits: int
    tool_errors: int
    signals: list[str]

    @property
    def verdict(self) -> str:
        if len(self.signals) >= 2:
            return "spiralling"
        return "at risk" if self.signals else "healthy"


def _state_revisits(path: Sequence[str]) -> int:
    # A state entered again after the session had left it (A→B→A): the FSM going round in circles.
    seen: set[str] = set()
    revisits = 0
    previous = None
    for state in path:
        if state != previous:
            if state in seen:
                revisits += 1
            seen.add(state)
        previous = state
    return revisits


def _recent_turn_health(session: ChatSession, recent_turns: int) -> list[TurnHealth]:
    """The session's last ``recent_turns`` turns, oldest first, each with its calls' figures and tool errors."""
    turns = list(
        Turn.objects.filter(session=session)
        .order_by("-seq")
        .annotate(
            call_count=Count("llm_calls", distinct=True),
            call_tokens=Coalesce(Sum("llm_calls__prompt_tokens"), 0),
            call_retries=Coalesce(Sum("llm_calls__retries"), 0),
        )[:recent_turns]
    )
    turns.reverse()
    tool_errors_by_turn = dict(
        ToolInvocation.objects.filter(session=session, ok=False)
        .order_by()
        .values("turn_id")
        .annotate(n=Count("id"))
        .values_list("turn_id", "n")
    )
    return [
        TurnHealth(
            seq=turn.seq,
            turn_id=turn.id,
            created_at=turn.created_at,
            prompt_tokens=turn.prompt_tokens or int(turn.call_tokens),
            calls=int(turn.call_count),
            retries=int(turn.call_retries),
            steps=turn.steps,
            step_limit_hit=turn.step_limit_hit,
            degraded=bool((turn.composition or {}).get("degradations")),
            tool_errors=int(tool_errors_by_turn.get(turn.id, 0)),
            state_before=turn.state_before,
            state_after=turn.state_after,
            status=turn.status,
        )
        for turn in turns
    ]


def _checkpoint_reasons(session: ChatSession) -> dict[str, int]:
    """How many checkpoints of each reason the session has."""
    return dict(
        Checkpoint.objects.filter(session=session)
        .order_by()
        .values("reason")
        .annotate(n=Count("id"))
        .values_list("reason", "n")
    )


def _state_path(session: ChatSession) -> list[str]:
    """The states the session went through: those its transitions, resets and resumes entered, in order."""
    return list(
        Checkpoint.objects.filter(
            session=session,
            reason__in=[Checkpoint.Reason.TRANSITION, Checkpoint.Reason.RESET, Checkpoint.Reason.RESUME],
        )
        .order_by("seq")
        .values_list("state", flat=True)
    )


def _tokens_growth(rows: Sequence[TurnHealth]) -> float | None:
    """Prompt tokens per turn, the last third of the turns against the first (None under three turns)."""
    tokens = [r.prompt_tokens for r in rows if r.prompt_tokens]
    if len(tokens) < 3:
        return None
    third = max(1, len(tokens) // 3)
    return relative_change(current=sum(tokens[-third:]) / third, previous=sum(tokens[:third]) / third)


def session_health(*, session: ChatSession, recent_turns: int = 30) -> SessionHealth:
    """Per-turn tokens, retries and states of one session, and the death-spiral signals among them.

    Signals: prompt tokens per turn up 30 % from the first third of the recent turns to the last
    third, the latest at 85 % of the agent's context window and, at their slope, reaching it within 20 turns; a fifth of calls retried; any reset or FAILED checkpoint; the FSM re-entering states
    (two or more revisits); a step-limit hit; tool errors in a quarter of the turns.
    """
    rows = _recent_turn_health(session, recent_turns)
    call_totals = LLMCall.objects.filter(session=session).aggregate(
        calls=Count("id"), retried=Count("id", filter=Q(retries__gt=0)), retries=Coalesce(Sum("retries"), 0)
    )
    reasons = _checkpoint_reasons(session)
    path = _state_path(session)
    health = SessionHealth(
        session=session,
        turns=rows,
        tokens_growth=_tokens_growth(rows),
        tokens_slope_per_turn=least_squares_slope(
            [(float(r.seq), float(r.prompt_tokens)) for r in rows if r.prompt_tokens]
        ),
        retries=int(call_totals["retries"]),
        calls=int(call_totals["calls"]),
        resets=int(reasons.get(Checkpoint.Reason.RESET, 0)),
        failures=int(reasons.get(Checkpoint.Reason.FAILED, 0)),
        retry_checkpoints=int(reasons.get(Checkpoint.Reason.RETRY, 0)),
        invalid_transitions=int(reasons.get(Checkpoint.Reason.INVALID_TRANSITION, 0)),
        state_revisits=_state_revisits(path),
        state_path=path,
        step_limit_hits=sum(1 for r in rows if r.step_limit_hit),
        tool_errors=sum(r.tool_errors for r in rows),
        signals=[],
    )
    return replace(health, signals=_signals(health, retried=int(call_totals["retried"]), turns=len(rows)))


# Prompt tokens that grow are a spiral only when the latest prompt is already near the agent's context window
# (this share of it) and, at their present slope, they reach it within this many turns. A chat's history makes
# every prompt grow a little per turn (a normal 15-turn booking goes from 400 to 1,000 tokens, +85 %; a 19-turn
# chat reached 4,269 of 6,184) until the budget stops it and the summaries fold it; that is not a risk, and /ops/
# does not list it.
TOKENS_REACH_WINDOW_TURNS = 20
TOKENS_NEAR_WINDOW = 0.85


def _tokens_heading_for_the_window(health: SessionHealth) -> bool:
    slope = health.tokens_slope_per_turn or 0
    if health.tokens_growth is None or health.tokens_growth <= 0.3 or slope <= 0 or not health.turns:
        return False
    window = getattr(health.session.agent, "context_window", None) or 8192
    latest = health.turns[-1].prompt_tokens
    return latest >= TOKENS_NEAR_WINDOW * window and latest + slope * TOKENS_REACH_WINDOW_TURNS >= window


def _signals(health: SessionHealth, *, retried: int, turns: int) -> list[str]:
    signals = []
    if _tokens_heading_for_the_window(health):
        signals.append(
            f"prompt tokens per turn up {health.tokens_growth or 0:.0%} across recent turns, heading for the "
            "context window"
        )
    if health.calls and retried / health.calls >= 0.2:
        signals.append(f"{retried} of {health.calls} model calls needed retries ({health.retries} retries)")
    if health.resets:
        signals.append(f"{health.resets} FSM reset(s)")
    if health.failures or health.session.status == ChatSession.Status.FAILED:
        signals.append("session moved to FAILED")
    if health.state_revisits >= 2:
        signals.append(f"workflow re-entered earlier states {health.state_revisits} times")
    if health.step_limit_hits:
        signals.append(f"{health.step_limit_hits} turn(s) hit the step limit")
    if turns and health.tool_errors and health.tool_errors / turns >= 0.25:
        signals.append(f"{health.tool_errors} tool error(s) in {turns} turns")
    return signals


# Per session, in the window: resets and FAILED moves (3 points each), retried model calls (1), step-limit hits
# (2). Each log is grouped on its own (a BRIN or btree range on created_at, then only the rows in trouble); the
# sum and the top ``limit`` are taken in the database. (Joining a session's checkpoints, model calls and turns
# in one query read the product of the three: 26 GB of temporary files at a million rows each.)
_AT_RISK_SQL = """
SELECT t.session_id, sum(t.resets), sum(t.retried), sum(t.limits), sum(3 * t.resets + t.retried + 2 * t.limits) AS score
FROM (
    SELECT session_id, count(*) AS resets, 0 AS retried, 0 AS limits FROM chat_sessions_checkpoint
    WHERE reason IN (%(reset)s, %(failed)s) AND created_at >= %(start)s AND created_at < %(end)s GROUP BY session_id
    UNION ALL
    SELECT session_id, 0, count(*), 0 FROM agents_llmcall
    WHERE retries > 0 AND session_id IS NOT NULL AND created_at >= %(start)s AND created_at < %(end)s
    GROUP BY session_id
    UNION ALL
    SELECT session_id, 0, 0, count(*) FROM chat_sessions_turn
    WHERE step_limit_hit AND created_at >= %(start)s AND created_at < %(end)s GROUP BY session_id
) t, chat_sessions_chatsession s
WHERE s.id = t.session_id
GROUP BY t.session_id, s.updated_at
ORDER BY score DESC, s.updated_at DESC, t.session_id
LIMIT %(limit)s
"""


def sessions_at_risk(*, start: dt.datetime, end: dt.datetime, limit: int = 10) -> list[dict[str, Any]]:
    """Sessions with the most resets, FAILED moves, retried calls and step-limit hits in the window."""
    params: dict[str, Any] = {
        "reset": Checkpoint.Reason.RESET.value,
        "failed": Checkpoint.Reason.FAILED.value,
        "start": start,
        "end": end,
        "limit": limit,
    }
    with connection.cursor() as cursor:
        cursor.execute(_AT_RISK_SQL, params)
        rows = cursor.fetchall()
    sessions = ChatSession.objects.select_related("agent", "user").in_bulk([row[0] for row in rows])
    return [
        {
            "session": sessions[pk],
            "resets": int(resets),
            "retried_calls": int(retried),
            "step_limit_hits": int(limits),
            "score": int(score),
        }
        for pk, resets, retried, limits, score in rows
        if pk in sessions
    ]
