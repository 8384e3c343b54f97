"""Alert evaluation (open, refresh, resolve) and the webhook that carries fired alerts out."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from observability.models import Alert, AlertRule
from observability.selectors import MetricReading, agents_active, alert_metric_reading

logger = logging.getLogger(__name__)


@dataclass
class EvaluationResult:
    fired: list[Alert] = field(default_factory=list)
    resolved: list[Alert] = field(default_factory=list)
    still_open: list[Alert] = field(default_factory=list)


def _open_alert(*, rule: AlertRule, agent_id: int | None) -> Alert | None:
    scope = Q(agent_id=agent_id) if agent_id is not None else Q(agent__isnull=True)
    return Alert.objects.filter(scope, rule=rule, resolved_at__isnull=True).first()


def _log_fields(alert: Alert) -> dict[str, Any]:
    return {
        "alert_id": alert.id,
        "alert_rule": alert.rule.name,
        "alert_metric": alert.rule.metric,
        "alert_scope": alert.scope_label,
        "alert_value": alert.value,
        "alert_threshold": alert.threshold,
        "alert_window_minutes": alert.window_minutes,
    }


def alert_fire(*, rule: AlertRule, agent_id: int | None, reading: MetricReading, now: dt.datetime) -> Alert | None:
    """Open an alert for the rule and scope, or refresh the open one; returns the new alert, else ``None``."""
    assert reading.value is not None
    existing = _open_alert(rule=rule, agent_id=agent_id)
    if existing is not None:
        existing.last_value = reading.value
        existing.details = {**existing.details, **reading.details, "last_evaluated_at": now.isoformat()}
        existing.save(update_fields=["last_value", "details"])
        return None
    try:
        # The partial unique constraint makes a second evaluator running at the same time a no-op.
        with transaction.atomic():
            alert = Alert.objects.create(
                rule=rule,
                agent_id=agent_id,
                value=reading.value,
                last_value=reading.value,
                threshold=rule.threshold,
                window_minutes=rule.window_minutes,
                details={**reading.details, "samples": reading.samples, "metric": rule.metric},
                fired_at=now,
            )
    except IntegrityError:
        return None
    logger.warning("alert fired: %s (%s)", rule.name, alert.scope_label, extra=_log_fields(alert))
    return alert


def alert_resolve(*, alert: Alert, now: dt.datetime, reading: MetricReading) -> Alert:
    """Close an open alert: its indicator is back under the threshold (or has no samples any more)."""
    alert.resolved_at = now
    alert.details = {**alert.details, "resolved_value": reading.value, "resolved_samples": reading.samples}
    alert.save(update_fields=["resolved_at", "details"])
    logger.info("alert resolved: %s (%s)", alert.rule.name, alert.scope_label, extra=_log_fields(alert))
    return alert


def alerts_evaluate(*, now: dt.datetime | None = None) -> EvaluationResult:
    """Evaluate every enabled rule, overall and per active agent; open, refresh and resolve alerts.

    Fired alerts of rules with ``notify_webhook`` are posted to ``ALERT_WEBHOOK_URL``. Running it
    twice for the same moment changes nothing the second time. Alerts of disabled rules are resolved.
    """
    now = now or timezone.now()
    result = EvaluationResult()
    for alert in Alert.objects.filter(resolved_at__isnull=True, rule__enabled=False).select_related("rule", "agent"):
        result.resolved.append(alert_resolve(alert=alert, now=now, reading=MetricReading(value=None, samples=0)))
    for rule in AlertRule.objects.filter(enabled=True):
        scopes: list[int | None] = [None]
        if rule.per_agent:
            window = dt.timedelta(minutes=rule.window_minutes)
            # The growth rule compares with the window before, so look back two windows for agents.
            lookback = 2 * window if rule.metric == AlertRule.Metric.TOKENS_GROWTH else window
            scopes += [a.id for a in agents_active(start=now - lookback, end=now)]
            # Agents with an open alert are evaluated even when idle now, so their alert can resolve.
            scopes += [
                a
                for a in Alert.objects.filter(rule=rule, resolved_at__isnull=True, agent__isnull=False)
                .values_list("agent_id", flat=True)
                .distinct()
                if a not in scopes
            ]
        for agent_id in scopes:
            reading = alert_metric_reading(rule=rule, now=now, agent_id=agent_id)
            if reading.value is not None and reading.value > rule.threshold:
                fired = alert_fire(rule=rule, agent_id=agent_id, reading=reading, now=now)
                if fired is not None:
                    result.fired.append(fired)
                else:
                    open_alert = _open_alert(rule=rule, agent_id=agent_id)
                    if open_alert is not None:
                        result.still_open.append(open_alert)
                continue
            open_alert = _open_alert(rule=rule, agent_id=agent_id)
            if open_alert is not None:
                result.resolved.append(alert_resolve(alert=open_alert, now=now, reading=reading))
    for alert in result.fired:
        if alert.rule.notify_webhook:
            alert_webhook_post(alert=alert)
    return result


def alert_payload(*, alert: Alert) -> dict[str, Any]:
    """The JSON body posted to the webhook (also usable by Slack-style receivers via ``text``)."""
    return {
        "text": (
            f"[alert] {alert.rule.name} — {alert.scope_label}: value {alert.value:.4g} "
            f"above {alert.threshold:.4g} over {alert.window_minutes} min"
        ),
        "id": alert.id,
        "rule": alert.rule.name,
        "metric": alert.rule.metric,
        "scope": alert.scope_label,
        "agent_id": alert.agent_id,
        "value": alert.value,
        "threshold": alert.threshold,
        "window_minutes": alert.window_minutes,
        "fired_at": alert.fired_at.isoformat(),
        "details": alert.details,
    }


def alert_webhook_post(*, alert: Alert, url: str | None = None) -> bool:
    """Post a fired alert to ``ALERT_WEBHOOK_URL``; returns whether it was accepted. Never raises.

    Failures (timeouts, refused connections, non-2xx answers) are logged; the alert stays stored
    and visible in the dashboard and admin either way.
    """
    target = url if url is not None else settings.ALERT_WEBHOOK_URL
    if not target:
        return False
    try:
        response = httpx.post(target, json=alert_payload(alert=alert), timeout=settings.ALERT_WEBHOOK_TIMEOUT)
        response.raise_for_status()
    except (httpx.HTTPError, ValueError) as exc:
        logger.warning(
            "alert webhook failed: %s", exc, extra={**_log_fields(alert), "webhook_error": type(exc).__name__}
        )
        return False
    Alert.objects.filter(pk=alert.pk).update(notified_at=timezone.now())
    return True


def alerts_resolve_manually(*, alert_ids: list[int], now: dt.datetime | None = None) -> int:
    """Close open alerts by hand (admin); returns how many were open. A still-true condition fires again."""
    now = now or timezone.now()
    count = Alert.objects.filter(pk__in=alert_ids, resolved_at__isnull=True).update(resolved_at=now)
    logger.info("alerts resolved by hand", extra={"alert_ids": alert_ids, "count": count})
    return count
