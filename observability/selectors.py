"""The death-spiral indicators, read from the records every call, checkpoint and turn leaves.

Sources: ``agents.LLMCall`` (retries, prompt tokens, time to first token), ``agents.ToolInvocation``
(tool errors), ``chat_sessions.Checkpoint`` (resets, FAILED), ``chat_sessions.Turn`` (step-limit hits,
context degradations) and ``chat_sessions.ChatSession`` (summaries pending). Every figure is
available overall or for one agent (``agent_id``), for a window or as a time series.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import connection, transaction
from django.db.models import Aggregate, Avg, Count, DateTimeField, DurationField, F, FloatField, Func, Q, Sum, Value
from django.db.models.functions import Coalesce

from agents.models import Agent, LLMCall, ToolInvocation
from core.queue import queues_stats
from observability.models import Alert, AlertRule, MetricTotals
from sessions.models import ChatSession, Checkpoint, Turn

logger = logging.getLogger(__name__)


class Percentile(Aggregate):
    """PostgreSQL ``percentile_cont(p) WITHIN GROUP (ORDER BY expr)``; NULLs are ignored."""

    function = "percentile_cont"
    name = "Percentile"
    template = "%(function)s(%(percentile)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, *, percentile: float, **extra: Any) -> None:
        # Note: the percentile is our own float, interpolated into SQL; never pass user input here.
        super().__init__(expression, percentile=float(percentile), **extra)


# A turn whose prompt had to be degraded (sections cut, turns or memories dropped) to fit the budget.
DEGRADED = (
    Q(composition__has_key="degradations") & ~Q(composition__degradations=[]) & ~Q(composition__degradations=None)
)


@dataclass(frozen=True)
class Figures:
    """The indicators over one window (or one time bucket)."""

    calls: int = 0
    calls_retried: int = 0
    retries: int = 0
    prompt_tokens_mean: float | None = None
    prompt_tokens_p95: float | None = None
    ttft_samples: int = 0
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    turns: int = 0
    step_limit_hits: int = 0
    degradations: int = 0
    resets: int = 0
    failures: int = 0
    tool_runs: int = 0
    tool_errors: int = 0

    @property
    def retry_rate(self) -> float | None:
        """Share of calls that needed at least one retry."""
        return self.calls_retried / self.calls if self.calls else None

    @property
    def retries_per_call(self) -> float | None:
        return self.retries / self.calls if self.calls else None

    @property
    def tool_error_rate(self) -> float | None:
        return self.tool_errors / self.tool_runs if self.tool_runs else None


@dataclass(frozen=True)
class SeriesPoint:
    start: dt.datetime
    figures: Figures


def _call_aggregates() -> dict[str, Any]:
    return {
        "calls": Count("id"),
        "calls_retried": Count("id", filter=Q(retries__gt=0)),
        "retries": Coalesce(Sum("retries"), 0),
        "prompt_tokens_mean": Avg("prompt_tokens"),
        "prompt_tokens_p95": Percentile("prompt_tokens", percentile=0.95),
        "ttft_samples": Count("ttft_ms"),
        "ttft_p50_ms": Percentile("ttft_ms", percentile=0.5),
        "ttft_p95_ms": Percentile("ttft_ms", percentile=0.95),
    }


def _turn_aggregates() -> dict[str, Any]:
    return {
        "turns": Count("id"),
        "step_limit_hits": Count("id", filter=Q(step_limit_hit=True)),
        "degradations": Count("id", filter=DEGRADED),
    }


def _checkpoint_aggregates() -> dict[str, Any]:
    return {
        "resets": Count("id", filter=Q(reason=Checkpoint.Reason.RESET)),
        "failures": Count("id", filter=Q(reason=Checkpoint.Reason.FAILED)),
    }


def _tool_aggregates() -> dict[str, Any]:
    return {"tool_runs": Count("id"), "tool_errors": Count("id", filter=Q(ok=False))}


def _sources(*, start: dt.datetime, end: dt.datetime, agent_id: int | None) -> list[tuple[Any, dict[str, Any]]]:
    # Each source model with its aggregates, filtered to the window and (optionally) one agent.
    calls = LLMCall.objects.filter(created_at__gte=start, created_at__lt=end)
    turns = Turn.objects.filter(created_at__gte=start, created_at__lt=end)
    checkpoints = Checkpoint.objects.filter(
        created_at__gte=start, created_at__lt=end, reason__in=[Checkpoint.Reason.RESET, Checkpoint.Reason.FAILED]
    )
    tools = ToolInvocation.objects.filter(created_at__gte=start, created_at__lt=end)
    if agent_id is not None:
        calls = calls.filter(agent_id=agent_id)
        turns = turns.filter(session__agent_id=agent_id)
        checkpoints = checkpoints.filter(session__agent_id=agent_id)
        tools = tools.filter(session__agent_id=agent_id)
    return [
        (calls, _call_aggregates()),
        (turns, _turn_aggregates()),
        (checkpoints, _checkpoint_aggregates()),
        (tools, _tool_aggregates()),
    ]


def indicators(*, start: dt.datetime, end: dt.datetime, agent_id: int | None = None) -> Figures:
    """All indicators over ``[start, end)``, overall or for one agent."""
    values: dict[str, Any] = {}
    for queryset, aggregates in _sources(start=start, end=end, agent_id=agent_id):
        values.update(queryset.aggregate(**aggregates))
    return Figures(**{k: v for k, v in values.items() if v is not None})


def indicator_series(
    *, start: dt.datetime, end: dt.datetime, bucket: dt.timedelta, agent_id: int | None = None
) -> list[SeriesPoint]:
    """The indicators per time bucket from ``start`` to ``end``; empty buckets are included (zero counts)."""
    binned = Func(
        Value(bucket, output_field=DurationField()),
        F("created_at"),
        Value(start, output_field=DateTimeField()),
        function="date_bin",
        output_field=DateTimeField(),
    )
    by_bucket: dict[dt.datetime, dict[str, Any]] = {}
    for queryset, aggregates in _sources(start=start, end=end, agent_id=agent_id):
        rows = queryset.order_by().annotate(bucket=binned).values("bucket").annotate(**aggregates)
        for row in rows:
            by_bucket.setdefault(row.pop("bucket"), {}).update({k: v for k, v in row.items() if v is not None})
    points = []
    moment = start
    while moment < end:
        points.append(SeriesPoint(start=moment, figures=Figures(**by_bucket.get(moment, {}))))
        moment += bucket
    return points


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Slope of the least-squares line through ``(x, y)`` points; ``None`` with fewer than two distinct x."""
    n = len(points)
    if n < 2:
        return None
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_x = sum((x - mean_x) ** 2 for x, _ in points)
    if var_x == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var_x


