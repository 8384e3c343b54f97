"""Sending tasks by name (``core.queue.enqueue``): safe from many threads on a cold process, and every
failure counted for ``/metrics``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import _drop_broker_connections
from core.db import database_url
from core.models import TaskSendFailure
from core.queue import enqueue
from observability.metrics import metrics_exposition
from tests.reliability.test_cold_start import sent_tasks

ROOT = Path(__file__).resolve().parents[2]

# A process that has sent nothing yet: Django set up, no task module imported, then 32 threads send at once.
COLD_SENDERS = r"""
import json, sys, threading
import django

django.setup()
cold = "web.tasks.memory" not in sys.modules  # the task module it sends to: not imported yet
from core.queue import enqueue

count = int(sys.argv[1])
start = threading.Barrier(count)
results = [""] * count


def send(i):
    start.wait()
    try:
        enqueue("web.tasks.memory.write_turn_memories", i)
        results[i] = "sent"
    except Exception as exc:
        results[i] = f"{type(exc).__name__}: {exc}"


threads = [threading.Thread(target=send, args=(i,)) for i in range(count)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"cold": cold, "results": results}))
"""


@pytest.mark.django_db(transaction=True)
def test_32_threads_enqueue_at_once_on_a_process_that_has_sent_nothing(tmp_path: Path) -> None:
    broker = tmp_path / "broker"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url(),
        "EMBEDDING_BACKEND": "hashing",
        "CELERY_BROKER_URL": "filesystem://",
        "CELERY_FILESYSTEM_BROKER_DIR": str(broker),
    }
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", COLD_SENDERS, "32"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["cold"], "the process had imported web.tasks.memory before the threads sent"
    assert report["results"] == ["sent"] * 32
    sent = sorted(args for _task, args in sent_tasks(broker))
    assert sent == sorted(f"({i},)" for i in range(32))
    assert not TaskSendFailure.objects.exists()


@pytest.mark.django_db
def test_an_unknown_task_is_a_lookup_error_and_is_counted() -> None:
    with pytest.raises(LookupError, match="no.such.task"):
        enqueue("no.such.task", 1)
    with pytest.raises(LookupError):
        enqueue("no.such.task", 2)
    failure = TaskSendFailure.objects.get()
    assert (failure.task, failure.count) == ("no.such.task", 2)
    assert "LookupError" in failure.last_error
    assert 'agent_task_enqueue_failures_total{task="no.such.task"} 2.0' in metrics_exposition().decode()


@pytest.mark.django_db
def test_a_broker_that_refuses_is_counted_and_raised(monkeypatch: Any) -> None:
    from celery import current_app

    task = current_app.tasks["web.tasks.memory.write_turn_memories"]

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConnectionRefusedError("the broker is down")

    monkeypatch.setattr(task, "delay", refuse)
    with pytest.raises(ConnectionRefusedError):
        enqueue("web.tasks.memory.write_turn_memories", 7)
    failure = TaskSendFailure.objects.get()
    assert (failure.task, failure.count) == ("web.tasks.memory.write_turn_memories", 1)
    assert failure.last_error == "ConnectionRefusedError: the broker is down"


@pytest.mark.django_db
def test_the_queue_backlog_and_its_oldest_wait_are_in_the_metrics(settings: Any) -> None:
    import tempfile
    import time

    from celery import Celery, current_app

    from core import embedded_broker
    from core.queue import queue_stats

    assert "agent_queue_depth" not in metrics_exposition().decode()  # the tests' filesystem broker: no figure
    folder = Path(tempfile.mkdtemp(prefix="vk-"))
    try:
        url = embedded_broker.ensure_embedded_valkey(folder)
        sender = Celery("sender", broker=url, set_as_current=False)
        for _ in range(3):
            sender.send_task("web.tasks.core.record_worker_heartbeat", queue="backlog")
        time.sleep(0.3)
        stats = queue_stats(broker_url=url, queue="backlog")
        assert stats is not None and stats.depth == 3
        assert stats.oldest_seconds is not None and 0.3 <= stats.oldest_seconds < 60

        conf = current_app.conf
        before = {key: conf.get(key) for key in ("broker_url", "task_default_queue", "task_routes")}
        routes = {name: {"queue": "backlog-ops"} for name in settings.OPS_TASKS}
        conf.update(broker_url=url, task_default_queue="backlog", task_routes=routes)
        _drop_broker_connections(current_app)
        try:
            # Beat's tasks and recovery go on the queue of their own: not behind the backlog.
            enqueue("web.tasks.agents.recover_stuck_turns")
            text = metrics_exposition().decode()
        finally:
            conf.update(before)
            _drop_broker_connections(current_app)
        assert 'agent_queue_depth{queue="backlog"} 3.0' in text
        assert 'agent_queue_depth{queue="backlog-ops"} 1.0' in text
        assert 'agent_queue_oldest_seconds{queue="backlog"}' in text
    finally:
        embedded_broker.stop_embedded_valkey(folder)
