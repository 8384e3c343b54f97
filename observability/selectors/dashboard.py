"""The /ops/ dashboard's other reads: its windows, the agents active in one, the summaries still pending, and
the model calls each agent's turns made."""

from __future__ import annotations

import datetime as dt

from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce

from agents.models import Agent, LLMCall
from sessions.models import Turn
from sessions.selectors import summaries_waiting


def summaries_pending(*, agent_id: int | None = None) -> int:
    """Sessions whose requested summary has not been written yet (a growing number: the worker is behind)."""
    sessions = summaries_waiting()
    if agent_id is not None:
        sessions = sessions.filter(agent_id=agent_id)
    return sessions.count()


def agents_active(*, start: dt.datetime, end: dt.datetime) -> list[Agent]:
    """Agents with at least one model call or turn in the window."""
    called = LLMCall.objects.filter(created_at__gte=start, created_at__lt=end, agent__isnull=False).values("agent_id")
    turned = Turn.objects.filter(created_at__gte=start, created_at__lt=end).values("session__agent_id")
    return list(Agent.objects.filter(Q(id__in=called) | Q(id__in=turned)).order_by("name"))


def window_choices() -> dict[str, tuple[dt.timedelta, dt.timedelta]]:
    """Dashboard windows and their bucket sizes."""
    return {
        "1h": (dt.timedelta(hours=1), dt.timedelta(minutes=5)),
        "6h": (dt.timedelta(hours=6), dt.timedelta(minutes=15)),
        "24h": (dt.timedelta(hours=24), dt.timedelta(hours=1)),
        "7d": (dt.timedelta(days=7), dt.timedelta(hours=6)),
    }


def model_calls_per_turn(*, start: dt.datetime, end: dt.datetime) -> dict[int, dict[str, float]]:
    """Per agent, in the window: the turns, the model calls made for them (every purpose, the background's
    memory writes included) and the calls per turn, and those of the turn itself (routing, decisions, replies)."""
    turns = dict(
        Turn.objects.filter(created_at__gte=start, created_at__lt=end)
        .values_list("session__agent_id")
        .annotate(n=Count("id"))
        .values_list("session__agent_id", "n")
    )
    in_turn = ("route", "slots", "reply")
    rows = (
        LLMCall.objects.filter(created_at__gte=start, created_at__lt=end, turn__isnull=False)
        .values("agent_id")
        .annotate(calls=Count("id"), turn_calls=Count("id", filter=Q(purpose__in=in_turn)))
    )
    found: dict[int, dict[str, float]] = {}
    for row in rows:
        count = turns.get(row["agent_id"], 0)
        if row["agent_id"] is None or not count:
            continue
        found[row["agent_id"]] = {
            "turns": count,
            "calls_per_turn": round(row["calls"] / count, 2),
            "turn_calls_per_turn": round(row["turn_calls"] / count, 2),
        }
    return found


def calls_by_purpose(*, start: dt.datetime, end: dt.datetime) -> list[dict[str, object]]:
    """Per agent and purpose (reply, slots, route, summarize, ...), the model calls in the window and their prompt
    and completion tokens: what turns cost, by what they were for. Rows: ``slug`` ("none" without an agent),
    ``purpose``, ``calls``, ``prompt_tokens``, ``completion_tokens``."""
    rows = (
        LLMCall.objects.filter(created_at__gte=start, created_at__lt=end)
        .values("agent__slug", "purpose")
        .annotate(
            calls=Count("id"),
            prompt_tokens=Coalesce(Sum("prompt_tokens"), 0),
            completion_tokens=Coalesce(Sum("completion_tokens"), 0),
        )
        .order_by("agent__slug", "purpose")
    )
    return [
        {
            "slug": row["agent__slug"] or "none",
            "purpose": row["purpose"],
            "calls": row["calls"],
            "prompt_tokens": row["prompt_tokens"],
            "completion_tokens": row["completion_tokens"],
        }
        for row in rows
    ]
