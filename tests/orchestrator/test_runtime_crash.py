"""Crash recovery with a real process killed by SIGKILL between its checkpoint and its reply."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agents.models import Agent
from conftest import wait_for
from core.db import database_url
from orchestrator.runtime import stuck_turns_recover, turn_run
from sessions.locks import session_is_locked
from sessions.models import Checkpoint, Turn
from sessions.services import session_create
from tests.fakes.openai_server import hang

ROOT = Path(__file__).resolve().parents[2]


def _start_child(session_id: str, message: str, fake_openai: Any) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url(),
            "LLM_PROFILES_JSON": json.dumps({"default": fake_openai.profile(read_timeout=60.0, max_retries=0)}),
            "EMBEDDING_BACKEND": "hashing",
            "LOG_FORMAT": "plain",
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "tests.orchestrator.crash_child", session_id, message],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _kill_mid_call(session: Any, message: str, fake_openai: Any) -> Turn:
    """Start a turn in a child process, wait until it is inside the model call, SIGKILL it."""
    fake_openai.enqueue(hang(60))
    child = _start_child(str(session.pk), message, fake_openai)
    try:
        wait_for(
            lambda: fake_openai.chat_requests() or child.poll() is not None,
            timeout=60,
            message="the child's model call",
        )
        assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
        turn = Turn.objects.get(session=session)
        assert turn.status == Turn.Status.RUNNING
        assert Checkpoint.objects.filter(session=session, turn=turn, reason=Checkpoint.Reason.BEFORE_CALL).exists()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    # The dead process's heartbeat stopped: its turn lease runs out (TURN_LEASE_SECONDS, 5 s in the tests).
    wait_for(lambda: not session_is_locked(session.pk), timeout=30, message="the dead process's lock to be released")
    return turn


@pytest.mark.django_db(transaction=True)
def test_next_request_resumes_the_killed_turn_exactly_once(alice: Any, chat_agent: Agent, fake_openai: Any) -> None:
    session = session_create(user=alice, agent=chat_agent)
    killed = _kill_mid_call(session, "My name is Alice and I fly from Lisbon.", fake_openai)

    # The next request (this process: the demo model) finishes the orphaned turn first, then its own.
    result = turn_run(session=session, message="What did I just tell you?")

    assert [t.pk for t in result.recovered] == [killed.pk]
    turns = list(Turn.objects.filter(session=session).order_by("seq"))
    assert [t.user_message for t in turns] == ["My name is Alice and I fly from Lisbon.", "What did I just tell you?"]
    assert all(t.status == Turn.Status.COMPLETED and t.assistant_message for t in turns)
    # Exactly one reply per turn: running recovery again finds nothing to do.
    assert stuck_turns_recover(older_than=timedelta(0)) == 0
    assert Turn.objects.filter(session=session).count() == 2


@pytest.mark.django_db(transaction=True)
def test_periodic_sweep_resumes_a_killed_turn(alice: Any, chat_agent: Agent, fake_openai: Any) -> None:
    session = session_create(user=alice, agent=chat_agent)
    killed = _kill_mid_call(session, "Remember that I prefer aisle seats.", fake_openai)

    assert stuck_turns_recover(older_than=timedelta(0)) == 1
    killed.refresh_from_db()
    assert killed.status == Turn.Status.COMPLETED
    assert killed.assistant_message
    assert killed.user_message == "Remember that I prefer aisle seats."
    assert stuck_turns_recover(older_than=timedelta(0)) == 0
    reasons = list(Checkpoint.objects.filter(session=session, turn=killed).values_list("reason", flat=True))
    assert reasons.count(Checkpoint.Reason.BEFORE_CALL) >= 2  # the killed attempt's and the resumed one's
