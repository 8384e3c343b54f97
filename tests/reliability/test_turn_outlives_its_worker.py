"""A turn outlives any one process (issue "A turn outlives any one process"): a turn whose turn worker stopped and
died with the turn queued runs again within a minute of the death, its stream keeps alive meanwhile and a retry
under the same key gets the settled turn; a stalled embedder slows turns and fails none; ``/healthz`` names
exactly the part that is down.

Real processes, as ``make run`` runs them: the ASGI web server, a turn worker (``-Q <queue>-turns -P threads``),
a background worker with beat on a thread (``-Q <queue>,<queue>-ops``: the sweep), the embedding service
(``manage.py serve_embeddings``, serving the hashing embedder so that no model loads), Redis or an embedded
Valkey for the broker and the run channel, and the fake OpenAI server for the model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.utils.timezone import now as timezone_now

from agents.models import Agent, LLMCall
from conftest import wait_for
from core import embedded_broker
from sessions.models import ChatSession, Turn
from sessions.services import session_create
from tests.fakes.openai_server import FakeOpenAIServer, stream
from tests.reliability.conftest import ROOT, ServerProcess, api_token, redis_queue_url, server_env, unique_queue
from tests.reliability.test_turn_runs import TurnWorker, _events

pytestmark = pytest.mark.django_db(transaction=True)

# Short clocks, so that a test sees in seconds what make run's defaults do in tens of seconds.
FAST = {
    "TURN_LEASE_SECONDS": "3",
    "TURN_SWEEP_SECONDS": "1",
    "TURN_CLAIM_SECONDS": "3",
    "STUCK_TURN_SECONDS": "0",
    "RUN_EVENTS_KEEPALIVE_SECONDS": "1",
    "WORKER_HEARTBEAT_SECONDS": "1",
    "HEALTH_CHECK_TIMEOUT": "1.0",
    "HEALTH_REFRESH_SECONDS": "0.25",
}


class Process:
    """A child process in a process group of its own: ``stop()`` (SIGSTOP), ``resume()``, ``kill()`` (SIGKILL)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, *, ready: str) -> None:
        self.argv, self.env, self.log, self.ready = argv, env, log, ready
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_for(lambda: self.ready in self.log.read_text(errors="replace"), timeout=60, message=self.argv[3])
        return self

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def end(self) -> None:
        self.resume()
        self._signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def background_worker(env: dict[str, str], folder: Path) -> Process:
    queue = env["CELERY_QUEUE"]
    argv = [
        *(sys.executable, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO"),
        *("-Q", f"{queue},{queue}-ops", "--pool", "threads", "--concurrency", "4", "--beat-thread"),
        *("--schedule-filename", str(folder / "beat-schedule")),
        *("--hostname", f"background-{queue}@%h", "--without-gossip", "--without-mingle"),
    ]
    return Process(argv, env, folder / "background.log", ready=" ready.")


def embedding_service(env: dict[str, str], socket_path: Path, folder: Path) -> Process:
    argv = [sys.executable, str(ROOT / "manage.py"), "serve_embeddings", "--hashing", "--socket", str(socket_path)]
    service = Process(argv, env, folder / "embedder.log", ready="")
    service.start()
    wait_for(socket_path.exists, timeout=60, message="the embedding service's socket")
    return service


class Stack:
    def __init__(self, web: ServerProcess, turns: TurnWorker, background: Process, embedder: Process | None) -> None:
        self.web, self.turns, self.background, self.embedder = web, turns, background, embedder

    @property
    def url(self) -> str:
        return self.web.url

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/healthz", timeout=10).json())


@pytest.fixture
def stack(tmp_path: Path, fake_openai: FakeOpenAIServer) -> Iterator[Any]:
    """A factory: ``stack(broker_url=..., embedder=True)`` starts the whole stack on one queue and channel."""
    started: list[Stack] = []

    def make(*, broker_url: str | None = None, embedder: bool = False, env: dict[str, str] | None = None) -> Stack:
        url = broker_url or redis_queue_url()
        full = server_env(tmp_path, llm_profile=fake_openai.profile(read_timeout=30.0, max_retries=0))
        full.pop("CELERY_FILESYSTEM_BROKER_DIR", None)
        full.update({"TURN_RUNNER": "worker", "CELERY_BROKER_URL": url, "RUN_EVENTS_URL": url})
        full.update({"CELERY_QUEUE": unique_queue(), "DATABASE_POOL_MAX_SIZE": "4", "LOG_LEVEL": "INFO", **FAST})
        full.update(env or {})
        service = None
        if embedder:
            socket_path = Path(f"/tmp/embedder-{uuid.uuid4().hex[:8]}.sock")  # short: a socket path has a limit
            service = embedding_service(full, socket_path, tmp_path)
            full.update({"EMBEDDING_BACKEND": "sentence-transformers", "EMBEDDING_SERVICE_SOCKET": str(socket_path)})
        web = ServerProcess(env=full, log_dir=tmp_path, workers=1, asgi=True).start()
        turns = TurnWorker(full, tmp_path / "turns.log").start()
        background = background_worker(full, tmp_path).start()
        built = Stack(web, turns, background, service)
        started.append(built)
        return built

    yield make
    for built in started:
        built.turns.stop()
        built.background.end()
        built.web.stop()
        if built.embedder is not None:
            built.embedder.end()


def _chat(django_user_model: Any, agent: Agent, name: str) -> tuple[str, ChatSession]:
    person = django_user_model.objects.create_user(username=name, password="outlive-pass-123")
    return api_token(person), session_create(user=person, agent=agent)


def _post_stream(url: str, token: str, session: ChatSession, message: str, key: str) -> tuple[int, list[str]]:
    headers = {"Authorization": f"Token {token}", "Accept": "text/event-stream", "Idempotency-Key": key}
    with httpx.stream(
        "POST",
        f"{url}/api/sessions/{session.pk}/messages/stream/",
        json={"message": message},
        headers=headers,
        timeout=httpx.Timeout(10.0, read=30.0),  # a stream silent for 30 s fails the test
    ) as response:
        return response.status_code, list(response.iter_lines())


def test_a_turn_queued_on_a_stopped_then_killed_turn_worker_runs_within_a_minute_of_its_death(
    django_user_model: Any, chat_agent: Agent, fake_openai: FakeOpenAIServer, stack: Any
) -> None:
    """The fault probe's case 1: ``kill -STOP`` the turn worker, send a message, ``kill -9`` the worker 3 s later. The
    turn's task went to a process that will never run it (before: the turn stayed "running" for ~20 minutes, its
    stream silent). Now the sweep finds the hand-over that no worker claimed within TURN_CLAIM_SECONDS and whose
    task waits in no queue, and hands the turn to a turn worker again: with make run's clocks within
    TURN_CLAIM_SECONDS + TURN_SWEEP_SECONDS (20 s) of the message. The client's stream gets keep-alives while it
    waits, then the reply; the same key again gets the settled turn; the model was asked once."""
    fake_openai.enqueue(stream("Answered although the worker died."))
    running = stack()
    token, session = _chat(django_user_model, chat_agent, "outlived")
    key = f"k-{uuid.uuid4().hex}"
    assert running.turns.proc is not None
    os.killpg(running.turns.proc.pid, signal.SIGSTOP)
    outcome: dict[str, Any] = {}
    client = threading.Thread(
        target=lambda: outcome.update(
            zip(
                ("status", "lines"), _post_stream(running.url, token, session, "Are you still there?", key), strict=True
            )
        )
    )
    client.start()
    wait_for(lambda: Turn.objects.filter(session=session).exists(), timeout=30, message="the accepted turn")
    time.sleep(3)
    running.turns.kill()
    died = time.monotonic()
    running.turns.start()  # what make run's supervisor does, a second later
    # The stopped worker had taken the task off the queue: the new worker never sees it. Only the sweep can find the
    # turn (a hand-over never claimed, its task in no queue); it hands it to the new turn worker.
    client.join(90)

    assert not client.is_alive(), "the stream never ended"
    ended = time.monotonic()
    turn = Turn.objects.get(session=session)
    assert (turn.status, turn.assistant_message) == (Turn.Status.COMPLETED, "Answered although the worker died.")
    assert ended - died <= 60, f"the turn ended {ended - died:.0f} s after its worker died"
    lines: list[str] = outcome["lines"]
    assert outcome["status"] == 200
    assert any(line.startswith(": keep-alive") for line in lines), "the waiting stream was silent"
    events = [event for _id, event in _events(iter(lines))]
    assert events[-1]["type"] == "done" and events[-1]["reply"] == "Answered although the worker died."
    # Asked once for the reply: not once per worker (the background worker's memory write asks too).
    assert LLMCall.objects.filter(turn=turn, purpose="reply").count() == 1

    status, again = _post_stream(running.url, token, session, "Are you still there?", key)
    replayed = [event for _id, event in _events(iter(again))]
    assert status == 200 and replayed[-1]["type"] == "done" and replayed[-1]["replayed"] is True
    assert replayed[-1]["reply"] == "Answered although the worker died."
    assert Turn.objects.filter(session=session).count() == 1
    assert LLMCall.objects.filter(turn=turn, purpose="reply").count() == 1


def test_a_retry_under_the_key_of_a_running_turn_follows_it_instead_of_being_told_busy(
    django_user_model: Any, chat_agent: Agent, fake_openai: FakeOpenAIServer, stack: Any
) -> None:
    fake_openai.enqueue(stream("one two three four five six", chunk_delay=0.5))
    running = stack()
    token, session = _chat(django_user_model, chat_agent, "retrier")
    key = f"k-{uuid.uuid4().hex}"
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_post_stream, running.url, token, session, "Count, slowly.", key)
        wait_for(lambda: len(fake_openai.chat_requests()) >= 1, timeout=30, message="the model call")
        second = pool.submit(_post_stream, running.url, token, session, "Count, slowly.", key)
        (status1, lines1), (status2, lines2) = first.result(60), second.result(60)
    assert (status1, status2) == (200, 200)
    done1 = [e for _i, e in _events(iter(lines1))][-1]
    done2 = [e for _i, e in _events(iter(lines2))][-1]
    assert (
        done1["type"] == done2["type"] == "done" and done1["reply"] == done2["reply"] == "one two three four five six"
    )
    turn = Turn.objects.get(session=session)
    assert LLMCall.objects.filter(turn=turn, purpose="reply").count() == 1


