"""Test-wide fixtures: personas, and a real Celery worker process on a real broker."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from core.db import database_url, redis_reachable

ROOT = Path(__file__).resolve().parent

# The tests' cache (throttle and sign-in counters, the sweeps' requeue claims) stays in this process: not
# in the table (or Redis) a running app and earlier runs use. Set before anything touches the cache
# (Django builds it on first use); emptied around every test (``_fresh_cache``).
django_settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# Turns run in the request in the tests (and the servers they start), unless a test starts a turn worker.
os.environ.setdefault("TURN_RUNNER", "inline")
django_settings.TURN_RUNNER = os.environ["TURN_RUNNER"]
# A dead runner's turn lease runs out in 5 s here (30 s by default), for the crash tests' children too.
os.environ.setdefault("TURN_LEASE_SECONDS", "5")
django_settings.TURN_LEASE_SECONDS = float(os.environ["TURN_LEASE_SECONDS"])
# Run streams of this test run (and of the servers it starts) are its own: turn ids start at 1 in every test
# database, and streams are kept an hour in a Redis that earlier runs and other checkouts share.
os.environ.setdefault("RUN_EVENTS_PREFIX", f"test-{uuid.uuid4().hex[:8]}")
django_settings.RUN_EVENTS_PREFIX = os.environ["RUN_EVENTS_PREFIX"]
# Where tasks go: the idle queue nobody consumes, and the worker's once ``celery_worker`` has started.
_BROKERS: dict[str, dict[str, Any]] = {}


class WorkerHandle:
    def __init__(self, proc: subprocess.Popen[bytes], broker_url: str, queue: str, log: Path) -> None:
        self.proc = proc
        self.broker_url = broker_url
        self.queue = queue
        self.log = log

    @property
    def transport(self) -> str:
        return self.broker_url.split("://", 1)[0]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _worker_broker(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> tuple[str, dict[str, object]]:
    """The worker's broker URL and transport options: Redis when reachable, else a filesystem broker in a
    folder of its own (named in ``env`` for the worker)."""
    if os.environ.get("TEST_BROKER", "") != "filesystem" and redis_reachable():
        return os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15"), {}
    folder = tmp_path_factory.mktemp("broker")
    (folder / "out").mkdir()
    (folder / "processed").mkdir()
    (folder / "control").mkdir()
    env["CELERY_FILESYSTEM_BROKER_DIR"] = str(folder)
    return "filesystem://", {
        "data_folder_in": str(folder / "out"),
        "data_folder_out": str(folder / "out"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
    }


def _worker_start(queue: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A prefork Celery worker of two processes on ``queue`` and its ops queue, writing to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                "2",
                "--loglevel",
                "INFO",
                "-Q",
                f"{queue},{queue}-ops",
                "--hostname",
                f"{queue}@%h",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _worker_wait_ready(handle: WorkerHandle, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while "ready." not in handle.log_text():
        if handle.proc.poll() is not None or time.monotonic() > deadline:
            handle.proc.kill()
            raise RuntimeError(f"Celery worker did not start:\n{handle.log_text()}")
        time.sleep(0.2)


def _worker_stop(handle: WorkerHandle) -> None:
    """Stop the worker (killed after 15 s) and empty its Redis queues."""
    handle.proc.terminate()
    try:
        handle.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        handle.proc.kill()
    if handle.broker_url.startswith("redis"):
        import redis

        redis.Redis.from_url(handle.broker_url).delete(handle.queue, f"{handle.queue}-ops")


@pytest.fixture(scope="session")
def celery_worker(
    django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerHandle]:
    """A real Celery worker in its own process, on Redis when reachable, else the filesystem broker.

    Tests that use it must commit their data (``transaction=True``) so the worker can see it.
    """
    from config.celery import app

    queue = f"test-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    broker_url, transport_options = _worker_broker(tmp_path_factory, env)
    with django_db_blocker.unblock():
        env["DATABASE_URL"] = database_url()
    # The worker embeds with the deterministic embedder too (the real model's cold load takes ~18 s).
    env["EMBEDDING_BACKEND"] = os.environ.get("TEST_WORKER_EMBEDDING_BACKEND", "hashing")
    env.update({"CELERY_BROKER_URL": broker_url, "CELERY_QUEUE": queue, "DJANGO_SETTINGS_MODULE": "config.settings"})
    _BROKERS["worker"] = {
        "broker_url": broker_url,
        "broker_transport_options": transport_options,
        "task_default_queue": queue,
        "task_routes": _ops_routes(queue),
    }
    _use_broker(app, "worker")
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    handle = WorkerHandle(_worker_start(queue, env, log), broker_url, queue, log)
    _worker_wait_ready(handle)
    yield handle
    _worker_stop(handle)


def wait_for(predicate: Any, *, timeout: float = 20.0, interval: float = 0.1, message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


@pytest.fixture(scope="session", autouse=True)
def _isolated_broker(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tasks enqueued by tests never reach the developer's own broker and worker.

    Without a ``celery_worker`` they land in a throwaway filesystem queue nobody consumes; the
    ``celery_worker`` fixture later points the app at its own broker and queue.
    """
    from config.celery import app

    folder = tmp_path_factory.mktemp("idle-broker")
    (folder / "out").mkdir()
    (folder / "processed").mkdir()
    (folder / "control").mkdir()
    _BROKERS["idle"] = {
        "broker_url": "filesystem://",
        "broker_transport_options": {
            "data_folder_in": str(folder / "out"),
            "data_folder_out": str(folder / "out"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
        },
        "task_default_queue": (idle := f"idle-{uuid.uuid4().hex[:8]}"),
        "task_routes": _ops_routes(idle),
    }
    _use_broker(app, "idle")


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    """One test's counters and claims must not throttle, lock out or hold back the next test's."""
    from django.contrib.contenttypes.models import ContentType
    from django.core.cache import cache

    from agents.endpoints import forget_stored_profiles
    from llm.capabilities import forget_all
    from memory.embedding import query_vectors_forget
    from memory.retrieval import history_sizes_forget, redundancies_forget

    cache.clear()
    # Content types are made again, with new ids, by every flush of a transactional test; an id cached before one
    # (an admin log entry's) failed a later test's foreign-key check once in a whole run.
    ContentType.objects.clear_cache()
    forget_all()  # what an endpoint took for structured outputs (a fake server's port is reused)
    forget_stored_profiles()
    history_sizes_forget()  # a user's history size, remembered per process (ids are not reused, but to be sure)
    redundancies_forget()  # a user's store redundancy, likewise
    query_vectors_forget()  # query vectors, remembered per process and embedder name
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def _tasks_reach_the_worker_only_in_its_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """Once started, the session's worker stays up; a test that did not ask for it must not feed it.

    Otherwise the worker would still be running a task of that test (a turn's memory writes) while the
    test's database is flushed: the flush and the task deadlock, and the rows left over fail the next test.
    For the same reason a test that did ask for it ends only when the worker has finished what the test
    started (a turn's after-work is sent after the turn completes, which is all most tests wait for).
    """
    from config.celery import app

    broker = broker_for(request.fixturenames, started=_BROKERS)
    if broker == "worker":
        # Requested here so that this fixture's teardown (the wait) runs before the database's (the flush).
        request.getfixturevalue("_django_db_helper")
    _use_broker(app, broker)
    yield
    if broker == "worker":
        worker_wait_idle(app, request.getfixturevalue("celery_worker"))


def worker_wait_idle(app: Any, worker: WorkerHandle, *, timeout: float = 60.0) -> bool:
    """Wait until the worker has no task running, reserved or waiting in its queue (twice in a row).

    Returns whether it got there within ``timeout``; a worker that answers nothing counts as busy.
    """
    destination = [f"{worker.queue}@{socket.gethostname()}"]
    deadline = time.monotonic() + timeout
    idle_polls = 0
    while time.monotonic() < deadline and worker.proc.poll() is None:
        inspect = app.control.inspect(destination=destination, timeout=1.0)
        active, reserved = inspect.active(), inspect.reserved()
        busy = (
            active is None or reserved is None or any(active.values()) or any(reserved.values()) or _queued(worker) > 0
        )
        idle_polls = 0 if busy else idle_polls + 1
        if idle_polls >= 2:
            return True
        time.sleep(0.2)
    return False


def _queued(worker: WorkerHandle) -> int:
    if not worker.broker_url.startswith("redis"):
        return 0  # the filesystem broker: what the worker has not taken yet shows in inspect's reserved soon
    import redis

    return int(redis.Redis.from_url(worker.broker_url).llen(worker.queue))


def broker_for(fixturenames: Any, *, started: dict[str, Any]) -> str:
    """Which broker a test's tasks go to: the worker's only when the test asked for the worker (and it runs)."""
    return "worker" if "celery_worker" in fixturenames and "worker" in started else "idle"


def _ops_routes(queue: str) -> dict[str, dict[str, str]]:
    """Beat's tasks and recovery to ``<queue>-ops``, as the settings route them beside the default queue."""
    return {name: {"queue": f"{queue}-ops"} for name in django_settings.OPS_TASKS}


def _use_broker(app: Any, name: str) -> None:
    settings = _BROKERS[name]
    if all(app.conf.get(key) == value for key, value in settings.items()):
        return
    app.conf.update(**settings)
    _drop_broker_connections(app)


def _drop_broker_connections(app: Any) -> None:
    """Forget pooled connections to the previous broker after changing ``broker_url``.

    Not ``app.close()``: that also deregisters the app, and tasks imported later would not register.
    Not ``force_close_all()`` either: kombu keeps producer pools per broker URL in a global registry,
    and a test that switches back to a URL would get a pool whose connections were closed.
    """
    app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture(autouse=True)
def _deterministic_embedder(request: pytest.FixtureRequest, settings: Any) -> None:
    """Tests embed with the fast deterministic hashing embedder unless marked ``real_embedder``."""
    if request.node.get_closest_marker("real_embedder") is None:
        settings.EMBEDDING_BACKEND = "hashing"


@pytest.fixture
def use_provider() -> Iterator[Any]:
    """``use_provider(model)``: every model call of the test goes to ``model`` (a provider, or a function of
    ``(agent, cheap)`` choosing one) until the test ends (``llm.providers.provider_override``)."""
    from llm.providers import provider_override

    with contextlib.ExitStack() as stack:
        yield lambda provider: stack.enter_context(provider_override(provider))


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="alice", password="alice-pass-123")


