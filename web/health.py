"""/healthz: is the database (with pgvector), the broker and a worker alive? /readyz: can this process
serve a chat or memory request now (embedder and tokenizer loaded, database answering, a worker seen since
this process started)?

Open to anyone (load balancers, uptime checks): a failure is named, its exception text (hosts, addresses,
user names) goes to the log only. A worker heartbeat older than this process's start counts for neither: it
may be the previous run's, from a worker that is gone.

Both answer within ``HEALTH_CHECK_TIMEOUT`` seconds whatever the database and the broker do: the checks run on
a small pool of threads of their own, and one that has not answered by then is reported as failed (a stopped
database server accepts a connection and then never answers; no statement timeout can fire there).

Under ASGI (``make run``) a probe is answered from a reading at most ``HEALTH_REFRESH_SECONDS +
HEALTH_CHECK_TIMEOUT`` old (counted from its run's start), which a thread of the process (``HealthMonitor``)
takes every ``HEALTH_REFRESH_SECONDS`` while probes keep coming:
a busy process answers in the time its event loop takes to notice the request, not in the time its checks take
to get the interpreter lock (0.5 s and more under 256 chats on 2 cores). An older reading is never answered: the
probe waits for the run under way, which ends within ``HEALTH_CHECK_TIMEOUT`` of its start. A database that stops
answering fails the first run that starts after it, which starts within ``HEALTH_REFRESH_SECONDS`` of the last
good run's start while runs answer promptly: the probes turn 503 within ``HEALTH_REFRESH_SECONDS +
HEALTH_CHECK_TIMEOUT`` (1.75 s), as soon as that run ends, and never later than the oldest reading allowed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import current_app as app  # the project's app (config/celery.py), current once config is imported
from django.conf import settings
from django.db import close_old_connections, connections
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from core import process
from core.models import WorkerHeartbeat
from llm.tokens import tokenizer_ready
from memory.embedding import embedder_ready, embedding_service_answers
from web.warmup import warm_up_in_background

logger = logging.getLogger(__name__)


def _failed(what: str, exc: BaseException) -> str:
    logger.warning("health check: %s: %s: %s", what, type(exc).__name__, exc)
    return f"{what} ({type(exc).__name__}; details in the server log)"


# The checks' own threads: a check stuck on a server that does not answer holds one of them, never a request.
# One run of a check at a time: a caller that finds it still running (another probe's, or a stuck one) waits on
# that run instead of sending it again, so checks stuck on one server never fill the pool and fail the others.
# A thread for each check, so that one stuck on a server that does not answer never keeps another from running (a
# stopped PostgreSQL must not fail the broker's check). Only the database check opens a database connection (one a
# process, on its own thread): the workers' heartbeats are read by it, in the same round trip.
# The database check runs on a thread of its own, always the same one: a Django connection belongs to its thread, and
# the check run on whichever of the pool's threads was free left a connection open on each (4 a web process).
_POOL_SIZE = 4
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_database_thread: concurrent.futures.ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()
_running: dict[Callable[[], dict[str, Any]], concurrent.futures.Future[dict[str, Any]]] = {}


def _in_own_thread(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    close_old_connections()  # a connection that broke or aged out is replaced, as between requests
    return check()


def _submit(checks: dict[str, Callable[[], dict[str, Any]]]) -> dict[str, concurrent.futures.Future[Any]]:
    global _pool, _database_thread, _pool_pid
    futures: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
    with _pool_lock:
        if _pool is None or _database_thread is None or _pool_pid != os.getpid():  # a forked child has no threads
            _pool = concurrent.futures.ThreadPoolExecutor(_POOL_SIZE, thread_name_prefix="health")
            _database_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="health-database")
            _pool_pid = os.getpid()
            _running.clear()
        for name, check in checks.items():
            future = _running.get(check)
            if future is None or future.done():
                executor = _database_thread if check is check_database else _pool
                future = _running[check] = executor.submit(_in_own_thread, check)
            futures[name] = future
    return futures


def _outcomes(futures: dict[str, concurrent.futures.Future[Any]]) -> dict[str, dict[str, Any]]:
    """Each check's result, or its failure to answer in time (a future that is not done)."""
    timeout = float(settings.HEALTH_CHECK_TIMEOUT)
    results: dict[str, dict[str, Any]] = {}
    for name, future in futures.items():
        if future.done():
            error = future.exception()
            results[name] = (
                future.result() if error is None else {"ok": False, "error": _failed(f"{name} failed", error)}
            )
        else:
            logger.warning("health check: %s did not answer within %s s", name, timeout)
            results[name] = {"ok": False, "error": f"{name} did not answer within {timeout:g} s"}
    return results


