from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from django.utils import timezone

from observability.models import Alert, AlertRule
from observability.services import alert_webhook_post, alerts_evaluate, alerts_resolve_manually
from tests.observability.builders import build_death_spiral, build_healthy_run, make_agent, make_call
from web.tasks.observability import evaluate_alerts

pytestmark = pytest.mark.django_db


def _fired(agent_id: int | None) -> set[str]:
    scope = (
        Alert.objects.filter(agent_id=agent_id) if agent_id is not None else Alert.objects.filter(agent__isnull=True)
    )
    return set(scope.filter(resolved_at__isnull=True).values_list("rule__metric", flat=True))


def test_default_rules_are_seeded() -> None:
    """The data migration's own seed function, on an empty table (the autouse fixture refills the table from
    the same list, so reading the table alone could not fail)."""
    import importlib

    from django.apps import apps

    AlertRule.objects.all().delete()
    importlib.import_module("observability.migrations.0002_default_rules").seed(apps, None)
    rules = {r.metric: r for r in AlertRule.objects.all()}
    assert rules["retry_rate"].threshold == pytest.approx(0.10) and rules["retry_rate"].window_minutes == 15
    assert rules["tokens_growth"].threshold == pytest.approx(0.30) and rules["tokens_growth"].window_minutes == 60
    assert rules["fsm_resets"].threshold == 5 and rules["fsm_resets"].window_minutes == 10
    assert {"ttft_p95", "tool_error_rate"} <= set(rules)
    assert all(r.enabled for m, r in rules.items() if m in {"retry_rate", "tokens_growth", "fsm_resets"})


def test_a_death_spiral_fires_the_alerts(alice: Any, caplog: pytest.LogCaptureFixture) -> None:
    now = timezone.now()
    spiral = make_agent("spiral")
    calm = make_agent("calm")
    build_death_spiral(user=alice, agent=spiral, now=now)
    build_healthy_run(user=alice, agent=calm, now=now)

    with caplog.at_level(logging.WARNING, logger="observability.services"):
        result = alerts_evaluate(now=now)

    expected = {"retry_rate", "tokens_growth", "fsm_resets", "ttft_p95"}
    assert _fired(spiral.id) == expected
    assert _fired(calm.id) == set()
    # The spiral drags the overall figures past the thresholds too.
    assert {"retry_rate", "tokens_growth", "fsm_resets"} <= _fired(None)
    assert {a.rule.metric for a in result.fired if a.agent_id == spiral.id} == expected

    growth = Alert.objects.get(agent=spiral, rule__metric="tokens_growth")
    assert growth.value > 0.3
    assert growth.details["tokens_per_call"] > growth.details["tokens_per_call_before"]
    retry = Alert.objects.get(agent=spiral, rule__metric="retry_rate")
    # The last 8 turns (from 15 minutes ago on) each have one retried chat call and one clean slots call.
    assert retry.value == pytest.approx(8 / 16)
    assert retry.details["calls_retried"] == 8 and retry.details["retries"] == 16
    assert retry.threshold == pytest.approx(0.10) and retry.window_minutes == 15
    resets = Alert.objects.get(agent=spiral, rule__metric="fsm_resets")
    assert resets.value == 7

    warnings = [r for r in caplog.records if r.getMessage().startswith("alert fired")]
    assert len(warnings) == len(result.fired)
    assert {getattr(r, "alert_scope", None) for r in warnings} == {"spiral", "overall"}


def test_a_healthy_run_fires_nothing(alice: Any) -> None:
    now = timezone.now()
    build_healthy_run(user=alice, agent=make_agent("calm"), now=now, sessions=4)
    result = alerts_evaluate(now=now)
    assert result.fired == []
    assert not Alert.objects.exists()


def test_evaluating_again_opens_no_duplicate_and_a_recovery_resolves(alice: Any) -> None:
    now = timezone.now()
    spiral = make_agent("spiral")
    build_death_spiral(user=alice, agent=spiral, now=now)
    first = alerts_evaluate(now=now)
    count = Alert.objects.count()
    second = alerts_evaluate(now=now + dt.timedelta(seconds=30))
    evaluate_alerts()  # the periodic task, at the real clock: still inside every window
    assert second.fired == []
    assert Alert.objects.count() == count
    assert len(second.still_open) == len(first.fired)
    refreshed = Alert.objects.get(agent=spiral, rule__metric="retry_rate")
    assert "last_evaluated_at" in refreshed.details

    # Three hours on, every window is empty or calm again: all alerts resolve.
    later = now + dt.timedelta(hours=3)
    for k in range(12):
        make_call(at=later - dt.timedelta(minutes=k), agent=spiral, prompt_tokens=900)
    resolved = alerts_evaluate(now=later)
    assert len(resolved.resolved) == count
    assert not Alert.objects.filter(resolved_at__isnull=True).exists()


def test_a_disabled_rule_does_not_fire_and_its_open_alerts_resolve(alice: Any) -> None:
    now = timezone.now()
    build_death_spiral(user=alice, agent=make_agent("spiral"), now=now)
    alerts_evaluate(now=now)
    AlertRule.objects.filter(metric="fsm_resets").update(enabled=False)
    alerts_evaluate(now=now)
    assert not Alert.objects.filter(rule__metric="fsm_resets", resolved_at__isnull=True).exists()
    assert Alert.objects.filter(rule__metric="retry_rate", resolved_at__isnull=True).exists()


