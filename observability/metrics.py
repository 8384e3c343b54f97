"""Prometheus exposition of the death-spiral figures, computed from the database at scrape time.

Reading the database (not in-process counters) keeps the figures right with many web and
worker processes, and across restarts: every process answers the same numbers. The all-time totals of
rows older than an hour are kept in the database (``observability.selectors.metric_totals_by_agent``):
a scrape reads only the newer rows.
"""

from __future__ import annotations

import datetime as dt
import hmac
import ipaddress
import logging
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from agents.models import Agent
from core.models import TaskSendFailure
from core.queue import queues_stats
from observability.models import Alert
from observability.selectors import HistogramSpec, calls_by_purpose, indicators, metric_totals_by_agent

logger = logging.getLogger(__name__)

PROMPT_TOKEN_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
TTFT_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
RECENT_WINDOW = dt.timedelta(minutes=15)
# Bucket counts of model-call fields: (field, bounds, field units per bound unit).
HISTOGRAMS: dict[str, HistogramSpec] = {
    "prompt_tokens_buckets": ("prompt_tokens", PROMPT_TOKEN_BUCKETS, 1.0),
    "ttft_buckets": ("ttft_ms", TTFT_BUCKETS_S, 1000.0),
}

_COUNTERS = {
    # name: (key in the totals, help)
    "agent_llm_calls": ("calls", "Model calls recorded (any outcome)."),
    "agent_llm_calls_retried": ("calls_retried", "Model calls that needed at least one retry."),
    "agent_llm_retries": ("retries", "Retries across all model calls."),
    "agent_turns": ("turns", "Turns recorded."),
    "agent_step_limit_hits": ("step_limit_hits", "Turns that hit the tool-loop step limit."),
    "agent_context_degradations": ("degradations", "Turns whose prompt had to be degraded to fit."),
    "agent_fsm_resets": ("resets", "FSM reset checkpoints."),
    "agent_sessions_failed": ("failures", "Checkpoints that moved a session to FAILED."),
    "agent_tool_invocations": ("tool_runs", "Tool runs."),
    "agent_tool_errors": ("tool_errors", "Tool runs that returned TOOL_ERROR."),
}


