"""Durable workflow state: transitions, optimistic concurrency, retries → FAILED, reset, resume, recovery."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.django import TestCase as HypothesisTestCase

from agents.models import Agent
from agents.workflows import MAX_RETRIES
from examples.booking.workflow import FLIGHT_BOOKING as WF
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.selectors import last_good_checkpoint, session_failure_message, turn_checkpoint_before_call
from sessions.services import (
    StaleSessionError,
    checkpoint_before_call,
    session_create,
    session_reset,
    session_resume_from,
    session_resume_last_good,
    stuck_turns_find,
    transition_apply,
    turn_failure_record,
)
from tests.world import make_agent

TODAY = date(2026, 11, 30)


def decide(next_state: str, **slots: Any) -> Any:
    return WF.decision_schema.model_validate({"next_state": next_state, "slots": slots, "confidence": 0.9})


def make_turn(session: ChatSession, seq: int = 1, **fields: Any) -> Turn:
    return Turn.objects.create(session=session, seq=seq, user_message=f"message {seq}", **fields)


@pytest.fixture
def booking(alice: Any) -> ChatSession:
    return session_create(user=alice, agent=make_agent("booking", slug="booker"))


@pytest.mark.django_db
def test_session_create_starts_in_the_agents_workflow(alice: Any) -> None:
    session = session_create(user=alice, agent=make_agent("booking", slug="booker"), title="Trip")
    assert (session.workflow, session.state, session.last_good_state, session.data) == (
        "flight_booking",
        "IDLE",
        "IDLE",
        {},
    )
    chat = session_create(user=alice, agent=make_agent("chat", slug="chatter"))
    assert (chat.workflow, chat.state) == ("free_chat", "CHATTING")


@pytest.mark.django_db
def test_valid_transition_is_applied_versioned_and_checkpointed(booking: ChatSession) -> None:
    turn = make_turn(booking)
    outcome = transition_apply(
        session=booking, turn=turn, decision=decide("GATHERING_DATES", origin="Oslo", destination="Rome"), today=TODAY
    )
    assert outcome.applied and (outcome.from_state, outcome.to_state) == ("IDLE", "GATHERING_DATES")
    stored = ChatSession.objects.get(pk=booking.pk)
    assert (stored.state, stored.data, stored.version) == (
        "GATHERING_DATES",
        {"origin": "Oslo", "destination": "Rome"},
        1,
    )
    assert (stored.last_transition, stored.last_good_state) == ("IDLE -> GATHERING_DATES", "GATHERING_DATES")
    cp = Checkpoint.objects.get(session=booking)
    assert (cp.seq, cp.reason, cp.state, cp.transition, cp.turn_id) == (
        1,
        "transition",
        "GATHERING_DATES",
        "IDLE -> GATHERING_DATES",
        turn.pk,
    )
    assert cp.data == stored.data
    assert booking.version == 1 and booking.state == "GATHERING_DATES"  # the caller's copy follows


@pytest.mark.django_db
def test_invalid_transition_is_recorded_and_changes_nothing(booking: ChatSession) -> None:
    outcome = transition_apply(session=booking, turn=None, decision=decide("BOOKING", origin="Oslo"), today=TODAY)
    assert not outcome.applied and outcome.to_state == "IDLE"
    assert any("not allowed" in e for e in outcome.errors)
    stored = ChatSession.objects.get(pk=booking.pk)
    assert (stored.state, stored.data, stored.version) == ("IDLE", {}, 0)
    cp = Checkpoint.objects.get(session=booking)
    assert cp.reason == "invalid_transition" and cp.transition == "IDLE -> BOOKING" and "not allowed" in cp.detail


@pytest.mark.django_db
def test_a_decision_that_does_not_fit_the_schema_is_recorded(booking: ChatSession) -> None:
    outcome = transition_apply(session=booking, turn=None, decision={"next_state": "SOMEWHERE"})
    assert not outcome.applied and ChatSession.objects.get(pk=booking.pk).state == "IDLE"
    assert Checkpoint.objects.get(session=booking).reason == "invalid_transition"


@pytest.mark.django_db
def test_a_stale_copy_cannot_overwrite_a_newer_state(booking: ChatSession) -> None:
    other = ChatSession.objects.get(pk=booking.pk)
    transition_apply(session=other, turn=None, decision=decide("GATHERING_ORIGIN"), today=TODAY)
    with pytest.raises(StaleSessionError, match="reload"):
        transition_apply(session=booking, turn=None, decision=decide("GATHERING_DESTINATION", origin="X1"), today=TODAY)
    stored = ChatSession.objects.get(pk=booking.pk)
    assert (stored.state, stored.version) == ("GATHERING_ORIGIN", 1)
    assert list(Checkpoint.objects.filter(session=booking).values_list("reason", flat=True)) == ["transition"]


@pytest.mark.django_db
def test_retries_past_the_limit_move_to_failed_with_a_clear_message(booking: ChatSession) -> None:
    transition_apply(session=booking, turn=None, decision=decide("GATHERING_DESTINATION", origin="Oslo"), today=TODAY)
    for attempt in range(1, MAX_RETRIES + 1):
        turn_failure_record(session=booking, turn=None, reason=f"timeout {attempt}")
        assert (booking.retry_count, booking.state) == (attempt, "GATHERING_DESTINATION")
    turn_failure_record(session=booking, turn=None, reason="timeout again")
    stored = ChatSession.objects.get(pk=booking.pk)
    assert (stored.state, stored.status, stored.retry_count) == ("FAILED", "failed", MAX_RETRIES + 1)
    assert stored.data == {"origin": "Oslo"} and stored.last_good_state == "GATHERING_DESTINATION"
    failed = Checkpoint.objects.get(session=booking, reason="failed")
    assert failed.transition == "GATHERING_DESTINATION -> FAILED" and "timeout again" in failed.detail
    message = session_failure_message(session=stored)
    assert "resume from the last good step (GATHERING_DESTINATION) or start over" in message
    assert "origin=Oslo" in message
    # The resume instruction of FAILED offers both ways forward.
    assert "resume from the last good step" in WF.resume_instruction(stored.state, stored.data)


@pytest.mark.django_db
def test_a_successful_transition_resets_the_retry_counter(booking: ChatSession) -> None:
    turn_failure_record(session=booking, turn=None, reason="bad json")
    turn_failure_record(session=booking, turn=None, reason="bad json")
    transition_apply(session=booking, turn=None, decision=decide("GATHERING_ORIGIN"), today=TODAY)
    assert ChatSession.objects.get(pk=booking.pk).retry_count == 0


@pytest.mark.django_db
def test_resume_from_failed_by_decision_and_by_last_good_checkpoint(booking: ChatSession) -> None:
    transition_apply(session=booking, turn=None, decision=decide("GATHERING_DESTINATION", origin="Oslo"), today=TODAY)
    for _ in range(MAX_RETRIES + 1):
        turn_failure_record(session=booking, turn=None, reason="boom")
    assert booking.state == "FAILED"
    good = last_good_checkpoint(session=booking)
    assert good is not None and good.state == "GATHERING_DESTINATION"
    session_resume_last_good(session=booking)
    stored = ChatSession.objects.get(pk=booking.pk)
    assert (stored.state, stored.status, stored.retry_count, stored.data) == (
        "GATHERING_DESTINATION",
        "active",
        0,
        {"origin": "Oslo"},
    )
    assert Checkpoint.objects.filter(session=booking).last().reason == "resume"  # type: ignore[union-attr]


@pytest.mark.django_db
def test_reset_and_resume_from_a_chosen_checkpoint(booking: ChatSession, staff: Any) -> None:
    transition_apply(session=booking, turn=None, decision=decide("GATHERING_DESTINATION", origin="Oslo"), today=TODAY)
    chosen = Checkpoint.objects.get(session=booking, reason="transition")
    transition_apply(session=booking, turn=None, decision=decide("GATHERING_DATES", destination="Rome"), today=TODAY)
    session_reset(session=booking, actor=staff)
    stored = ChatSession.objects.get(pk=booking.pk)
    assert (stored.state, stored.data, stored.retry_count) == ("IDLE", {}, 0)
    reset_cp = Checkpoint.objects.filter(session=booking).last()
    assert reset_cp is not None and reset_cp.reason == "reset" and "staff" in reset_cp.detail
    session_resume_from(session=stored, checkpoint=chosen, actor=staff)
    stored.refresh_from_db()
    assert (stored.state, stored.data) == ("GATHERING_DESTINATION", {"origin": "Oslo"})
    other = session_create(user=booking.user, agent=booking.agent)
    with pytest.raises(ValueError, match="another session"):
        session_resume_from(session=other, checkpoint=chosen)


@pytest.mark.django_db
def test_checkpoint_before_call_and_crash_recovery_candidates(booking: ChatSession) -> None:
    old = timezone.now() - timedelta(minutes=10)
    stuck = make_turn(booking, 1, status=Turn.Status.RUNNING, started_at=old)
    fresh = make_turn(booking, 2, status=Turn.Status.RUNNING, started_at=timezone.now())
    done = make_turn(booking, 3, status=Turn.Status.COMPLETED, started_at=old)
    never_started = make_turn(booking, 4, status=Turn.Status.PENDING)
    Turn.objects.filter(pk=never_started.pk).update(created_at=old)
    cp = checkpoint_before_call(session=booking, turn=stuck)
    assert (cp.reason, cp.state, cp.turn_id) == ("before_call", "IDLE", stuck.pk)
    assert turn_checkpoint_before_call(turn=stuck) == cp
    found = set(stuck_turns_find(older_than=timedelta(minutes=2)).values_list("pk", flat=True))
    assert found == {stuck.pk, never_started.pk}
    assert fresh.pk not in found and done.pk not in found
    # The user's message is still there to be answered after the crash.
    assert Turn.objects.get(pk=stuck.pk).user_message == "message 1"


@pytest.mark.django_db
def test_checkpoint_seq_is_consecutive_per_session(booking: ChatSession, alice: Any) -> None:
    other = session_create(user=alice, agent=booking.agent)
    turn = make_turn(booking)
    for _ in range(3):
        checkpoint_before_call(session=booking, turn=turn)
    checkpoint_before_call(session=other, turn=make_turn(other))
    assert list(Checkpoint.objects.filter(session=booking).values_list("seq", flat=True)) == [1, 2, 3]
    assert list(Checkpoint.objects.filter(session=other).values_list("seq", flat=True)) == [1]


class TransitionLogProperty(HypothesisTestCase):
    """Against the database: whatever the model outputs, the log only ever holds allowed transitions."""

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(WF.states),
                st.fixed_dictionaries(
                    {},
                    optional={
                        "origin": st.sampled_from(["Oslo", "Rome", "x", ""]),
                        "destination": st.sampled_from(["Rome", "Paris", "9"]),
                        "depart_date": st.sampled_from(["2027-03-10", "2020-01-01", "soon"]),
                        "passengers": st.integers(min_value=0, max_value=11),
                        "booking_reference": st.sampled_from(["ABC123", "?"]),
                    },
                ),
            ),
            max_size=12,
        )
    )
    def test_the_log_never_holds_a_forbidden_transition(self, outputs: list[tuple[str, dict[str, Any]]]) -> None:
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.create_user(username=f"u{ChatSession.objects.count()}")
        agent = Agent.objects.filter(slug="prop").first() or make_agent("booking", slug="prop")
        session = session_create(user=user, agent=agent)
        before: dict[str, Any] = {}
        for state, slots in outputs:
            previous_state = session.state
            outcome = transition_apply(session=session, turn=None, decision=decide(state, **slots), today=TODAY)
            session.refresh_from_db()
            if outcome.applied:
                assert WF.can_transition(previous_state, session.state)
                if not WF.clears_data_on_entry(previous_state, session.state):
                    assert set(before) <= set(session.data)
            else:
                assert session.state == previous_state and session.data == before
            before = dict(session.data)
        for cp in Checkpoint.objects.filter(session=session, reason="transition"):
            source, target = cp.transition.split(" -> ")
            assert WF.can_transition(source, target)