def relative_change(*, current: float | None, previous: float | None) -> float | None:
    """``current / previous - 1`` (0.3 = up 30 %); ``None`` when either is missing or ``previous`` is 0."""
    if current is None or previous is None or previous == 0:
        return None
    return current / previous - 1


@dataclass(frozen=True)
class Trend:
    """Where a figure is heading: last window against the one before, and the slope over the buckets."""

    current: float | None
    previous: float | None
    change: float | None
    slope_per_hour: float | None

    @property
    def rising(self) -> bool:
        return (self.change or 0) > 0 and (self.slope_per_hour or 0) > 0


def series_trend(points: Sequence[SeriesPoint], attribute: str) -> float | None:
    """Least-squares slope per hour of one figure over the buckets that have a value."""
    if not points:
        return None
    origin = points[0].start
    xy = [
        ((p.start - origin).total_seconds() / 3600, float(v))
        for p in points
        if (v := getattr(p.figures, attribute)) is not None
    ]
    return least_squares_slope(xy)


def figure_trend(
    *, attribute: str, now: dt.datetime, window: dt.timedelta, agent_id: int | None = None, buckets: int = 12
) -> Trend:
    """One figure (e.g. ``prompt_tokens_mean``, ``ttft_p95_ms``) now against the window before, and its slope."""
    current = getattr(indicators(start=now - window, end=now, agent_id=agent_id), attribute)
    previous = getattr(indicators(start=now - 2 * window, end=now - window, agent_id=agent_id), attribute)
    series = indicator_series(start=now - 2 * window, end=now, bucket=2 * window / buckets, agent_id=agent_id)
    return Trend(
        current=current,
        previous=previous,
        change=relative_change(current=current, previous=previous),
        slope_per_hour=series_trend(series, attribute),
    )


