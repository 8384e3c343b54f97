"""The broker down while turns finish: the turns still succeed, and their background work — memory
writes and summaries — is not lost. The outbox sweep (``memory.services.memory_writes_requeue``,
``sessions.summaries.summaries_requeue``, run by beat) finds the work whose enqueue failed and sends it
again once the broker is back; a real worker then writes each turn's memories exactly once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents.models import Agent, LLMCall
from config.celery import app
from conftest import _drop_broker_connections, wait_for
from memory.models import Memory
from memory.services import memory_writes_requeue, turns_with_lost_memory_writes
from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import checkpoint_record, session_create
from sessions.summaries import summaries_requeue
from tests.reliability.conftest import free_port

NOW = timedelta(0)


@contextmanager
def broker_down() -> Iterator[str]:
    """Point the Celery app at a closed port (nothing listens there), then back at the real broker."""
    saved = {key: app.conf[key] for key in ("broker_url", "broker_transport_options")}
    dead = f"redis://127.0.0.1:{free_port()}/0"
    # Celery's default publish retries stay on: each failed enqueue gives up after about a second.
    app.conf.update(broker_url=dead, broker_transport_options={})
    _drop_broker_connections(app)
    try:
        yield dead
    finally:
        app.conf.update(saved)
        _drop_broker_connections(app)


def _episodes(session: ChatSession) -> int:
    return Memory.objects.filter(source_session=session, kind=Memory.Kind.EPISODIC).count()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_turns_succeed_with_the_broker_down_and_their_writes_happen_once_it_is_back(
    alice: Any, chat_agent: Agent, celery_worker: Any
) -> None:
    chat_agent.window_turns = 3
    chat_agent.save()
    session = session_create(user=alice, agent=chat_agent)
    messages = [f"Note {i}: my favourite city number {i} is Lisbon, and I like long train journeys." for i in range(4)]
    with broker_down():
        results = [turn_run(session=session, message=m) for m in messages]
        assert all(r.turn.status == Turn.Status.COMPLETED and r.reply for r in results)
        lost = set(turns_with_lost_memory_writes(older_than=NOW).values_list("pk", flat=True))
        assert lost == {r.turn.pk for r in results}
        # While it is still down the sweep sends nothing and loses nothing.
        assert memory_writes_requeue(older_than=NOW) == 0
        assert summaries_requeue(older_than=NOW) == 0
    session.refresh_from_db()
    assert session.summary_requested_seq > session.summary_through_seq == 0  # requested, never sent
    assert _episodes(session) == 0

    # The broker is back: the sweeps send the lost work and the worker does it.
    assert memory_writes_requeue(older_than=NOW) == len(messages)
    assert summaries_requeue(older_than=NOW) == 1
    log = celery_worker.log_text
    wait_for(lambda: _episodes(session) == len(messages), timeout=60, message=f"the memory writes:\n{log()[-3000:]}")
    wait_for(
        lambda: ChatSession.objects.get(pk=session.pk).summary_through_seq >= session.summary_requested_seq,
        timeout=60,
        message=f"the summary:\n{log()[-3000:]}",
    )
    assert ChatSession.objects.get(pk=session.pk).summary

    # Exactly once: a write now exists for every turn, so the next sweeps find nothing to send.
    wait_for(
        lambda: LLMCall.objects.filter(session=session, purpose="extract").count() == len(messages),
        message="the extraction records",
    )
    assert memory_writes_requeue(older_than=NOW) == 0
    assert summaries_requeue(older_than=NOW) == 0
    for result in results:
        assert Memory.objects.filter(source_turn=result.turn, kind=Memory.Kind.EPISODIC).count() == 1


@pytest.mark.django_db
def test_the_sweep_leaves_alone_what_is_not_a_lost_write(alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    old = timezone.now() - timedelta(minutes=10)

    def turn(seq: int, **fields: Any) -> Turn:
        values: dict[str, Any] = {
            "status": Turn.Status.COMPLETED,
            "assistant_message": "A reply.",
            "completed_at": old,
            **fields,
        }
        return Turn.objects.create(session=session, seq=seq, user_message=f"message {seq}", **values)

    lost = turn(1)
    too_recent = turn(2, completed_at=timezone.now())  # the normal enqueue may still be on its way
    too_old = turn(3, completed_at=timezone.now() - timedelta(days=3))
    failed = turn(4, status=Turn.Status.FAILED)
    written_then_deleted = turn(5, memories_written_at=old)  # the write committed; a user deleted the episode
    handed_off = turn(6)
    checkpoint_record(session=session, reason=Checkpoint.Reason.HANDOFF, turn=handed_off, detail="to a person")
    answered_by_nobody = turn(7, assistant_message="")
    # The write task called the model, then died before its commit (a soft time limit, retries run out): lost
    # too. (Taking its extraction call as the proof had left it lost for good.)
    died_after_extraction = turn(8, completed_at=old + timedelta(seconds=1))
    LLMCall.objects.create(
        session=session, turn=died_after_extraction, purpose="extract", provider="demo", model="x", outcome="ok"
    )
    assert {too_recent.pk, too_old.pk, failed.pk, answered_by_nobody.pk, written_then_deleted.pk}.isdisjoint(
        turns_with_lost_memory_writes().values_list("pk", flat=True)
    )
    assert list(turns_with_lost_memory_writes().values_list("pk", flat=True)) == [lost.pk, died_after_extraction.pk]


@pytest.mark.django_db
def test_a_sweep_sends_lost_work_once_a_window_not_once_a_run(alice: Any, chat_agent: Agent) -> None:
    """With the workers behind, what a sweep sent is still queued: the next runs must not add copies of it
    (a backlog that feeds itself). Once the window has passed it is sent again, in case that copy was lost
    too; an enqueue that fails is tried again by the next run."""
    session = session_create(user=alice, agent=chat_agent)
    old = timezone.now() - timedelta(minutes=10)
    turns = [
        Turn.objects.create(
            session=session,
            seq=seq,
            user_message=f"message {seq}",
            assistant_message="A reply.",
            status=Turn.Status.COMPLETED,
            completed_at=old,
        )
        for seq in (1, 2, 3)
    ]
    ChatSession.objects.filter(pk=session.pk).update(summary_requested_seq=3, updated_at=old)
    window = {"again_after": timedelta(seconds=1)}

    with broker_down():
        assert memory_writes_requeue(**window) == 0
        assert summaries_requeue(**window) == 0
    # The failed enqueues claimed nothing; at most ``limit`` a run, the next run goes past those sent.
    assert memory_writes_requeue(limit=2, **window) == 2
    assert memory_writes_requeue(limit=2, **window) == 1
    assert summaries_requeue(**window) == 1
    assert memory_writes_requeue(**window) == 0
    assert summaries_requeue(**window) == 0

    time.sleep(1.2)  # the window is over: still not written, so sent again
    assert memory_writes_requeue(**window) == len(turns)
    assert summaries_requeue(**window) == 1


@pytest.mark.django_db
def test_a_sweep_stopped_mid_enqueue_gives_its_claim_back(
    alice: Any, chat_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only a broker error: whatever stops the enqueue (a time limit, the worker shutting down) must not
    hold the claim for its window with nothing sent."""
    from web.tasks.memory import write_turn_memories

    session = session_create(user=alice, agent=chat_agent)
    Turn.objects.create(
        session=session,
        seq=1,
        user_message="message 1",
        assistant_message="A reply.",
        status=Turn.Status.COMPLETED,
        completed_at=timezone.now() - timedelta(minutes=10),
    )

    class Stopped(BaseException):
        pass

    def stopped(*args: Any, **kwargs: Any) -> None:
        raise Stopped

    with monkeypatch.context() as patch:
        patch.setattr(write_turn_memories, "delay", stopped)
        with pytest.raises(Stopped):
            memory_writes_requeue()
    assert memory_writes_requeue() == 1


