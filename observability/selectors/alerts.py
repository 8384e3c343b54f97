"""What the alert rules read: each rule's metric for one scope (overall or one agent), and the alerts fired."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

from core.queue import queues_stats
from observability.models import Alert, AlertRule
from observability.selectors.dashboard import summaries_pending
from observability.selectors.indicators import indicators, relative_change

# The name the selectors have always logged under.
logger = logging.getLogger(__name__)


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
