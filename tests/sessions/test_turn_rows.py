"""The statements a turn is written with (``sessions.services``): the turn and its checkpoint in one insert, the
fence that keeps a finished turn from being written twice, the completing statement under the lease, and the
one hand-off every door and the turn share."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError
from django.utils import timezone

from agents.call_records import llm_calls_json
from agents.models import LLMCall
from sessions.locks import SessionTurnLock
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import (
    session_hand_back,
    session_hand_off,
    turn_complete_write,
    turn_insert,
    turn_insert_with_checkpoint,
    turn_staff_reply_append,
    turn_write_unfinished,
)
from tests.world import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(alice: Any) -> ChatSession:
    agent = make_agent(name="Rows", slug="rows", system_prompt="x", workflow="free_chat")
    return ChatSession.objects.create(user=alice, agent=agent, workflow="free_chat", state="CHATTING")


def _new_turn(session: ChatSession, seq: int = 1, key: str | None = None) -> Turn:
    return Turn(
        session=session, seq=seq, user_message=f"message {seq}", idempotency_key=key, status=Turn.Status.RUNNING
    )


def test_a_new_turn_goes_in_with_its_checkpoint_and_the_sessions_first_title(session: ChatSession) -> None:
    turn = _new_turn(session)
    assert turn_insert_with_checkpoint(turn=turn, title="First words") is True
    assert turn.pk is not None and not turn._state.adding
    assert Turn.objects.get(pk=turn.pk).user_message == "message 1"
    (checkpoint,) = Checkpoint.objects.filter(session=session)
    assert (checkpoint.turn_id, checkpoint.reason, checkpoint.state) == (
        turn.pk,
        Checkpoint.Reason.BEFORE_CALL,
        "CHATTING",
    )
    assert ChatSession.objects.get(pk=session.pk).title == "First words"
    # A title is the first one only; a second turn keeps it.
    assert turn_insert_with_checkpoint(turn=_new_turn(session, 2), title="Other words") is True
    assert ChatSession.objects.get(pk=session.pk).title == "First words"
    assert list(Checkpoint.objects.filter(session=session).values_list("seq", flat=True).order_by("seq")) == [1, 2]


def test_a_turn_whose_checkpoint_number_was_taken_goes_in_with_the_same_rows(
    session: ChatSession, monkeypatch: Any
) -> None:
    """When the one statement cannot take the checkpoint's number (a staff action took it meanwhile: it says
    False and writes nothing), ``turn_insert`` writes the same rows in a transaction of a few."""
    import sessions.services.turn_rows as turn_rows

    monkeypatch.setattr(turn_rows, "turn_insert_with_checkpoint", lambda *, turn, title: False)
    turn = _new_turn(session)
    turn_insert(turn=turn, title="First words")
    assert Turn.objects.get(pk=turn.pk).user_message == "message 1"
    (checkpoint,) = Checkpoint.objects.filter(session=session)
    assert (checkpoint.turn_id, checkpoint.reason) == (turn.pk, Checkpoint.Reason.BEFORE_CALL)
    assert ChatSession.objects.get(pk=session.pk).title == "First words"


def test_staff_replies_are_appended_each_in_one_statement(session: ChatSession) -> None:
    turn = Turn.objects.create(session=session, seq=1, user_message="hi", status=Turn.Status.COMPLETED)
    stale = Turn.objects.get(pk=turn.pk)  # a second staff member's copy, read before the first reply
    before = ChatSession.objects.get(pk=session.pk).updated_at
    turn_staff_reply_append(session=session, turn=turn, reply={"author": "Sam", "text": "one"}, signed="[Sam] one")
    turn_staff_reply_append(session=session, turn=stale, reply={"author": "Kim", "text": "two"}, signed="[Kim] two")
    fresh = Turn.objects.get(pk=turn.pk)
    assert fresh.assistant_message == "[Sam] one\n\n[Kim] two"
    assert [r["text"] for r in fresh.staff_replies] == ["one", "two"]
    assert ChatSession.objects.get(pk=session.pk).updated_at > before


def test_a_second_turn_under_the_same_key_is_refused_and_writes_nothing(session: ChatSession) -> None:
    assert turn_insert_with_checkpoint(turn=_new_turn(session, 1, key="k-1"), title="") is True
    with pytest.raises(IntegrityError):
        turn_insert_with_checkpoint(turn=_new_turn(session, 2, key="k-1"), title="")
    assert Turn.objects.filter(session=session).count() == 1
    assert Checkpoint.objects.filter(session=session).count() == 1


def test_the_fence_writes_an_unfinished_turn_once(session: ChatSession) -> None:
    turn = Turn.objects.create(session=session, seq=1, user_message="hi", status=Turn.Status.RUNNING)
    assert turn_write_unfinished(turn=turn, status=Turn.Status.COMPLETED, assistant_message="first") is True
    assert turn.assistant_message == "first"
    assert turn_write_unfinished(turn=turn, status=Turn.Status.FAILED, assistant_message="second") is False
    turn.refresh_from_db()
    assert (turn.status, turn.assistant_message) == (Turn.Status.COMPLETED, "first")


def _complete(session: ChatSession, turn: Turn, owner: Any) -> Any:
    fields = {"status": Turn.Status.COMPLETED, "assistant_message": "the reply", "steps": 1}
    fields |= {"retrieval": {"items": []}, "prompt_tokens": 12, "composition": {"steps": 1}}
    call = LLMCall(purpose="reply", provider="p", model="m", outcome="ok", turn_id=turn.pk, created_at=timezone.now())
    return turn_complete_write(
        session_id=session.pk,
        turn_id=turn.pk,
        lease_owner=str(owner),
        fields=fields,
        calls_json=llm_calls_json([call]),
        resets_failures=True,
        now=timezone.now(),
    )


def test_completing_needs_the_lease_and_writes_the_turn_its_calls_and_the_session_at_once(session: ChatSession) -> None:
    turn = Turn.objects.create(session=session, seq=1, user_message="hi", status=Turn.Status.RUNNING)
    ChatSession.objects.filter(pk=session.pk).update(retry_count=2)
    lock = SessionTurnLock(session.pk)
    assert lock.try_acquire()
    stranger = _complete(session, turn, "00000000-0000-0000-0000-000000000001")
    assert (stranger.held, stranger.completed) == (False, False)
    assert Turn.objects.get(pk=turn.pk).status == Turn.Status.RUNNING

    written = _complete(session, turn, lock.owner)
    assert (written.held, written.completed) == (True, True)
    state, status, _version, retry_count, _updated_at, _data = written.session_row
    assert (state, status, retry_count) == ("CHATTING", ChatSession.Status.ACTIVE, 0)
    turn.refresh_from_db()
    assert (turn.status, turn.assistant_message, turn.prompt_tokens, turn.state_after) == (
        Turn.Status.COMPLETED,
        "the reply",
        12,
        "CHATTING",
    )
    assert turn.llm_calls.count() == 1
    # Finished: a second completion writes nothing, not even its calls.
    again = _complete(session, turn, lock.owner)
    assert (again.held, again.completed) == (True, False)
    assert turn.llm_calls.count() == 1
    lock.release()


def test_a_session_is_handed_off_once_and_back(session: ChatSession) -> None:
    turn = Turn.objects.create(session=session, seq=1, user_message="hi", status=Turn.Status.RUNNING)
    assert session_hand_off(session=session, turn=turn, detail="the workflow said so") is True
    assert session.status == ChatSession.Status.NEEDS_HUMAN
    assert session_hand_off(session=session, detail="staff, again") is False
    handoffs = Checkpoint.objects.filter(session=session, reason=Checkpoint.Reason.HANDOFF)
    assert [(c.turn_id, c.detail) for c in handoffs] == [(turn.pk, "the workflow said so")]

    ChatSession.objects.filter(pk=session.pk).update(retry_count=3)
    session_hand_back(session=session, actor="staff-1")
    assert (session.status, session.retry_count) == (ChatSession.Status.ACTIVE, 0)
    resume = Checkpoint.objects.get(session=session, reason=Checkpoint.Reason.RESUME)
    assert resume.detail == "handoff resumed by staff-1"
