"""``make run`` heals: the Celery worker killed under ``manage.py runstack`` comes back by itself, leaves nothing
behind, and the rest of the stack stays up; Ctrl-C stops every process it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from django.utils import timezone

from core import embedded_broker
from core.db import database_url
from core.models import WorkerHeartbeat
from tests.reliability.conftest import ROOT, free_port

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(condition: Any, what: str, *, within: float) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {within} s: {what}")


def group_of(pid: int) -> list[psutil.Process]:
    """The live processes of process group ``pid``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            continue
    return found


@pytest.fixture
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, int]]:
    port = free_port()
    log = tmp_path / "runstack.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url(),
        "APP_DATA_DIR": str(tmp_path / "data"),
        "EMBEDDING_BACKEND": getattr(request, "param", "hashing"),
        "CELERY_QUEUE": f"runstack-{uuid.uuid4().hex[:8]}",
        "WORKER_HEARTBEAT_SECONDS": "1",
        "LOG_FORMAT": "plain",
    }
    for name in (
        "REDIS_URL",
        "CELERY_BROKER_URL",
        "CELERY_FILESYSTEM_BROKER_DIR",
        "LLM_PROFILES_JSON",
        "EMBEDDING_SERVICE_SOCKET",
    ):
        env.pop(name, None)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: "Ready at" in log.read_text(errors="replace"), "the stack ready", within=180)
        yield proc, log, port
    finally:
        # Nothing of this test's stack may outlive it: Ctrl-C first (it stops what it started), then every
        # process group of what it had started, found before it goes (its children run in groups of their own).
        groups = {proc.pid}
        try:
            groups |= {os.getpgid(c.pid) for c in psutil.Process(proc.pid).children(recursive=True)}
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait(timeout=10)
        embedded_broker.stop_embedded_valkey(tmp_path / "data" / "valkey")


def test_a_killed_worker_comes_back_and_ctrl_c_stops_everything(
    stack: tuple[subprocess.Popen[bytes], Path, int],
) -> None:
    proc, log, port = stack
    # The default broker is the embedded Valkey, and tasks flow through it: beat's heartbeat task, sent by the
    # beat and taken by the worker (the worker's log says it received it; the task's own result is not logged).
    assert "broker:   embedded Valkey in " in log.read_text(errors="replace")
    wait_for(
        lambda: re.search(r"Task web\.tasks\.core\.record_worker_heartbeat\[[0-9a-f-]+\] received", log.read_text()),
        "a task through the broker",
        within=60,
    )
    # Once it has prepared, runstack becomes the small supervisor (the same pid): no Django, no database driver.
    assert "from core.supervisor import" in " ".join(psutil.Process(proc.pid).cmdline())
    assert "psycopg" not in Path(f"/proc/{proc.pid}/maps").read_text()
    children = {" ".join(c.cmdline()): c.pid for c in psutil.Process(proc.pid).children()}
    worker = next(pid for line, pid in children.items() if "celery" in line and "--beat-thread" in line)
    web = next(pid for line, pid in children.items() if "gunicorn" in line)
    # The background worker yields the CPU to the web processes and the turn worker (BACKGROUND_NICE).
    assert psutil.Process(worker).nice() == psutil.Process(web).nice() + 10
    # Beat runs on a thread of the worker (config.celery.ThreadedBeat): no process of its own; it sent the heartbeat
    # task received above (its own "beat: Starting..." line is an INFO record, left out by default: BEAT_LOG_LEVEL).
    assert not [c for c in psutil.Process(worker).children() if "celery" in " ".join(c.cmdline())]
    worker_group = wait_for(lambda: group_of(worker), "the worker's process group", within=30)

    killed_at = timezone.now()
    os.kill(worker, signal.SIGKILL)
    wait_for(
        lambda: "Celery worker exited (killed by SIGKILL); restarting it in 1 s." in log.read_text(errors="replace"),
        "the supervisor saying so",
        within=10,
    )
    # Whatever the dead worker had started went with it.
    gone, alive = psutil.wait_procs(worker_group, timeout=10)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    wait_for(lambda: "Celery worker restarted (restart 1)." in log.read_text(errors="replace"), "restart", within=10)
    # A new worker consumes and beats; the web server never went away.
    wait_for(
        lambda: WorkerHeartbeat.objects.filter(seen_at__gt=killed_at).exists(), "the new worker's heartbeat", within=90
    )
    assert proc.poll() is None and psutil.pid_exists(web)
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    new_worker = next(c.pid for c in psutil.Process(proc.pid).children() if "--beat-thread" in " ".join(c.cmdline()))
    groups = [new_worker, web] + [pid for pid in children.values() if pid not in (worker, web)]
    assert all(group_of(pid) for pid in groups)

    proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert proc.wait(timeout=60) == 0
    assert "Stopped." in log.read_text(errors="replace")
    assert [group_of(pid) for pid in groups] == [[] for _ in groups]


def _holds_torch(pid: int) -> bool:
    try:
        return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.real_embedder
@pytest.mark.parametrize("stack", ["sentence-transformers"], indirect=True)
def test_the_embedding_model_is_held_by_one_process_of_the_stack_and_comes_back_when_killed(
    stack: tuple[subprocess.Popen[bytes], Path, int],
) -> None:
    proc, log, port = stack
    tree = psutil.Process(proc.pid).children(recursive=True)
    holders = [p for p in tree if _holds_torch(p.pid)]
    assert [" ".join(p.cmdline()) for p in holders] == [
        next(" ".join(p.cmdline()) for p in tree if "serve_embeddings" in " ".join(p.cmdline()))
    ]
    # Ready means the web process can embed: it asks the service (it holds no model of its own).
    assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200

    service = holders[0].pid
    os.kill(service, signal.SIGKILL)
    wait_for(
        lambda: "embedding service exited (killed by SIGKILL)" in log.read_text(errors="replace"),
        "the supervisor saying so",
        within=10,
    )
    back = wait_for(
        lambda: [p for p in psutil.Process(proc.pid).children(recursive=True) if _holds_torch(p.pid)],
        "the service back",
        within=60,
    )
    assert len(back) == 1 and back[0].pid != service
    wait_for(
        lambda: httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200,
        "ready again",
        within=90,
    )
    assert proc.poll() is None