def test_manual_resolution(alice: Any) -> None:
    now = timezone.now()
    build_death_spiral(user=alice, agent=make_agent("spiral"), now=now)
    alerts_evaluate(now=now)
    ids = list(Alert.objects.values_list("pk", flat=True))
    assert alerts_resolve_manually(alert_ids=ids) == len(ids)
    assert alerts_resolve_manually(alert_ids=ids) == 0


class _Receiver(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, type[_Receiver]]]:
    handler = type("Receiver", (_Receiver,), {"received": [], "status": 200})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", handler
    server.shutdown()
    server.server_close()


def test_fired_alerts_are_posted_to_the_webhook(alice: Any, settings: Any, webhook: Any) -> None:
    url, receiver = webhook
    settings.ALERT_WEBHOOK_URL = url
    now = timezone.now()
    build_death_spiral(user=alice, agent=make_agent("spiral"), now=now)
    result = alerts_evaluate(now=now)
    assert len(receiver.received) == len(result.fired) > 0
    posted = {(p["metric"], p["scope"]) for p in receiver.received}
    assert ("retry_rate", "spiral") in posted
    assert all("above" in p["text"] for p in receiver.received)
    assert not Alert.objects.filter(notified_at__isnull=True).exists()
    alerts_evaluate(now=now)
    assert len(receiver.received) == len(result.fired)  # nothing new fired, nothing posted again


def test_a_failing_webhook_is_logged_and_never_raises(
    alice: Any, settings: Any, webhook: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url, receiver = webhook
    receiver.status = 500
    settings.ALERT_WEBHOOK_TIMEOUT = 2.0
    now = timezone.now()
    build_death_spiral(user=alice, agent=make_agent("spiral"), now=now)
    alerts_evaluate(now=now)
    alert = Alert.objects.first()
    assert alert is not None
    with caplog.at_level(logging.WARNING, logger="observability.services"):
        assert alert_webhook_post(alert=alert, url=url) is False
        # Nothing listens on port 9 (discard) here: connection refused, also swallowed.
        assert alert_webhook_post(alert=alert, url="http://127.0.0.1:9/hook") is False
    failures = [r for r in caplog.records if r.getMessage().startswith("alert webhook failed")]
    assert len(failures) == 2
    assert Alert.objects.get(pk=alert.pk).notified_at is None


def test_too_few_samples_fire_nothing_until_the_rule_allows_it(settings: Any) -> None:
    now = timezone.now()
    agent = make_agent("quiet")
    for k in range(5):  # every call retried, but only five of them
        make_call(at=now - dt.timedelta(minutes=k + 1), agent=agent, retries=1)
    assert alerts_evaluate(now=now).fired == []
    settings.ALERT_MIN_SAMPLES = 5
    rule = AlertRule.objects.create(name="Any retries, small sites", metric="retry_rate", threshold=0.5)
    assert rule.min_samples == 5
    fired = alerts_evaluate(now=now).fired
    assert {(a.rule_id, a.agent_id) for a in fired} == {(rule.id, None), (rule.id, agent.id)}


def test_the_queue_wait_rule_fires_when_a_background_task_has_waited_too_long() -> None:
    """Seeded by its migration, overall only; it reads the broker's queues (a task sent ten minutes ago and not
    taken yet), fires once, and resolves when the queue is empty."""
    import importlib
    import tempfile
    import time
    from pathlib import Path

    import redis
    from celery import current_app
    from django.apps import apps

    from core import embedded_broker

    AlertRule.objects.filter(metric="queue_wait").delete()
    importlib.import_module("observability.migrations.0005_queue_wait_rule").seed(apps, None)
    rule = AlertRule.objects.get(metric="queue_wait")
    assert (rule.threshold, rule.per_agent, rule.enabled) == (300, False, True)
    folder = Path(tempfile.mkdtemp(prefix="vk-"))
    conf = current_app.conf
    before = {key: conf.get(key) for key in ("broker_url", "task_default_queue")}
    try:
        url = embedded_broker.ensure_embedded_valkey(folder)
        conf.update(broker_url=url, task_default_queue="slow")
        queue = redis.Redis(unix_socket_path=str(embedded_broker.socket_path(folder)))
        stale = {"headers": {"task": "web.tasks.memory.write_turn_memories", "sent_at": time.time() - 600}, "body": ""}
        queue.lpush("slow", json.dumps(stale))
        fired = [a for a in alerts_evaluate().fired if a.rule_id == rule.pk]
        assert len(fired) == 1 and fired[0].agent_id is None and fired[0].value >= 600
        assert fired[0].details["slow"]["depth"] == 1
        assert not [a for a in alerts_evaluate().fired if a.rule_id == rule.pk]  # still open: not fired again
        queue.delete("slow")
        assert [a.rule_id for a in alerts_evaluate().resolved] == [rule.pk]
    finally:
        conf.update(before)
        embedded_broker.stop_embedded_valkey(folder)