@pytest.fixture
def bob(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="bob", password="bob-pass-123")


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(
        username="staff", password="staff-pass-123", is_staff=True, is_superuser=True
    )


@pytest.fixture
def staff_client(staff: Any) -> Any:
    """The admin's staff user, signed in to a browser-like client (tests/api has its own, a token client)."""
    from django.test import Client

    client = Client()
    client.force_login(staff)
    return client


@pytest.fixture
def viewer_staff(django_user_model: Any) -> Any:
    """Staff with only the admin's view permissions (no superuser): may look, may not change."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="viewer", password="viewer-pass-123", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    return user


@pytest.fixture
def fake_openai() -> Iterator[Any]:
    """A real local HTTP server speaking the OpenAI protocol (tests/fakes/openai_server.py); enqueue answers."""
    from tests.fakes.openai_server import FakeOpenAIServer

    with FakeOpenAIServer() as server:
        yield server


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the embedded PostgreSQL if this test run started it (and only then)."""
    from django.conf import settings

    from core import embedded_db

    if settings.DATABASE_URL or not embedded_db.started_by_this_process:
        return
    from django.db import connections

    connections.close_all()
    embedded_db.stop_embedded_postgres(settings.DATA_DIR / "pg")


# --- The world: an agent of each kind, a session in each state (tests/world.py builds them). ---------------------
@pytest.fixture
def chat_agent(db: Any) -> Any:
    from tests.world import make_agent

    return make_agent("chat")


@pytest.fixture
def tools_agent(db: Any) -> Any:
    from tests.world import make_agent

    return make_agent("tools")


@pytest.fixture
def booking_agent(db: Any) -> Any:
    from tests.world import make_agent

    return make_agent("booking")


@pytest.fixture
def chat_session(alice: Any, chat_agent: Any) -> Any:
    """Alice's new free chat."""
    from tests.world import make_session

    return make_session(alice, chat_agent)


@pytest.fixture
def booking_session(alice: Any, booking_agent: Any) -> Any:
    """Alice's new flight booking, in the workflow's first state."""
    from tests.world import make_session

    return make_session(alice, booking_agent)


@pytest.fixture
def handed_off_session(alice: Any, chat_agent: Any) -> Any:
    """Alice's free chat, handed to a person (the agent does not answer it)."""
    from sessions.models import ChatSession
    from tests.world import make_session

    return make_session(alice, chat_agent, status=ChatSession.Status.NEEDS_HUMAN)


@pytest.fixture
def closed_session(alice: Any, chat_agent: Any) -> Any:
    """Alice's free chat, closed (it takes no new message)."""
    from sessions.models import ChatSession
    from tests.world import make_session

    return make_session(alice, chat_agent, status=ChatSession.Status.CLOSED)
