from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from core.models import Dated


def default_min_samples() -> int:
    """New rules start from ``ALERT_MIN_SAMPLES``."""
    return int(settings.ALERT_MIN_SAMPLES)


class AlertRule(Dated):
    """A threshold on one death-spiral indicator over a time window, set in the admin.

    The rule fires when the indicator's value is above ``threshold`` (strictly). Rate and
    growth metrics are fractions (0.10 = 10 %); count metrics are counts; TTFT is milliseconds.
    """

    class Metric(models.TextChoices):
        RETRY_RATE = "retry_rate", "Share of calls that needed a retry"
        RETRIES_PER_CALL = "retries_per_call", "Retries per call"
        TOKENS_GROWTH = "tokens_growth", "Prompt tokens per call: growth vs the previous window"
        FSM_RESETS = "fsm_resets", "FSM resets (count)"
        FAILED_SESSIONS = "failed_sessions", "Sessions moved to FAILED (count)"
        TTFT_P95 = "ttft_p95", "Time to first token, p95 (ms)"
        TOOL_ERROR_RATE = "tool_error_rate", "Share of tool runs that returned TOOL_ERROR"
        STEP_LIMIT_HITS = "step_limit_hits", "Turns that hit the step limit (count)"
        DEGRADATIONS = "degradations", "Turns whose context was degraded (count)"
        SUMMARIES_PENDING = "summaries_pending", "Sessions waiting for a summary (count, now)"
        QUEUE_WAIT = "queue_wait", "Background queues: how long the oldest waiting task has waited (s, now)"

    name = models.CharField(max_length=120, unique=True)
    metric = models.CharField(max_length=30, choices=Metric.choices)
    threshold = models.FloatField(help_text="Fires when the value is above this.")
    window_minutes = models.PositiveIntegerField(default=15, validators=[MinValueValidator(1)])
    min_samples = models.PositiveIntegerField(
        default=default_min_samples, help_text="Rates and percentiles need at least this many calls/runs in the window."
    )
    per_agent = models.BooleanField(default=True, help_text="Also evaluate each agent on its own.")
    enabled = models.BooleanField(default=True)
    notify_webhook = models.BooleanField(default=True, help_text="Post fired alerts to ALERT_WEBHOOK_URL.")
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Alert(models.Model):
    """A rule that fired for one scope (an agent, or overall when ``agent`` is empty).

    At most one open alert (``resolved_at`` empty) per rule and scope; it is resolved when
    the indicator falls back under the threshold.
    """

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    agent = models.ForeignKey("agents.Agent", null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    value = models.FloatField(help_text="The indicator's value when the alert fired.")
    last_value = models.FloatField(help_text="The value at the latest evaluation while open.")
    threshold = models.FloatField()
    window_minutes = models.PositiveIntegerField()
    details = models.JSONField(default=dict, blank=True)
    fired_at = models.DateTimeField(db_index=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    notified_at = models.DateTimeField(null=True, blank=True, help_text="When the webhook accepted it.")

    class Meta:
        ordering = ["-fired_at"]
        constraints = [
            # No duplicate open alert for one rule and scope; the overall scope (agent NULL) counts as one value.
            models.UniqueConstraint(
                fields=["rule", "agent"],
                condition=models.Q(resolved_at__isnull=True),
                nulls_distinct=False,
                name="alert_one_open_per_rule_scope",
            ),
        ]
        indexes = [
            # Dashboard: open alerts first (WHERE resolved_at IS NULL ORDER BY fired_at DESC).
            models.Index(fields=["resolved_at", "-fired_at"], name="alert_open_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.rule} ({self.scope_label})"

    @property
    def scope_label(self) -> str:
        return self.agent.slug if self.agent_id and self.agent else "overall"

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None


class MetricTotals(models.Model):
    """What the /metrics exporter keeps between scrapes (``observability.selectors.metric_totals_by_agent``):
    the totals of rows before ``sealed_before``, and the offsets that keep counters from going down. In the
    database, not the cache: a cache that restarts empty (Redis without persistence) made every counter
    start over, a drop Prometheus reads as a restart."""

    key = models.CharField(max_length=80, unique=True, help_text="Which histograms these totals carry.")
    sealed_before = models.DateTimeField()
    state = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "metric totals"

    def __str__(self) -> str:
        return f"metric totals {self.key} (sealed before {self.sealed_before:%Y-%m-%d %H:%M})"
