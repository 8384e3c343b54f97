"""Cross-app read models for the API that belong to no single domain app."""

from __future__ import annotations

from typing import Any

from django.db.models import Avg, Count, Q, Sum

from agents.models import LLMCall, ToolInvocation
from memory.models import Memory
from sessions.models import ChatSession, Turn


def usage_summary_for_user(*, user: Any) -> dict[str, Any]:
    """A small summary of one user's own sessions: turns, model calls and tokens, tools, memories.

    Operators have the full death-spiral dashboard (/ops/); this is what one user may know about
    their own use, so every figure is filtered by ``user``.
    """
    sessions = ChatSession.objects.filter(user=user)
    by_status = dict(sessions.values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
    turns = Turn.objects.filter(session__user=user).aggregate(
        total=Count("pk"),
        failed=Count("pk", filter=Q(status=Turn.Status.FAILED)),
        demo=Count("pk", filter=Q(is_demo=True)),
        step_limit_hits=Count("pk", filter=Q(step_limit_hit=True)),
    )
    calls = LLMCall.objects.filter(session__user=user).aggregate(
        total=Count("pk"),
        with_retries=Count("pk", filter=Q(retries__gt=0)),
        failed=Count("pk", filter=~Q(outcome="ok")),
        total_prompt_tokens=Sum("prompt_tokens"),
        total_completion_tokens=Sum("completion_tokens"),
        mean_prompt_tokens=Avg("prompt_tokens"),
        mean_latency_ms=Avg("latency_ms"),
        mean_ttft_ms=Avg("ttft_ms"),
    )
    tools = ToolInvocation.objects.filter(session__user=user).aggregate(
        total=Count("pk"), errors=Count("pk", filter=Q(ok=False))
    )
    memories = dict(
        Memory.objects.filter(user=user, archived=False)
        .values_list("kind")
        .annotate(n=Count("pk"))
        .values_list("kind", "n")
    )
    return {
        "sessions": {"total": sum(by_status.values()), "by_status": by_status},
        "turns": turns,
        "llm_calls": {
            key: (round(value, 1) if isinstance(value, float) else (value or 0)) for key, value in calls.items()
        },
        "tools": tools,
        "memories": {"total": sum(memories.values()), "by_kind": memories},
    }


def memory_panel_lists(candidates: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The memory panel's lists: each memory once (one found by two tiers, or an episode and a fact of the
    same words, was listed twice), and none both used and "considered, not used"."""
    kept: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    seen: set[Any] = set()
    for wanted in (True, False):
        for candidate in candidates:
            if bool(candidate.get("kept")) != wanted:
                continue
            keys = {("id", candidate.get("id")), ("text", " ".join(str(candidate.get("preview", "")).lower().split()))}
            if keys & seen:
                continue
            seen |= keys
            (kept if wanted else dropped).append(candidate)
    return {"retrieval_kept": kept, "retrieval_dropped": dropped}