class DatabaseCollector(Collector):
    """Counters, histograms and gauges for every agent (label ``agent`` = slug, ``none`` without one)."""

    def collect(self) -> Iterator[Metric]:
        totals = metric_totals_by_agent(histograms=HISTOGRAMS)
        for name, (key, help_text) in _COUNTERS.items():
            family = CounterMetricFamily(name, help_text, labels=["agent"])
            for slug, values in sorted(totals.items()):
                family.add_metric([slug], float(values.get(key, 0)))
            yield family
        pending = GaugeMetricFamily("agent_summaries_pending", "Sessions waiting for a summary.", labels=["agent"])
        for slug, values in sorted(totals.items()):
            pending.add_metric([slug], float(values.get("summaries_pending", 0)))
        yield pending
        yield self._histogram(
            "agent_llm_prompt_tokens",
            "Prompt tokens per model call.",
            histogram="prompt_tokens_buckets",
            totals=totals,
            count_key="calls",
            sum_key="prompt_tokens",
            sum_scale=1.0,
        )
        # The same figures under OpenTelemetry's GenAI metric name (gen_ai.client.token.usage, input tokens).
        usage = HistogramMetricFamily(
            "gen_ai_client_token_usage",
            "Tokens per model call (GenAI semantic conventions; input tokens).",
            labels=["agent", "gen_ai_operation_name", "gen_ai_token_type"],
        )
        for sample in self._histogram(
            "agent_llm_prompt_tokens",
            "",
            histogram="prompt_tokens_buckets",
            totals=totals,
            count_key="calls",
            sum_key="prompt_tokens",
            sum_scale=1.0,
        ).samples:
            labels = {**sample.labels, "gen_ai_operation_name": "chat", "gen_ai_token_type": "input"}
            usage.samples.append(
                sample._replace(
                    name=sample.name.replace("agent_llm_prompt_tokens", "gen_ai_client_token_usage"), labels=labels
                )
            )
        yield usage
        yield self._histogram(
            "agent_llm_ttft_seconds",
            "Time to first token per streamed model call.",
            histogram="ttft_buckets",
            totals=totals,
            count_key="ttft_count",
            sum_key="ttft_sum_ms",
            sum_scale=1 / 1000.0,
        )
        yield from self._recent()
        failed_sends = CounterMetricFamily(
            "agent_task_enqueue_failures",
            "Background tasks that could not be sent to the broker (the work waits for an outbox sweep).",
            labels=["task"],
        )
        for task, count in TaskSendFailure.objects.order_by("task").values_list("task", "count"):
            failed_sends.add_metric([task], float(count))
        yield failed_sends
        yield from self._queue()
        open_alerts = GaugeMetricFamily("agent_alerts_open", "Open alerts per rule.", labels=["rule", "scope"])
        for alert in Alert.objects.filter(resolved_at__isnull=True).select_related("rule", "agent"):
            open_alerts.add_metric([alert.rule.name, alert.scope_label], 1.0)
        yield open_alerts

    @staticmethod
    def _histogram(
        name: str,
        help_text: str,
        *,
        histogram: str,
        totals: dict[str, dict[str, Any]],
        count_key: str,
        sum_key: str,
        sum_scale: float,
    ) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, help_text, labels=["agent"])
        bounds = HISTOGRAMS[histogram][1]
        for slug, values in sorted(totals.items()):
            counts = values.get(histogram)
            if counts is None:  # no model call of this agent (turns or sessions only)
                continue
            count = float(values.get(count_key, 0))
            buckets = [(str(b), float(c)) for b, c in zip(bounds, counts, strict=True)] + [("+Inf", count)]
            family.add_metric([slug], buckets, float(values.get(sum_key, 0)) * sum_scale)
        return family

    @staticmethod
    def _queue() -> Iterator[Metric]:
        """The queues' backlog on a Redis-protocol broker (none on another transport, or when the broker
        does not answer within a second: the scrape still answers, and /healthz says why)."""
        try:
            known = queues_stats(timeout=1.0)
        except Exception:
            logger.warning("metrics: the broker's queue could not be read", exc_info=True)
            return
        if known is None:  # not a Redis-protocol broker
            return
        depth = GaugeMetricFamily("agent_queue_depth", "Background tasks waiting for a worker.", labels=["queue"])
        oldest = GaugeMetricFamily(
            "agent_queue_oldest_seconds", "How long the next task to be taken has waited (0: none).", labels=["queue"]
        )
        for stats in known:
            depth.add_metric([stats.queue], float(stats.depth))
            oldest.add_metric([stats.queue], stats.oldest_seconds or 0.0)
        yield depth
        yield oldest

    @staticmethod
    def _recent() -> Iterator[Metric]:
        # The windowed figures the alert rules use, so dashboards outside the app can graph them too.
        end = timezone.now()
        start = end - RECENT_WINDOW
        rate = GaugeMetricFamily("agent_llm_retry_rate_15m", "Share of calls retried, last 15 min.", labels=["agent"])
        tokens = GaugeMetricFamily(
            "agent_llm_prompt_tokens_mean_15m", "Mean prompt tokens per call, last 15 min.", labels=["agent"]
        )
        ttft = GaugeMetricFamily("agent_llm_ttft_p95_seconds_15m", "TTFT p95, last 15 min.", labels=["agent"])
        scopes: list[tuple[str, int | None]] = [("all", None)]
        scopes += [(a.slug, a.id) for a in Agent.objects.filter(calls__created_at__gte=start).distinct()]
        for label, agent_id in scopes:
            figures = indicators(start=start, end=end, agent_id=agent_id)
            if figures.retry_rate is not None:
                rate.add_metric([label], figures.retry_rate)
            if figures.prompt_tokens_mean is not None:
                tokens.add_metric([label], float(figures.prompt_tokens_mean))
            if figures.ttft_p95_ms is not None:
                ttft.add_metric([label], figures.ttft_p95_ms / 1000.0)
        yield rate
        yield tokens
        yield ttft
        # What the turns cost, by what each call was for (one call a turn when the decision travels in the reply).
        by_purpose = {
            key: GaugeMetricFamily(
                f"agent_llm_{key}_15m", f"Model {what} by purpose, last 15 min.", labels=["agent", "purpose"]
            )
            for key, what in (
                ("calls", "calls"),
                ("prompt_tokens", "prompt tokens"),
                ("completion_tokens", "completion tokens"),
            )
        }
        for row in calls_by_purpose(start=start, end=end):
            for key, family in by_purpose.items():
                family.add_metric([str(row["slug"]), str(row["purpose"])], float(row[key]))  # type: ignore[arg-type]
        yield from by_purpose.values()


def metrics_exposition() -> bytes:
    """The Prometheus text format for the current database figures."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return generate_latest(registry)


# Headers a reverse proxy adds (standard, de facto, nginx's and Cloudflare's).
_PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-IP", "CF-Connecting-IP")


def metrics_access_allowed(request: HttpRequest) -> bool:
    """Whether this request may read /metrics.

    A matching ``Authorization: Bearer <METRICS_TOKEN>`` always may. Without it: loopback and
    private addresses when ``METRICS_ALLOW_INTERNAL`` is on; loopback only when no token is set.
    The client address is ``REMOTE_ADDR``: forwarded headers are not trusted here. A request that
    carries them came through a proxy, so its address is the proxy's (loopback, for gunicorn behind
    nginx on the same host), not the client's: it gets no address-based access at all.
    """
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        if hmac.compare_digest(header.removeprefix("Bearer ").strip().encode(), token.encode()):
            return True
    if any(name in request.headers for name in _PROXY_HEADERS):
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if settings.METRICS_ALLOW_INTERNAL:
        return address.is_loopback or address.is_private
    return not token and address.is_loopback