def bounded(checks: dict[str, Callable[[], dict[str, Any]]], *, deadline: float) -> dict[str, dict[str, Any]]:
    """Run ``checks`` at once on the checks' threads; a check not done by ``deadline`` (``time.monotonic``)
    is reported as failed ("did not answer within ...")."""
    futures = _submit(checks)
    concurrent.futures.wait(futures.values(), timeout=max(0.0, deadline - time.monotonic()))
    return _outcomes(futures)


async def bounded_async(
    checks: dict[str, Callable[[], dict[str, Any]]], *, deadline: float
) -> dict[str, dict[str, Any]]:
    """``bounded`` for the event loop: it awaits the checks' threads, and holds no thread of its own."""
    futures = _submit(checks)
    # Shielded: a probe cancelled while it waits (its client gone) must not cancel a run other callers share.
    live = [asyncio.shield(asyncio.wrap_future(f)) for f in futures.values()]
    if live:
        await asyncio.wait(live, timeout=max(0.0, deadline - time.monotonic()))
    return _outcomes(futures)


def _health_alias() -> str:
    """The checks' own connection when the app pools its connections (``DATABASE_POOL_MAX_SIZE``)."""
    return "health" if "health" in settings.DATABASES else "default"


def check_database() -> dict[str, Any]:
    """PostgreSQL answers, with pgvector; and the workers' heartbeats, read on the same connection (the worker
    parts of the reports come from them: ``worker_parts``)."""
    try:
        with connections[_health_alias()].cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT extversion FROM pg_extension WHERE extname = 'vector'), current_setting('server_version')"
            )
            pgvector, version = cursor.fetchone() or (None, None)
        beats = list(WorkerHeartbeat.objects.using(_health_alias()).values("hostname", "seen_at", "queues"))
    except Exception as exc:  # noqa: BLE001 - health reports every failure as data
        return {"ok": False, "error": _failed("the database is unreachable", exc)}
    if pgvector is None:
        return {"ok": False, "error": "the pgvector extension is not installed (run migrations)", "heartbeats": beats}
    return {"ok": True, "postgres": version, "pgvector": pgvector, "heartbeats": beats}


# The broker check's connection, kept between checks (one per process): a Redis-protocol broker is asked PING on
# it, one round trip; another transport gets a new connection each time, as the check is then a connect.
_broker_lock = threading.Lock()
_broker_conn: Any = None
_broker_for: tuple[int, str] = (0, "")  # the process and broker URL it was opened in and for


def _broker_ping() -> None:
    global _broker_conn, _broker_for
    with _broker_lock:  # the kept connection is one check's at a time (the checks' threads run one of each)
        here = (os.getpid(), str(app.conf.broker_url))
        if _broker_conn is None or _broker_for != here:
            if _broker_conn is not None and _broker_for[0] == os.getpid():
                _drop(_broker_conn)  # opened for another broker URL (tests)
            # A reply that does not come within the checks' deadline fails the PING: the thread is not held by a
            # stopped broker until it runs again (the worker's own connections keep their settings).
            timeout = float(settings.HEALTH_CHECK_TIMEOUT)
            options = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
            _broker_conn, _broker_for = app.connection_for_write(transport_options=options), here
        conn = _broker_conn
        try:
            # No retry: kombu sleeps 2 s before one, past the checks' deadline.
            conn.ensure_connection(max_retries=0, timeout=float(settings.HEALTH_CHECK_TIMEOUT))
            client = getattr(conn.default_channel, "client", None)
            if client is None or not callable(getattr(client, "ping", None)):
                _broker_conn = None  # not Redis-protocol: the connect was the check
                conn.release()
            else:
                client.ping()
        except BaseException:
            _broker_conn = None  # the next check connects afresh
            _drop(conn)
            raise