def test_healthz_names_exactly_the_part_that_is_down(
    django_user_model: Any, tmp_path: Path, fake_openai: FakeOpenAIServer, stack: Any
) -> None:
    """One part at a time: the turn worker stopped, the background worker killed, the embedding service stopped,
    the broker stopped; each time ``down`` is that part alone, and the stack is whole again after it. (PostgreSQL
    stopped: tests/reliability/test_health_truth.py.)"""
    folder = Path(f"/tmp/valkey-{uuid.uuid4().hex[:8]}")  # its own broker, to stop
    broker_url = embedded_broker.ensure_embedded_valkey(folder)
    try:
        running = stack(broker_url=broker_url, embedder=True)

        def down() -> list[str]:
            return list(running.health()["down"])

        wait_for(lambda: down() == [], timeout=30, message="every part up")
        assert running.health()["turn_worker"]["ok"] is True and running.health()["embedder"]["ok"] is True

        assert running.turns.proc is not None
        os.killpg(running.turns.proc.pid, signal.SIGSTOP)
        wait_for(lambda: down() == ["turn_worker"], timeout=30, message="the turn worker named")
        os.killpg(running.turns.proc.pid, signal.SIGCONT)
        wait_for(lambda: down() == [], timeout=30, message="the turn worker back")

        running.background.kill()
        wait_for(lambda: down() == ["worker"], timeout=30, message="the background worker named")
        running.background.start()
        wait_for(lambda: down() == [], timeout=60, message="the background worker back")

        assert running.embedder is not None
        running.embedder.stop()
        wait_for(lambda: down() == ["embedder"], timeout=30, message="the embedder named")
        running.embedder.resume()
        wait_for(lambda: down() == [], timeout=30, message="the embedder back")

        embedded_broker.stop_embedded_valkey(folder)
        wait_for(lambda: "broker" in down(), timeout=30, message="the broker named")
        stopped = running.health()
        assert stopped["down"] == ["broker"], stopped
        assert stopped["database"]["ok"] is True and stopped["embedder"]["ok"] is True
    finally:
        embedded_broker.stop_embedded_valkey(folder)


