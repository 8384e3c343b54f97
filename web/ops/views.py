from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from functools import wraps
from typing import Any
from uuid import UUID

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from agents.models import Agent, EndpointCapability
from observability import selectors
from observability.charts import line_chart
from observability.metrics import metrics_access_allowed, metrics_exposition
from observability.models import AlertRule
from orchestrator.steps import decision_path
from sessions.models import ChatSession

ViewFunc = Callable[..., HttpResponse]


# What the dashboard shows (sessions, their owners and titles, turns and their figures) is what these let staff
# read in the admin: being staff alone is not enough.
OPS_PERMISSIONS = ("chat_sessions.view_chatsession", "chat_sessions.view_turn")


def staff_required(view: ViewFunc) -> ViewFunc:
    """Anonymous visitors go to the login page; signed-in users who are not staff, or staff without the view
    permissions on sessions and turns, get 403 (they are who they say)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff or not request.user.has_perms(OPS_PERMISSIONS):
            raise PermissionDenied("Staff with the view permissions on sessions and turns only")
        return view(request, *args, **kwargs)

    return wrapper


def _thresholds() -> dict[str, float]:
    # The lowest enabled threshold per metric, drawn as a dashed line on the matching chart.
    found: dict[str, float] = {}
    for rule in AlertRule.objects.filter(enabled=True):
        found[rule.metric] = min(rule.threshold, found.get(rule.metric, rule.threshold))
    return found


@require_GET
@staff_required
def dashboard(request: HttpRequest) -> HttpResponse:
    windows = selectors.window_choices()
    window_key = request.GET.get("window", "6h")
    if window_key not in windows:
        window_key = "6h"
    window, bucket = windows[window_key]
    agents = list(Agent.objects.order_by("name"))
    agent: Agent | None = None
    if request.GET.get("agent"):
        agent = next((a for a in agents if a.slug == request.GET["agent"]), None)
    agent_id = agent.id if agent else None
    now = timezone.now()
    # Align buckets to whole bucket lengths so that the chart does not shift with every reload.
    end = dt.datetime.fromtimestamp((now.timestamp() // bucket.total_seconds() + 1) * bucket.total_seconds(), tz=dt.UTC)
    start = end - window
    series = selectors.indicator_series(start=start, end=end, bucket=bucket, agent_id=agent_id)
    current = selectors.indicators(start=start, end=end, agent_id=agent_id)
    thresholds = _thresholds()

    def chart(title: str, attribute: str, unit: str = "", metric: str | None = None) -> Any:
        return line_chart(
            title=title,
            points=[(p.start, getattr(p.figures, attribute)) for p in series],
            unit=unit,
            threshold=thresholds.get(metric) if metric else None,
        )

    charts = [
        chart("Retry rate", "retry_rate", "%", AlertRule.Metric.RETRY_RATE),
        chart("Retries per call", "retries_per_call", "", AlertRule.Metric.RETRIES_PER_CALL),
        chart("Prompt tokens per call (mean)", "prompt_tokens_mean", "tok"),
        chart("Prompt tokens per call (p95)", "prompt_tokens_p95", "tok"),
        chart("Time to first token p50", "ttft_p50_ms", "ms"),
        chart("Time to first token p95", "ttft_p95_ms", "ms", AlertRule.Metric.TTFT_P95),
        chart("FSM resets", "resets", ""),
        chart("Sessions FAILED", "failures", ""),
        chart("Step-limit hits", "step_limit_hits", ""),
        chart("Tool error rate", "tool_error_rate", "%", AlertRule.Metric.TOOL_ERROR_RATE),
        chart("Context degradations", "degradations", ""),
        chart("Model calls", "calls", ""),
    ]
    trends = {
        "tokens": selectors.figure_trend(
            attribute="prompt_tokens_mean", now=now, window=dt.timedelta(hours=1), agent_id=agent_id
        ),
        "ttft": selectors.figure_trend(
            attribute="ttft_p95_ms", now=now, window=dt.timedelta(hours=1), agent_id=agent_id
        ),
    }
    context = {
        "window_key": window_key,
        "windows": list(windows),
        "agents": agents,
        "agent": agent,
        "start": start,
        "end": end,
        "current": current,
        "charts": charts,
        "trends": trends,
        "tokens_slope": selectors.series_trend(series, "prompt_tokens_mean"),
        "summaries_pending": selectors.summaries_pending(agent_id=agent_id),
        "open_alerts": selectors.alerts_open(),
        "recent_alerts": selectors.alerts_recent(limit=15),
        "at_risk": selectors.sessions_at_risk(start=start, end=end),
        # What each model endpoint takes for structured outputs, as learned (llm.capabilities).
        "endpoints": list(EndpointCapability.objects.all()[:50]),
        "decisions": _decisions(agents, selectors.model_calls_per_turn(start=start, end=end)),
    }
    return render(request, "observability/dashboard.html", context)


DECISION_PATHS = {
    "in_reply": "inside the reply's call (tools and hand-off as functions): one call when no tool is needed",
    "route_call": "a routing call, then the reply: two calls (the endpoint takes no tools, or it is switched off)",
    "workflow_in_reply": "the workflow's decision first in the reply's own call, the reply streamed after it: one call "
    "when the decision stands (a second only to explain a refused one or report an action)",
    "workflow_call": "the workflow's structured decision, then the reply: two calls (the endpoint cannot stream "
    "structured output, the agent's reply may call a tool, or it is switched off)",
    "none": "the reply alone (the hand-off offered in it)",
}


def _decisions(agents: list[Agent], figures: dict[int, dict[str, float]]) -> list[dict[str, Any]]:
    """How each agent's turn decides now, and the model calls its turns made in the window."""
    rows = []
    for agent in agents:
        try:
            path = decision_path(agent)
        except Exception:  # noqa: BLE001 - an agent whose endpoint or workflow is gone: said, not a broken page
            path = "unavailable"
        rows.append({"agent": agent, "path": path, "text": DECISION_PATHS.get(path, path), **figures.get(agent.id, {})})
    return rows


@require_GET
@staff_required
def session_health(request: HttpRequest, session_id: UUID) -> HttpResponse:
    session = get_object_or_404(ChatSession.objects.select_related("agent", "user"), pk=session_id)
    health = selectors.session_health(session=session)
    tokens_chart = line_chart(
        title="Prompt tokens per turn",
        points=[(t.created_at, float(t.prompt_tokens)) for t in health.turns],
        unit="tok",
    )
    retries_chart = line_chart(
        title="Retries per turn", points=[(t.created_at, float(t.retries)) for t in health.turns]
    )
    return render(
        request,
        "observability/session_health.html",
        {"session": session, "health": health, "charts": [tokens_chart, retries_chart]},
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint; see ``metrics_access_allowed`` for who may read it."""
    if not metrics_access_allowed(request):
        response = HttpResponse("metrics: bearer token required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(metrics_exposition(), content_type="text/plain; version=0.0.4; charset=utf-8")