def _drop(conn: Any) -> None:
    try:
        conn.release()
    except Exception:  # noqa: BLE001 - it is being dropped, failing or not
        pass


def check_broker() -> dict[str, Any]:
    url = str(app.conf.broker_url)
    transport = url.split("://", 1)[0]
    try:
        _broker_ping()
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "transport": transport, "error": _failed("the broker is unreachable", exc)}
    return {"ok": True, "transport": transport}


def worker_fresh_for() -> timedelta:
    """A worker whose newest heartbeat is older than this is down: four of its beats missed (60 s by default)."""
    return timedelta(seconds=4 * int(getattr(settings, "WORKER_HEARTBEAT_SECONDS", 15)))


def _worker_part(beats: list[dict[str, Any]], *, what: str) -> dict[str, Any]:
    """The part ``what`` from the heartbeats of the workers that do its work: alive when the newest is newer than
    ``worker_fresh_for`` and than this process's start."""
    if not beats:
        return {"ok": False, "error": f"no {what} heartbeat seen yet"}
    beat = max(beats, key=lambda b: b["seen_at"])
    now = timezone.now()
    age = (now - beat["seen_at"]).total_seconds()
    fresh_for = worker_fresh_for().total_seconds()
    result: dict[str, Any] = {"ok": False, "hostname": beat["hostname"], "last_seen_seconds_ago": round(age, 1)}
    if age > fresh_for:
        result["error"] = f"last heartbeat {age:.0f}s ago (more than {fresh_for:.0f}s)"
    elif beat["seen_at"] < process.STARTED_AT:
        up = (now - process.STARTED_AT).total_seconds()
        result["error"] = (
            f"waiting for a heartbeat since this process started {up:.0f}s ago (the last came {age:.0f}s ago, "
            "before it started)"
        )
    else:
        result["ok"] = True
    return result


def _consumes(beat: dict[str, Any], queue: str) -> bool:
    """Does the worker of this heartbeat take tasks from ``queue``? (A row from before the queues were recorded,
    or from the heartbeat task alone, names none: it counts as a background worker.)"""
    queues = [q for q in str(beat.get("queues") or "").split(",") if q]
    return queue in queues if queues else queue == str(app.conf.task_default_queue)


def worker_parts(database: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The background worker (memory writes, summaries, the sweeps: the default queue) and the turn worker (the
    turns queue), each from its own heartbeats, which the database check read. Not known while the database is
    down (``ok`` None: not named as down, since what is down is the database)."""
    if "heartbeats" not in database:
        unknown = {"ok": None, "error": "not known while the database does not answer"}
        return {"worker": dict(unknown), "turn_worker": dict(unknown)}
    beats: list[dict[str, Any]] = database["heartbeats"]
    default = str(app.conf.task_default_queue)
    parts = {"worker": _worker_part([b for b in beats if _consumes(b, default)], what="background worker")}
    if str(getattr(settings, "TURN_RUNNER", "inline")) == "worker":
        turns = f"{default}-turns"
        parts["turn_worker"] = _worker_part([b for b in beats if _consumes(b, turns)], what="turn worker")
    else:
        parts["turn_worker"] = {"ok": True, "runner": "inline (turns run in the web processes)"}
    return parts


def check_embedder() -> dict[str, Any]:
    """The embedding service answers (``make run``'s, on ``EMBEDDING_SERVICE_SOCKET``); a process that embeds
    by itself (or through an endpoint) has no service to check (its model loading is readiness, not health)."""
    if not settings.EMBEDDING_SERVICE_SOCKET:
        return {"ok": True, "where": "in this process"}
    if embedding_service_answers():
        return {"ok": True, "where": "the embedding service"}
    return {"ok": False, "error": "the embedding service does not answer (turns search memories by words meanwhile)"}


def check_models() -> dict[str, Any]:
    """This process's embedder and tokenizer are loaded (starting their warm-up if nothing has)."""
    embedder, tokenizer = embedder_ready(), tokenizer_ready()
    if embedder and tokenizer:
        return {"ok": True}
    warm_up_in_background()
    waiting = [name for name, ready in (("the embedding model", embedder), ("the tokenizer", tokenizer)) if not ready]
    return {"ok": False, "error": "loading " + " and ".join(waiting)}


# Each check on a thread of its own (none waits for another); the worker parts come from the database check.
HEALTH_CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "database": check_database,
    "broker": check_broker,
    "embedder": check_embedder,
}
READY_CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "models": check_models,
    "database": check_database,
}