@pytest.mark.slow
def test_an_embedder_stopped_for_40_s_under_20_chats_slows_turns_and_fails_none(
    django_user_model: Any, stack: Any
) -> None:
    """The fault probe's case 2: ``kill -STOP`` the embedding service for 40 s while 20 people chat. No turn fails
    (before: 24 of 240, and the log full of "couldn't get a connection after 30 sec": turns held their database
    connections while they waited on the embedder); every turn that ran meanwhile says in its record that it
    searched memories by words alone; ``/healthz`` names the embedder while it is stopped, and only it."""
    agent = Agent.objects.create(slug="stall-demo", name="Stall demo", endpoint="demo", system_prompt="Be brief.")
    running = stack(embedder=True, env={"EMBEDDING_QUERY_WAIT": "2", "DATABASE_POOL_MAX_SIZE": "3"})
    chats = [_chat(django_user_model, agent, f"stall-{n}") for n in range(20)]
    stop_at, resume_at, finish_at = time.monotonic() + 5, time.monotonic() + 45, time.monotonic() + 55
    statuses: list[int] = []
    named: list[list[str]] = []

    def chat(job: tuple[str, ChatSession]) -> None:
        token, session = job
        n = 0
        while time.monotonic() < finish_at:
            n += 1
            response = httpx.post(
                f"{running.url}/api/sessions/{session.pk}/messages/",
                json={"message": f"Message {n}: I like sailing and my cat is called Pixel."},
                headers={"Authorization": f"Token {token}"},
                timeout=120,
            )
            statuses.append(response.status_code)

    with ThreadPoolExecutor(len(chats)) as pool:
        futures = [pool.submit(chat, job) for job in chats]
        time.sleep(max(0.0, stop_at - time.monotonic()))
        assert running.embedder is not None
        running.embedder.stop()
        stopped_at = timezone_now()
        try:
            while time.monotonic() < resume_at:
                named.append(list(running.health()["down"]))
                time.sleep(2)
        finally:
            running.embedder.resume()
        resumed_at = timezone_now()
        for future in futures:
            future.result(timeout=180)

    turns = Turn.objects.filter(session__agent=agent)
    assert statuses and set(statuses) == {201}, sorted(set(statuses))
    assert not turns.filter(status=Turn.Status.FAILED).exists()
    assert turns.count() == len(statuses) and not turns.exclude(status=Turn.Status.COMPLETED).exists()
    # The turns that began well inside the stall (after the first waits ran out) searched by words, and say so.
    inside = turns.filter(
        started_at__gt=stopped_at + timedelta(seconds=5), started_at__lt=resumed_at - timedelta(seconds=3)
    )
    assert inside.count() >= 20
    assert all("words only" in str(turn.retrieval.get("degraded", "")) for turn in inside), [
        (turn.pk, turn.retrieval.get("degraded")) for turn in inside
    ]
    assert ["embedder"] in named and all(down in ([], ["embedder"]) for down in named), named
