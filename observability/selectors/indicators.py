"""The death-spiral indicators over a window or per time bucket, and where a figure is heading (its trend).

Sources: ``agents.LLMCall`` (retries, prompt tokens, time to first token), ``agents.ToolInvocation``
(tool errors), ``chat_sessions.Checkpoint`` (resets, FAILED) and ``chat_sessions.Turn`` (step-limit hits,
context degradations). Every figure is available overall or for one agent (``agent_id``), for a window or
as a time series.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Aggregate, Avg, Count, DateTimeField, DurationField, F, FloatField, Func, Q, Sum, Value
from django.db.models.functions import Coalesce

from agents.models import LLMCall, ToolInvocation
from sessions.models import Checkpoint, Turn


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


def call_aggregates() -> dict[str, Any]:
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


def turn_aggregates() -> dict[str, Any]:
    return {
        "turns": Count("id"),
        "step_limit_hits": Count("id", filter=Q(step_limit_hit=True)),
        "degradations": Count("id", filter=DEGRADED),
    }


def checkpoint_aggregates() -> dict[str, Any]:
    return {
        "resets": Count("id", filter=Q(reason=Checkpoint.Reason.RESET)),
        "failures": Count("id", filter=Q(reason=Checkpoint.Reason.FAILED)),
    }


def tool_aggregates() -> dict[str, Any]:
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
        (calls, call_aggregates()),
        (turns, turn_aggregates()),
        (checkpoints, checkpoint_aggregates()),
        (tools, tool_aggregates()),
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