def _parts(checks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The checks' results with the heartbeats they carry turned into the worker parts (a copy: a reading is
    shared between probes)."""
    parts = {name: {k: v for k, v in result.items() if k != "heartbeats"} for name, result in checks.items()}
    if "database" in checks:
        parts.update(worker_parts(checks["database"]))
    return parts


def health_report(checks: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """Every part of the stack, each named: the database, the broker, the embedder, the background worker and the
    turn worker; ``down`` lists the parts found down (a part that cannot be known while another is down is not
    listed: with PostgreSQL stopped, only the database is)."""
    parts = _parts(checks)
    ok = all(part["ok"] is True for part in parts.values())
    down = [name for name, part in parts.items() if part["ok"] is False]
    return {"status": "ok" if ok else "error", "down": down, **parts}, 200 if ok else 503


def ready_report(checks: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], int]:
    parts = _parts(checks)
    parts.pop("turn_worker", None)  # readiness asks for a worker heard from since the start: the background one
    ok = all(part["ok"] is True for part in parts.values())
    status = "ready" if ok else ("starting" if not parts["models"]["ok"] else "unavailable")
    started = round((timezone.now() - process.STARTED_AT).total_seconds(), 1)
    return {"status": status, "up_seconds": started, **parts}, 200 if ok else 503


def _deadline() -> float:
    return time.monotonic() + float(settings.HEALTH_CHECK_TIMEOUT)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    body, status = health_report(bounded(HEALTH_CHECKS, deadline=_deadline()))
    return JsonResponse(body, status=status)


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when this process can answer a chat or memory request without waiting; 503 (and what it waits for)
    until then. ``make run`` says "ready" only then; the chat page shows "starting up" meanwhile."""
    body, status = ready_report(bounded(READY_CHECKS, deadline=_deadline()))
    response = JsonResponse(body, status=status)
    if body["status"] == "starting":
        # Expected while a process starts (make run asks twice a second): not an error for Django's request log.
        response._has_been_logged = True  # type: ignore[attr-defined]
    return response