def summaries_pending(*, agent_id: int | None = None) -> int:
    """Sessions whose requested summary has not been written yet (a growing number: the worker is behind)."""
    sessions = ChatSession.objects.filter(summary_requested_seq__gt=F("summary_through_seq"))
    if agent_id is not None:
        sessions = sessions.filter(agent_id=agent_id)
    return sessions.count()


def agents_active(*, start: dt.datetime, end: dt.datetime) -> list[Agent]:
    """Agents with at least one model call or turn in the window."""
    called = LLMCall.objects.filter(created_at__gte=start, created_at__lt=end, agent__isnull=False).values("agent_id")
    turned = Turn.objects.filter(created_at__gte=start, created_at__lt=end).values("session__agent_id")
    return list(Agent.objects.filter(Q(id__in=called) | Q(id__in=turned)).order_by("name"))


# --- Alert rule metrics --------------------------------------------------------------------


@dataclass(frozen=True)
class MetricReading:
    """A rule's metric for one scope; ``value`` is ``None`` when the window holds too few samples."""

    value: float | None
    samples: int
    details: dict[str, Any] = field(default_factory=dict)


def queue_wait_reading() -> MetricReading:
    """How long the oldest task waiting in the default or the operations queue has waited (seconds), on a
    Redis-protocol broker; no value on another transport or when the broker does not answer (``/healthz``
    says that)."""
    try:
        known = queues_stats(timeout=1.0)
    except Exception:
        logger.warning("alerts: the broker's queues could not be read", exc_info=True)
        return MetricReading(value=None, samples=0)
    if not known:
        return MetricReading(value=None, samples=0)
    waits = [stats.oldest_seconds or 0.0 for stats in known]
    details = {stats.queue: {"depth": stats.depth, "oldest_seconds": stats.oldest_seconds} for stats in known}
    return MetricReading(value=max(waits), samples=sum(s.depth for s in known), details=details)


def alert_metric_reading(
    *, rule: AlertRule, now: dt.datetime, agent_id: int | None = None, min_samples: int | None = None
) -> MetricReading:
    """The value of ``rule.metric`` over the rule's window ending at ``now``, overall or for one agent."""
    window = dt.timedelta(minutes=rule.window_minutes)
    needed = max(1, rule.min_samples if min_samples is None else min_samples)
    metric = AlertRule.Metric(rule.metric)
    if metric is AlertRule.Metric.SUMMARIES_PENDING:
        pending = summaries_pending(agent_id=agent_id)
        return MetricReading(value=float(pending), samples=pending)
    if metric is AlertRule.Metric.QUEUE_WAIT:
        return queue_wait_reading() if agent_id is None else MetricReading(value=None, samples=0)
    figures = indicators(start=now - window, end=now, agent_id=agent_id)
    window_details = {"window_start": (now - window).isoformat(), "window_end": now.isoformat()}
    if metric is AlertRule.Metric.TOKENS_GROWTH:
        before = indicators(start=now - 2 * window, end=now - window, agent_id=agent_id)
        samples = min(figures.calls, before.calls)
        details = {
            **window_details,
            "tokens_per_call": figures.prompt_tokens_mean,
            "tokens_per_call_before": before.prompt_tokens_mean,
            "calls": figures.calls,
            "calls_before": before.calls,
        }
        value = relative_change(current=figures.prompt_tokens_mean, previous=before.prompt_tokens_mean)
        return MetricReading(value=value if samples >= needed else None, samples=samples, details=details)
    rates: dict[AlertRule.Metric, tuple[float | None, int, dict[str, Any]]] = {
        AlertRule.Metric.RETRY_RATE: (
            figures.retry_rate,
            figures.calls,
            {"calls": figures.calls, "calls_retried": figures.calls_retried, "retries": figures.retries},
        ),
        AlertRule.Metric.RETRIES_PER_CALL: (
            figures.retries_per_call,
            figures.calls,
            {"calls": figures.calls, "retries": figures.retries},
        ),
        AlertRule.Metric.TTFT_P95: (
            figures.ttft_p95_ms,
            figures.ttft_samples,
            {"ttft_p50_ms": figures.ttft_p50_ms, "ttft_samples": figures.ttft_samples},
        ),
        AlertRule.Metric.TOOL_ERROR_RATE: (
            figures.tool_error_rate,
            figures.tool_runs,
            {"tool_runs": figures.tool_runs, "tool_errors": figures.tool_errors},
        ),
    }
    if metric in rates:
        value, samples, details = rates[metric]
        return MetricReading(
            value=value if samples >= needed else None, samples=samples, details={**window_details, **details}
        )
    counts = {
        AlertRule.Metric.FSM_RESETS: figures.resets,
        AlertRule.Metric.FAILED_SESSIONS: figures.failures,
        AlertRule.Metric.STEP_LIMIT_HITS: figures.step_limit_hits,
        AlertRule.Metric.DEGRADATIONS: figures.degradations,
    }
    count = counts[metric]
    return MetricReading(value=float(count), samples=count, details=window_details)


