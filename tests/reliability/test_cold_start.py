"""A fresh process serves its first burst correctly: nothing it needs is set up on first use by racing threads.

Celery's task discovery is not safe between threads (``core/queue.py``): on a cold web process the first
turns to finish together used to find the task registry empty, and their memory writes waited for the
outbox sweep. Here the web server starts as ``make run`` starts it (its gunicorn hooks, 2 processes x 8
threads) and 64 turns at once are its very first work.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.models import Agent
from core.models import TaskSendFailure
from memory.services import WRITE_TASK
from sessions.models import ChatSession, Turn
from sessions.services import session_create
from tests.reliability.conftest import api_token

pytestmark = pytest.mark.django_db(transaction=True)

PEOPLE = 64


def sent_tasks(broker: Path) -> Iterator[tuple[str, str]]:
    """(task name, its arguments as Celery wrote them) of every message in a filesystem broker's folder."""
    for path in sorted((broker / "out").glob("*.msg")):
        headers = json.loads(path.read_text())["headers"]
        yield headers["task"], headers["argsrepr"]


def test_a_cold_web_server_sends_every_memory_write_of_its_first_64_turns(
    django_user_model: Any, chat_agent: Agent, web_server: Any
) -> None:
    people = [
        django_user_model.objects.create_user(username=f"cold-{i}", password="cold-pass-123") for i in range(PEOPLE)
    ]
    chats = [(api_token(person), session_create(user=person, agent=chat_agent)) for person in people]
    server = web_server(workers=2, threads=8, as_make_run=True, env={"LOG_LEVEL": "INFO"})
    # Its start-up probes of /healthz answer 503 (no worker in this test), logged as errors: not the turns'.
    started = len(server.log_text())
    everyone_ready = threading.Barrier(PEOPLE)

    def chat(job: tuple[str, ChatSession]) -> httpx.Response:
        token, session = job
        with httpx.Client(base_url=server.url, timeout=120) as client:
            everyone_ready.wait()
            return client.post(
                f"/api/sessions/{session.pk}/messages/stream/",
                json={"message": "Hello! What can you do for me?"},
                headers={"Authorization": f"Token {token}", "Accept": "text/event-stream"},
            )

    with ThreadPoolExecutor(max_workers=PEOPLE) as pool:
        responses = list(pool.map(chat, chats))

    assert [r.status_code for r in responses] == [200] * PEOPLE
    assert all("event: done" in r.text for r in responses), [r.text[-300:] for r in responses if "done" not in r.text]
    turns = list(Turn.objects.filter(session__in=[session for _token, session in chats]))
    assert len(turns) == PEOPLE and {t.status for t in turns} == {Turn.Status.COMPLETED}
    # Each turn's memory write was sent once, on the first try: none left for the outbox sweep.
    writes = sorted(args for task, args in sent_tasks(server.log_dir / "broker") if task == WRITE_TASK)
    assert writes == sorted(f"({turn.pk},)" for turn in turns)
    assert list(TaskSendFailure.objects.values_list("task", "count")) == []
    during = server.log_text()[started:]
    errors = [line for line in during.splitlines() if " ERROR " in line or "Traceback" in line]
    assert errors == []