@pytest.mark.django_db
def test_a_write_still_waiting_in_the_queue_is_not_sent_again(alice: Any, chat_agent: Agent) -> None:
    """With the workers behind, the sweep reads the queue: a write waiting there is a backlog, not lost work."""
    import tempfile
    from pathlib import Path

    import redis

    from core import embedded_broker
    from core.queue import enqueue
    from memory.services import WRITE_TASK

    session = session_create(user=alice, agent=chat_agent)
    old = timezone.now() - timedelta(minutes=10)
    waiting, lost = (
        Turn.objects.create(
            session=session, seq=seq, user_message="hi", status=Turn.Status.COMPLETED, assistant_message="A reply.",
            completed_at=old,
        )
        for seq in (1, 2)
    )  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="vk-"))
    saved = {key: app.conf[key] for key in ("broker_url", "broker_transport_options", "task_default_queue")}
    try:
        url = embedded_broker.ensure_embedded_valkey(folder)
        app.conf.update(broker_url=url, broker_transport_options={}, task_default_queue="behind")
        _drop_broker_connections(app)
        enqueue(WRITE_TASK, waiting.pk)  # sent after its turn, and no worker has taken it yet
        assert memory_writes_requeue(older_than=NOW) == 1  # the lost one only
        queue = redis.Redis(unix_socket_path=str(embedded_broker.socket_path(folder)))
        queued = sorted(json.loads(raw)["headers"]["argsrepr"] for raw in queue.lrange("behind", 0, -1))
        assert queued == sorted([f"({waiting.pk},)", f"({lost.pk},)"])
    finally:
        app.conf.update(saved)
        _drop_broker_connections(app)
        embedded_broker.stop_embedded_valkey(folder)