def alerts_open() -> list[Alert]:
    """Open alerts, newest first."""
    return list(Alert.objects.filter(resolved_at__isnull=True).select_related("rule", "agent").order_by("-fired_at"))


def alerts_recent(*, limit: int = 20) -> list[Alert]:
    """The latest alerts, open or resolved."""
    return list(Alert.objects.select_related("rule", "agent").order_by("-fired_at")[:limit])


# --- One session's health ------------------------------------------------------------------


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
    third and, at their slope, reaching the agent's context window within 20 turns; a fifth of calls retried; any reset or FAILED checkpoint; the FSM re-entering states
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


# Prompt tokens that grow are a spiral only when, at their present slope, they reach the agent's context window
# within this many turns. A chat's history makes every prompt grow a little per turn (a normal 15-turn booking goes
# from 400 to 1,000 tokens, +85 %) until the summaries fold it; that is not a risk, and /ops/ does not list it.
TOKENS_REACH_WINDOW_TURNS = 20


def _tokens_heading_for_the_window(health: SessionHealth) -> bool:
    slope = health.tokens_slope_per_turn or 0
    if health.tokens_growth is None or health.tokens_growth <= 0.3 or slope <= 0 or not health.turns:
        return False
    window = getattr(health.session.agent, "context_window", None) or 8192
    latest = health.turns[-1].prompt_tokens
    return latest + slope * TOKENS_REACH_WINDOW_TURNS >= window


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


# --- the Prometheus totals ---------------------------------------------------------------------------
# All-time counters and histogram buckets per agent. Rows older than METRICS_SEAL_AFTER no longer change
# (a turn is finished within minutes, the logs are append-only), so their totals are summed once and kept in
# a row of MetricTotals with the hour they reach up to (the seal, on the database's clock); a scrape adds only
# the rows after the seal, an index range of an hour or two. Summing every row on every scrape took 0.5 s at a
# million rows a table, every 15 s per Prometheus server. Deleted rows are made up for by an offset, so a
# counter never goes down (_never_lower); only deleting the kept row (a recount) can lower one. A turn
# finished more than an hour after it started (resumed late by the sweep) is counted without its step-limit
# and degradation marks.
METRICS_SEAL_AFTER = dt.timedelta(hours=1)
_SEALED_KEY = "v1"

# name -> (LLMCall field, upper bounds of the buckets, scale of the field per bound unit)
HistogramSpec = tuple[str, tuple[float, ...], float]


def _add(totals: dict[Any, dict[str, Any]], key: Any, values: dict[str, Any]) -> None:
    """Add ``values`` (numbers, or lists of bucket counts) to ``totals[key]``, in place."""
    bucket = totals.setdefault(key, {})
    for name, value in values.items():
        if isinstance(value, list):
            previous = bucket.get(name) or [0] * len(value)
            bucket[name] = [a + b for a, b in zip(previous, value, strict=True)]
        else:
            bucket[name] = bucket.get(name, 0) + (value or 0)


