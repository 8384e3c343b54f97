"""The remote model misbehaving, through the OpenAI-compatible provider against a real local HTTP fake:
hangs past the read timeout, 429 and 500 bursts (shorter and longer than the retry budget), replies cut
off mid-stream, and malformed structured output. Each time the turn either succeeds after retries or
fails cleanly — the message saved, the failure recorded and counted — and the next turn succeeds."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent, LLMCall
from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import session_create
from tests.fakes.openai_server import error, hang, json_reply, reply, stream

pytestmark = pytest.mark.django_db


def _assert_failed_cleanly(session: ChatSession, turn: Turn, message: str) -> None:
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED
    assert turn.user_message == message  # the message is never lost
    assert turn.error and turn.assistant_message  # why, and what the user was told
    session.refresh_from_db()
    assert session.retry_count == 1
    assert Checkpoint.objects.filter(session=session, turn=turn, reason=Checkpoint.Reason.BEFORE_CALL).exists()


def _next_turn_succeeds(session: ChatSession, remote_model: Any, *, seq: int) -> Turn:
    remote_model.enqueue(stream("All good now."))
    result = turn_run(session=session, message="Are you back?")
    assert result.turn.status == Turn.Status.COMPLETED, result.turn.error
    assert result.turn.seq == seq
    assert result.reply == "All good now."
    session.refresh_from_db()
    assert session.retry_count == 0  # a success resets the failure count
    return result.turn


def test_a_hanging_model_times_out_and_the_next_turn_succeeds(alice: Any, chat_agent: Agent, remote_model: Any) -> None:
    session = session_create(user=alice, agent=chat_agent)
    remote_model.enqueue(*(hang(10) for _ in range(3)))  # the first call and both retries hang
    result = turn_run(session=session, message="Hello?")
    _assert_failed_cleanly(session, result.turn, "Hello?")
    assert "timeout" in result.turn.error.lower() or "timed out" in result.turn.error.lower(), result.turn.error
    call = LLMCall.objects.get(turn=result.turn, purpose="reply")
    assert call.outcome == "timeout" and call.retries == 2
    assert len(remote_model.chat_requests()) == 3
    _next_turn_succeeds(session, remote_model, seq=2)


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_short_error_burst_is_retried_and_the_turn_succeeds(
    status: int, alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    session = session_create(user=alice, agent=chat_agent)
    remote_model.enqueue(error(status, headers={"Retry-After": "0"}), error(status), stream("Made it."))
    result = turn_run(session=session, message="Hi")
    assert result.turn.status == Turn.Status.COMPLETED, result.turn.error
    assert result.reply == "Made it."
    call = LLMCall.objects.get(turn=result.turn, purpose="reply")
    assert (call.outcome, call.retries) == ("ok", 2)


@pytest.mark.parametrize("status", [429, 500])
def test_a_burst_longer_than_the_retries_fails_the_turn_cleanly(
    status: int, alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    session = session_create(user=alice, agent=chat_agent)
    remote_model.enqueue(*(error(status) for _ in range(3)))
    result = turn_run(session=session, message="Hi")
    _assert_failed_cleanly(session, result.turn, "Hi")
    call = LLMCall.objects.get(turn=result.turn, purpose="reply")
    assert call.outcome != "ok" and call.retries == 2
    assert remote_model.pending() == 0  # exactly 1 + 2 retries, no more
    _next_turn_succeeds(session, remote_model, seq=2)


def test_a_client_error_is_not_retried(alice: Any, chat_agent: Agent, remote_model: Any) -> None:
    session = session_create(user=alice, agent=chat_agent)
    remote_model.enqueue(error(400, "bad request"), stream("never reached"))
    result = turn_run(session=session, message="Hi")
    _assert_failed_cleanly(session, result.turn, "Hi")
    assert len(remote_model.chat_requests()) == 1
    assert remote_model.pending() == 1


@pytest.mark.parametrize(
    "cut",
    [
        stream("This answer never", finish_reason=None),  # [DONE] without a finish reason
        stream("This answer is dropped mid way through", cut_after=4),  # the connection dies
    ],
    # (A reply cut by the token limit is continued instead: tests/orchestrator/test_long_replies.py.)
    ids=["no-finish-reason", "connection-dropped"],
)
def test_a_reply_cut_off_is_not_used_and_the_next_turn_succeeds(
    cut: Any, alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    session = session_create(user=alice, agent=chat_agent)
    remote_model.enqueue(cut)
    result = turn_run(session=session, message="Tell me everything.")
    _assert_failed_cleanly(session, result.turn, "Tell me everything.")
    # The partial text is never stored as if it were the answer.
    assert "This answer" not in result.turn.assistant_message
    _next_turn_succeeds(session, remote_model, seq=2)


def test_malformed_decisions_change_no_state_and_a_valid_one_does(
    alice: Any, booking_agent: Agent, remote_model: Any, settings: Any
) -> None:
    # The separate decision call and its repair attempt (inside the reply's call: tests/orchestrator/test_one_call_workflow.py).
    settings.TURN_DECISION_IN_REPLY = False
    session = session_create(user=alice, agent=booking_agent)
    # The decision call answers garbage, then (the repair attempt) JSON of the wrong shape.
    remote_model.enqueue(
        reply('{"next_state": "GATHERING_DEST'),
        json_reply({"state": "COMPLETED", "slots": "London"}),
        stream("Where would you like to fly from?"),
    )
    result = turn_run(session=session, message="I want to fly from London to Paris")
    assert result.turn.status == Turn.Status.COMPLETED, result.turn.error  # the reply still asks again
    session.refresh_from_db()
    assert (session.state, session.data, session.retry_count) == ("IDLE", {}, 1)
    outcomes = list(LLMCall.objects.filter(turn=result.turn, purpose="slots").values_list("outcome", flat=True))
    assert sorted(outcomes) == ["invalid_output", "invalid_output"]

    remote_model.enqueue(
        json_reply(
            {
                "next_state": "GATHERING_DATES",
                "slots": {"origin": "London", "destination": "Paris"},
                "confidence": 0.95,
                "reasoning": "both given",
            }
        ),
        stream("When do you want to travel?"),
    )
    result = turn_run(session=session, message="From London to Paris, please")
    session.refresh_from_db()
    assert session.state == "GATHERING_DATES"
    assert session.data == {"origin": "London", "destination": "Paris"}


def test_an_illegal_transition_from_the_model_is_refused(
    alice: Any, booking_agent: Agent, remote_model: Any, settings: Any
) -> None:
    """Valid JSON, wrong move: the workflow, not the model, decides which transitions exist (the separate decision
    call here; inside the reply's call: tests/orchestrator/test_one_call_workflow.py)."""
    settings.TURN_DECISION_IN_REPLY = False
    session = session_create(user=alice, agent=booking_agent)
    remote_model.enqueue(
        json_reply(
            {
                "next_state": "COMPLETED",
                "slots": {"booking_reference": "FAKE-1234"},
                "confidence": 1.0,
                "reasoning": "the user says it is booked",
            }
        ),
        stream("Let's start with where you fly from."),
    )
    result = turn_run(session=session, message="Mark my booking as COMPLETED with reference FAKE-1234.")
    assert result.turn.status == Turn.Status.COMPLETED
    session.refresh_from_db()
    assert session.state == "IDLE"
    assert "booking_reference" not in session.data
    assert Checkpoint.objects.filter(session=session, reason=Checkpoint.Reason.INVALID_TRANSITION).exists()
