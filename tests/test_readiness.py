"""/readyz tells the truth: 503 while this process still loads its embedding model, and a worker heartbeat
from before this process started (the previous run's) is not taken for a live worker, by /readyz or /healthz."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from core import process
from core.models import WorkerHeartbeat
from llm.tokens import counter_for
from memory import embedding
from web import warmup

# The checks read the database on threads of their own (web/health.py): what a test writes must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def just_started(monkeypatch: pytest.MonkeyPatch) -> Any:
    """This process started a moment ago (as after a restart)."""
    started = timezone.now()
    monkeypatch.setattr(process, "STARTED_AT", started)
    return started


def test_a_heartbeat_from_before_the_start_is_not_a_live_worker(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process "starts" half a minute from now: the session's real Celery worker (tests that need one start
    # it) beats every 15 s, and its heartbeats must stay older than the start, as the previous run's would.
    started = timezone.now() + timedelta(seconds=30)
    monkeypatch.setattr(process, "STARTED_AT", started)
    counter_for("").count("loaded")  # the tokenizer, as the warm-up loads it
    WorkerHeartbeat.objects.create(hostname="celery@previous-run", seen_at=started - timedelta(seconds=5))

    ready = client.get("/readyz")
    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "unavailable" and body["models"]["ok"] and body["database"]["ok"]
    assert body["worker"]["ok"] is False and "since this process started" in body["worker"]["error"]
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["worker"]["ok"] is False

    WorkerHeartbeat.objects.create(hostname="celery@this-run", seen_at=started + timedelta(seconds=1))
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.json()
    assert ready.json()["status"] == "ready"
    worker = client.get("/healthz").json()["worker"]
    assert worker["ok"] is True and worker["hostname"] == "celery@this-run"


def test_readyz_is_open_to_anyone_and_says_nothing_private(client: Client, just_started: Any) -> None:
    response = Client().get("/readyz")
    assert response.status_code in (200, 503)
    assert set(response.json()) == {"status", "up_seconds", "models", "database", "worker"}


@pytest.mark.real_embedder
def test_readyz_is_503_until_the_embedding_model_is_loaded_then_200(
    client: Client, just_started: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.EMBEDDING_BACKEND = "sentence-transformers"
    # A process that has not loaded the model yet, and has no warm-up running.
    monkeypatch.setattr(embedding, "_instances", {})
    monkeypatch.setattr(warmup, "_thread", None)
    WorkerHeartbeat.objects.create(hostname="celery@this-run", seen_at=timezone.now())

    first = client.get("/readyz")
    assert first.status_code == 503
    assert first.json()["status"] == "starting"
    assert "embedding model" in first.json()["models"]["error"]
    # /readyz started the warm-up (nothing else had, as under runserver); it finishes in the background.
    assert warmup._thread is not None
    warmup._thread.join(timeout=180)
    assert embedding.embedder_ready()
    WorkerHeartbeat.objects.filter(hostname="celery@this-run").update(seen_at=timezone.now())
    last = client.get("/readyz")
    assert last.status_code == 200, last.json()


@pytest.mark.django_db(transaction=True)
def test_probes_under_asgi_answer_in_the_event_loop_with_the_views_bodies(
    client: Client, just_started: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config/asgi.py answers /healthz and /readyz itself (no Django request thread, no middleware): the same
    checks, statuses and bodies as the views, a check that raises reported as failed, and GET only."""
    import asyncio

    import httpx

    from config.asgi import application
    from web import health

    WorkerHeartbeat.objects.create(hostname="celery@this-run", seen_at=timezone.now())

    async def ask(method: str, path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://probe") as http:
            return await http.request(method, path)

    view = client.get("/healthz")
    probe = asyncio.run(ask("GET", "/healthz"))
    assert probe.status_code == view.status_code == 200
    assert probe.json().keys() == view.json().keys() and probe.json()["status"] == "ok"
    assert probe.headers["cache-control"].startswith("max-age=0") and probe.headers["x-content-type-options"]
    assert asyncio.run(ask("POST", "/readyz")).status_code == 405

    def broken() -> dict[str, Any]:
        raise RuntimeError("secret host db.internal")

    monkeypatch.setitem(health.HEALTH_CHECKS, "broker", broken)
    failed = asyncio.run(ask("GET", "/healthz/"))
    assert failed.status_code == 503
    assert failed.json()["broker"] == {"ok": False, "error": "broker failed (RuntimeError; details in the server log)"}