class HealthMonitor:
    """A set of checks, run again every ``HEALTH_REFRESH_SECONDS`` on a thread of this process while probes
    ask for it (it stops after ``IDLE_STOP_SECONDS`` without one, and starts again with the next). ``reading``
    answers the newest results when they are fresh enough, else the next ones, when the run under way ends."""

    IDLE_STOP_SECONDS = 60.0

    def __init__(self, checks: Callable[[], dict[str, Callable[[], dict[str, Any]]]]) -> None:
        self.checks = checks  # read at each run: what is checked can change (tests replace a check)
        self._lock = threading.Lock()
        self._latest: tuple[float, dict[str, dict[str, Any]]] | None = None  # (monotonic start, results)
        self._next: concurrent.futures.Future[dict[str, dict[str, Any]]] = self._new_future()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._asked = 0.0
        self._generation = 0  # forget() starts a new one: a run begun before it keeps its results to itself

    @staticmethod
    def _new_future() -> concurrent.futures.Future[dict[str, dict[str, Any]]]:
        future: concurrent.futures.Future[dict[str, dict[str, Any]]] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # a waiter that gives up cannot cancel it for the others
        return future

    def _fresh_or_next(self) -> dict[str, dict[str, Any]] | concurrent.futures.Future[dict[str, dict[str, Any]]]:
        refresh = float(settings.HEALTH_REFRESH_SECONDS)
        now = time.monotonic()
        with self._lock:
            self._asked = now
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                # (A forked child has none of its parent's threads, and its readings are not its own.)
                if self._pid != os.getpid():
                    self._latest, self._next = None, self._new_future()
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="health-monitor", daemon=True)
                self._thread.start()
            if self._latest is not None and now - self._latest[0] <= refresh + float(settings.HEALTH_CHECK_TIMEOUT):
                return self._latest[1]
            return self._next

    def forget(self) -> None:
        """Drop the readings, and let the thread stop after the run under way (tests, between them)."""
        with self._lock:
            self._latest = None
            self._asked = float("-inf")
            self._generation += 1

    def _run(self) -> None:
        while True:
            began = time.monotonic()
            with self._lock:
                generation = self._generation
            results = bounded(self.checks(), deadline=began + float(settings.HEALTH_CHECK_TIMEOUT))
            with self._lock:
                done = None
                if generation == self._generation:
                    # Stamped with the run's start: a check may have answered at any moment of the run, so the
                    # reading is as old as its start, not its end.
                    self._latest = (began, results)
                    done, self._next = self._next, self._new_future()
                idle = time.monotonic() - self._asked > self.IDLE_STOP_SECONDS
                if idle:
                    self._thread = None
            if done is not None:
                done.set_result(results)
            if idle:
                return
            time.sleep(max(0.0, began + float(settings.HEALTH_REFRESH_SECONDS) - time.monotonic()))

    async def reading(self) -> dict[str, dict[str, Any]]:
        """The checks' results: the newest if fresh, else those of the run under way (within its deadline)."""
        got = self._fresh_or_next()
        if isinstance(got, dict):
            return got
        # The run under way ends by its own deadline; the margin covers a thread slow to be scheduled.
        limit = float(settings.HEALTH_CHECK_TIMEOUT) + 0.5
        try:
            return await asyncio.wait_for(asyncio.wrap_future(got), timeout=limit)
        except TimeoutError:
            return {name: {"ok": False, "error": f"{name} did not answer within {limit:g} s"} for name in self.checks()}


async def _probe_results(path: str) -> dict[str, dict[str, Any]]:
    checks = PROBES[path][0]
    if float(settings.HEALTH_REFRESH_SECONDS) <= 0:
        return await bounded_async(checks, deadline=_deadline())
    reading = await MONITOR.reading()
    return {name: reading[name] for name in checks}


PROBES = {"/healthz": (HEALTH_CHECKS, health_report), "/readyz": (READY_CHECKS, ready_report)}
# One monitor for both probes: every check of either, once a run.
MONITOR = HealthMonitor(lambda: {**READY_CHECKS, **HEALTH_CHECKS})
_PROBE_HEADERS = [
    (b"content-type", b"application/json"),
    (b"cache-control", b"max-age=0, no-cache, no-store, must-revalidate, private"),
    (b"x-content-type-options", b"nosniff"),
]


async def asgi_probe(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/healthz`` and ``/readyz`` under ASGI, answered in the event loop: no Django request thread and no
    middleware between a load balancer and the checks, so a probe never queues behind the requests of a busy
    process (``config/asgi.py`` sends them here). The same checks and bodies as the views, read from the
    process's ``HealthMonitor`` (``HEALTH_REFRESH_SECONDS``; 0: the checks run for each probe, as the views do)."""
    path = str(scope.get("path", "")).rstrip("/")
    report = PROBES[path][1]
    if scope.get("method") not in ("GET", "HEAD"):
        body, status = b'{"error": "GET only"}', 405
    else:
        result, status = report(await _probe_results(path))
        body = json.dumps(result).encode()
    await send({"type": "http.response.start", "status": status, "headers": _PROBE_HEADERS})
    await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else body})