def _merge(into: dict[Any, dict[str, Any]], more: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """A new sum of two sets of totals (neither is changed)."""
    out = {key: dict(values) for key, values in into.items()}
    for key, values in more.items():
        _add(out, key, values)
    return out


def _totals_between(
    *, since: dt.datetime | None, before: dt.datetime | None, histograms: dict[str, HistogramSpec]
) -> dict[int | None, dict[str, Any]]:
    """Counters and histogram buckets per agent id over the rows with ``since <= created_at < before``."""
    window: dict[str, dt.datetime] = {}
    if since is not None:
        window["created_at__gte"] = since
    if before is not None:
        window["created_at__lt"] = before
    totals: dict[int | None, dict[str, Any]] = {}

    buckets = {
        f"{name}__le_{i}": Count("id", filter=Q(**{f"{field}__lte": bound * scale}))
        for name, (field, bounds, scale) in histograms.items()
        for i, bound in enumerate(bounds)
    }
    for row in (
        LLMCall.objects.filter(**window)
        .order_by()
        .values("agent_id")
        .annotate(
            calls=Count("id"),
            calls_retried=Count("id", filter=Q(retries__gt=0)),
            retries=Coalesce(Sum("retries"), 0),
            # Not named after the field: the buckets' filters read the field.
            prompt_tokens_sum=Coalesce(Sum("prompt_tokens"), 0),
            ttft_count=Count("ttft_ms"),
            ttft_sum_ms=Coalesce(Sum("ttft_ms"), 0.0),
            **buckets,
        )
    ):
        agent_id = row.pop("agent_id")
        row["prompt_tokens"] = row.pop("prompt_tokens_sum")
        for name, (_, bounds, _) in histograms.items():
            row[name] = [int(row.pop(f"{name}__le_{i}")) for i in range(len(bounds))]
        _add(totals, agent_id, row)
    for model, aggregates in (
        (Turn, _turn_aggregates()),
        (Checkpoint, _checkpoint_aggregates()),
        (ToolInvocation, _tool_aggregates()),
    ):
        for row in model.objects.filter(**window).order_by().values("session__agent_id").annotate(**aggregates):
            _add(totals, row.pop("session__agent_id"), row)
    return totals


def _metrics_state_key(histograms: dict[str, HistogramSpec]) -> str:
    # One kept state per set of histograms (a digest, short).
    return f"{_SEALED_KEY}:{hashlib.sha256(repr(sorted(histograms.items())).encode()).hexdigest()[:16]}"


def _by_agent_from_json(pairs: Any) -> dict[int | None, dict[str, Any]]:
    return {agent: dict(values) for agent, values in pairs} if isinstance(pairs, list) else {}


def _by_agent_to_json(by_agent: dict[int | None, dict[str, Any]]) -> list[list[Any]]:
    # JSON objects have string keys only: agent ids (and None) travel as pairs.
    return [[agent, values] for agent, values in by_agent.items()]


def _kept_state(key: str) -> dict[str, Any]:
    """The kept state (seal, sealed totals, offsets, last exposed values), or nothing to start from."""
    row = MetricTotals.objects.filter(key=key).first()
    if row is None or not isinstance(row.state, dict):
        return {}
    return {
        "seal": row.sealed_before,
        "sealed": _by_agent_from_json(row.state.get("sealed")),
        "offset": _by_agent_from_json(row.state.get("offset")),
        "floor": _by_agent_from_json(row.state.get("floor")),
    }


def _sealed_totals(
    state: dict[str, Any], seal: dt.datetime, histograms: dict[str, HistogramSpec]
) -> dict[int | None, dict[str, Any]]:
    """The totals of the rows before ``seal``: the kept ones, topped up by the rows since their seal, or summed
    in full when none are kept (or they are past ``seal``: the database's clock went back)."""
    kept_seal, kept = state.get("seal"), state.get("sealed")
    if kept is not None and kept_seal == seal:
        return dict(kept)
    if kept is not None and kept_seal is not None and kept_seal < seal:
        return _merge(kept, _totals_between(since=kept_seal, before=seal, histograms=histograms))
    return _totals_between(since=None, before=seal, histograms=histograms)


def _never_lower(
    current: dict[int | None, dict[str, Any]], state: dict[str, Any]
) -> tuple[dict[int | None, dict[str, Any]], dict[int | None, dict[str, Any]]]:
    """Counters as exposed: the current totals plus an offset that grows by whatever they fell below the last
    exposed values (deleted rows). Prometheus reads any drop as a restart from zero, and its ``rate()`` then
    counts the whole value again: one deleted chat was a spike of a million turns on the graphs."""
    offsets, floor = state.get("offset", {}), state.get("floor", {})
    exposed: dict[int | None, dict[str, Any]] = {}
    new_offsets: dict[int | None, dict[str, Any]] = {}
    for agent, values in current.items():
        shown: dict[str, Any] = {}
        kept: dict[str, Any] = {}
        # A figure whose rows are all gone (every tool run deleted) is still shown, at its floor.
        missing = {name: [0] * len(low) if isinstance(low, list) else 0 for name, low in floor.get(agent, {}).items()}
        for name, value in {**missing, **values}.items():
            low = floor.get(agent, {}).get(name)
            offset: Any = offsets.get(agent, {}).get(name)
            total: Any
            if isinstance(value, list):
                offset = offset if isinstance(offset, list) and len(offset) == len(value) else [0] * len(value)
                total = [v + o for v, o in zip(value, offset, strict=True)]
                if isinstance(low, list) and len(low) == len(total):
                    gap = [max(0, lo - t) for lo, t in zip(low, total, strict=True)]
                    offset = [o + g for o, g in zip(offset, gap, strict=True)]
                    total = [t + g for t, g in zip(total, gap, strict=True)]
            else:
                offset = offset if isinstance(offset, (int, float)) else 0
                total = value + offset
                if isinstance(low, (int, float)) and total < low:
                    offset, total = offset + (low - total), low
            shown[name], kept[name] = total, offset
        exposed[agent], new_offsets[agent] = shown, kept
    return exposed, new_offsets


# One scrape at a time reads and writes the kept state (two at once would both add the same offset, or both
# create its row).
_METRICS_LOCK = 0x6D65747269637331  # "metrics1"


def metric_totals_by_agent(
    *, histograms: dict[str, HistogramSpec] | None = None, now: dt.datetime | None = None
) -> dict[str, dict[str, Any]]:
    """All-time counters per agent slug ("none" for rows without an agent), for the /metrics exporter, with
    each histogram of ``histograms`` as a list of cumulative bucket counts under its name, and the sessions
    waiting for a summary (a gauge, read live). The counters never go down (``_never_lower``)."""
    histograms = histograms or {}
    if now is None:
        # The database's clock, shared by every process: a process whose own clock ran ahead would store a
        # seal in the future, and the rows before it would be counted by no one.
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            now = cursor.fetchone()[0]
    seal = (now - METRICS_SEAL_AFTER).replace(minute=0, second=0, microsecond=0)
    key = _metrics_state_key(histograms)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_METRICS_LOCK])
        state = _kept_state(key)
        sealed = _sealed_totals(state, seal, histograms)
        current = _merge(sealed, _totals_between(since=seal, before=None, histograms=histograms))
        slugs = dict(Agent.objects.values_list("id", "slug"))
        # An agent whose rows are all deleted keeps its figures; a deleted agent's calls now count under "none".
        for agent in state.get("floor", {}):
            if agent is None or agent in slugs:
                current.setdefault(agent, {})
        by_agent, offsets = _never_lower(current, state)
        MetricTotals.objects.update_or_create(
            key=key,
            defaults={
                "sealed_before": seal,
                "state": {
                    "sealed": _by_agent_to_json(sealed),
                    "offset": _by_agent_to_json(offsets),
                    "floor": _by_agent_to_json(by_agent),
                },
            },
        )
    pending = (
        ChatSession.objects.filter(summary_requested_seq__gt=F("summary_through_seq"))
        .order_by()
        .values("agent_id")
        .annotate(summaries_pending=Count("id"))
    )
    by_slug: dict[str, dict[str, Any]] = {}
    for agent_id, values in by_agent.items():
        _add(by_slug, slugs.get(agent_id, "none") if agent_id is not None else "none", values)
    for row in pending:
        agent_id = row["agent_id"]
        _add(by_slug, slugs.get(agent_id, "none"), {"summaries_pending": row["summaries_pending"]})
    return by_slug


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
