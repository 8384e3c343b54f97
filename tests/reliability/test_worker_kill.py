"""A Celery worker killed with SIGKILL in the middle of a memory write (blocked in the embedding call):
the task is acknowledged late, so the broker delivers it again to the next worker, and the write is
idempotent — the turn's episodic memory is written exactly once. Needs Redis (the filesystem broker
forgets a message once it is read)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.models import Agent
from config.celery import app
from conftest import _drop_broker_connections, wait_for
from core.db import database_url
from memory.models import Memory
from orchestrator.runtime import turn_run
from sessions.models import Turn
from sessions.services import session_create
from tests.fakes.openai_server import EMBEDDINGS_PATH, embeddings, fake_vector, hang
from tests.reliability.conftest import ROOT, redis_queue_url, unique_queue
from web.tasks.memory import write_turn_memories


class Worker:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.reliability.worker_main", "--pool", "prefork", "--concurrency", "1"]
                + ["--loglevel", "INFO", "-Q", f"{env['CELERY_QUEUE']},{env['CELERY_QUEUE']}-ops"]
                + ["--without-gossip", "--without-mingle"]
                + ["--hostname", f"{env['CELERY_QUEUE']}-{log.stat().st_size}@%h"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: "ready." in self.text() or self.proc.poll() is not None, timeout=60, message="worker start")
        assert self.proc.poll() is None, self.text()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the main process and its pool child, no goodbyes
            self.proc.wait(timeout=10)


@pytest.fixture
def redis_queue() -> Iterator[tuple[str, str]]:
    url, queue = redis_queue_url(), unique_queue()
    saved = {key: app.conf[key] for key in ("broker_url", "broker_transport_options", "task_default_queue")}
    app.conf.update(broker_url=url, broker_transport_options={"visibility_timeout": 3}, task_default_queue=queue)
    _drop_broker_connections(app)
    yield url, queue
    app.conf.update(saved)
    _drop_broker_connections(app)
    import redis

    client = redis.Redis.from_url(url)
    client.delete(queue)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_write_leaves_exactly_one_memory(
    alice: Any, chat_agent: Agent, fake_openai: Any, redis_queue: tuple[str, str], tmp_path: Path
) -> None:
    url, queue = redis_queue
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "CELERY_BROKER_URL": url,
            "CELERY_QUEUE": queue,
            # The embedder is a remote endpoint (the fake server): it can be made to hang mid-task.
            "EMBEDDING_BACKEND": "openai",
            "EMBEDDING_BASE_URL": fake_openai.base_url,
            "EMBEDDING_MODEL": "fake-embedding",
            "EMBEDDING_TIMEOUT": "120",
            "LOG_FORMAT": "plain",
        }
    )
    env.pop("LLM_PROFILES_JSON", None)
    log = tmp_path / "worker.log"
    log.touch()
    fake_openai.enqueue(hang(120, then=embeddings([fake_vector("late", 384)])))

    first = Worker(env, log)
    try:
        session = session_create(user=alice, agent=chat_agent)
        result = turn_run(session=session, message="My name is Alice and my home airport is Lisbon.")
        assert result.turn.status == Turn.Status.COMPLETED
        # The task is running: the worker is blocked in the embedding request.
        wait_for(
            lambda: any(r.path == EMBEDDINGS_PATH for r in fake_openai.requests),
            timeout=60,
            message=f"the embedding call:\n{first.text()[-3000:]}",
        )
    finally:
        first.kill()
    assert first.proc.returncode == -signal.SIGKILL
    episodes = Memory.objects.filter(source_turn=result.turn, kind=Memory.Kind.EPISODIC)
    assert not episodes.exists()  # killed before its transaction: nothing half-written

    second = Worker(env, log)
    try:
        wait_for(episodes.exists, timeout=90, message=f"the redelivered task:\n{second.text()[-3000:]}")
        # Delivered once more on purpose (a duplicate, as at-least-once delivery may produce): no second row.
        write_turn_memories.delay(result.turn.pk)
        wait_for(
            lambda: second.text().count("succeeded") >= 2,
            timeout=60,
            message=f"the duplicate task:\n{second.text()[-3000:]}",
        )
    finally:
        second.kill()
    assert episodes.count() == 1
    assert sum(1 for r in fake_openai.requests if r.path == EMBEDDINGS_PATH) == 2  # killed once, done once
    assert "'written': False" in second.text() or '"written": False' in second.text()
