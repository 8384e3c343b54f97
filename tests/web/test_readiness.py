"""/readyz tells the truth: 503 while this process still loads its embedding model, and a worker heartbeat
from before this process started (the previous run's) is not taken for a live worker, by /readyz or /healthz."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from core import process
from core.models import WorkerHeartbeat
from llm.tokens import counter_for
from memory import embedding
from memory.embedding import registry
from web import warmup

# The checks read the database on threads of their own (web/health.py): what a test writes must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def monitors_forgotten() -> Any:
    """Each test's probes start from no reading, and the monitors' threads stop after it."""
    from web import health

    health.MONITOR.forget()
    yield
    health.MONITOR.forget()


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
    monkeypatch.setattr(registry, "_instances", {})
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
    # The probe reads the process's monitor: a reading after the change has it.
    failed = asyncio.run(ask("GET", "/healthz/"))
    deadline = time.monotonic() + 10
    while failed.status_code == 200 and time.monotonic() < deadline:
        failed = asyncio.run(ask("GET", "/healthz/"))
    assert failed.status_code == 503
    assert failed.json()["broker"] == {"ok": False, "error": "broker failed (RuntimeError; details in the server log)"}


def test_the_monitor_answers_a_fresh_reading_at_once_and_never_a_stale_one(settings: Any) -> None:
    """A probe under ASGI is answered from the monitor's newest reading while it is at most HEALTH_REFRESH_SECONDS +
    HEALTH_CHECK_TIMEOUT old (from its run's start), without running a check; past that (a monitor thread that
    stalled) it is never answered again: the probe waits for the next run, and says so when that does not come.
    With no probe for IDLE_STOP_SECONDS the monitor's thread stops."""
    from web.health import HealthMonitor

    settings.HEALTH_REFRESH_SECONDS = 0.2
    settings.HEALTH_CHECK_TIMEOUT = 0.3  # a reading is answered until 0.5 s after its run started
    runs: list[float] = []
    gate = threading.Event()
    asked_for_checks = []

    def check() -> dict[str, Any]:
        runs.append(time.monotonic())
        return {"ok": True, "run": len(runs)}

    def checks() -> dict[str, Any]:
        asked_for_checks.append(1)
        if len(asked_for_checks) == 2:
            gate.wait(10)  # the second run's thread stalls before it checks anything
        return {"counted": check}

    monitor = HealthMonitor(checks)
    monitor.IDLE_STOP_SECONDS = 1.0  # type: ignore[misc]
    try:
        assert asyncio.run(monitor.reading()) == {"counted": {"ok": True, "run": 1}}  # waited for the first run
        assert asyncio.run(monitor.reading())["counted"]["run"] == 1  # fresh: no check run for it
        assert len(runs) == 1
        while time.monotonic() - runs[0] < 0.6:
            time.sleep(0.02)
        stale = asyncio.run(monitor.reading())  # the first reading is past 0.5 s and no run has ended since
        assert stale == {"counted": {"ok": False, "error": "counted did not answer within 0.8 s"}}, stale
        gate.set()  # the stalled run ends (past its deadline: reported as not answering), and the next ones pass
        deadline = time.monotonic() + 5
        while not asyncio.run(monitor.reading())["counted"]["ok"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert asyncio.run(monitor.reading())["counted"]["ok"] is True
        # No probe for a second: the thread stops by itself (and the next probe starts it again).
        deadline = time.monotonic() + 10
        while monitor._thread is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert monitor._thread is None
        stopped_at = len(runs)
        time.sleep(0.5)
        assert len(runs) == stopped_at  # no run without a probe
    finally:
        gate.set()
        monitor.forget()


def test_a_run_that_outlives_its_deadline_is_answered_as_failed(settings: Any) -> None:
    """A check stuck past HEALTH_CHECK_TIMEOUT (a database that accepts and never answers) is reported as not
    answering, by the monitor's run as by the views."""
    from web.health import HealthMonitor

    settings.HEALTH_REFRESH_SECONDS = 0.1
    settings.HEALTH_CHECK_TIMEOUT = 0.3
    release = threading.Event()

    def stuck() -> dict[str, Any]:
        release.wait(5)
        return {"ok": True}

    monitor = HealthMonitor(lambda: {"database": stuck})
    try:
        asked = time.monotonic()
        result = asyncio.run(monitor.reading())
        assert result == {"database": {"ok": False, "error": "database did not answer within 0.3 s"}}
        assert time.monotonic() - asked < 3
    finally:
        release.set()
        monitor.forget()


def test_a_check_that_has_not_returned_is_not_sent_again_and_the_others_go_on(settings: Any) -> None:
    """A server that never answers holds the thread of its check: each run of the monitor waits on that same
    run (the checks' threads run one of each check at a time) and reports it as not answering, without sending
    it again, so stuck checks cannot fill the checks' small pool and fail the checks of everything else (a
    broker outage would otherwise turn /readyz 503)."""
    from web.health import HealthMonitor

    settings.HEALTH_REFRESH_SECONDS = 0.05
    settings.HEALTH_CHECK_TIMEOUT = 0.2
    release = threading.Event()
    calls = {"stuck": 0, "quick": 0}

    def stuck() -> dict[str, Any]:
        calls["stuck"] += 1
        release.wait(10)
        return {"ok": True}

    def quick() -> dict[str, Any]:
        calls["quick"] += 1
        return {"ok": True}

    monitor = HealthMonitor(lambda: {"broker": stuck, "database": quick})
    try:
        readings = []
        deadline = time.monotonic() + 10
        while calls["quick"] < 12 and time.monotonic() < deadline:
            readings.append(asyncio.run(monitor.reading()))
            time.sleep(0.05)
        assert calls["quick"] >= 12, calls
        assert calls["stuck"] == 1  # sent once, never again while it hangs
        last = readings[-1]
        assert last["broker"] == {"ok": False, "error": "broker did not answer within 0.2 s"}
        assert last["database"] == {"ok": True}  # the pool was not filled by the stuck check
    finally:
        release.set()
        monitor.forget()


def test_the_database_check_runs_on_one_thread_of_its_own_whatever_the_probes(monkeypatch: Any) -> None:
    """Issue 54: a Django connection belongs to its thread. The database check run on whichever of the checks'
    threads was free left a connection open on each (8 of the stack's 33 at 256 at once); on its own thread it
    holds one a process."""
    from concurrent.futures import ThreadPoolExecutor

    from web import health

    ran_on: list[str] = []
    original = health.check_database

    def spy() -> dict[str, Any]:
        ran_on.append(threading.current_thread().name)
        time.sleep(0.01)
        return original()

    monkeypatch.setattr(health, "check_database", spy)
    checks = {"database": spy, "broker": health.check_broker, "embedder": health.check_embedder}

    def probe(_: int) -> None:
        for _round in range(10):
            health.bounded(checks, deadline=time.monotonic() + 5)

    with ThreadPoolExecutor(6) as probes:
        list(probes.map(probe, range(6)))
    assert ran_on and len(set(ran_on)) == 1, set(ran_on)
    assert ran_on[0].startswith("health-database")
