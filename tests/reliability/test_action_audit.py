"""An action's tool call and the outcome it leads to are written together: the ``ToolInvocation`` row in the
transaction that moves the workflow. When that write fails, the outcome is not there and the call is recorded on
its own (it ran); asked again, the turn books nothing new (the booking tool is idempotent) and writes the move
with its call's record."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest
from django.db import DatabaseError

import orchestrator.reply as reply_module
from agents.models import ToolInvocation
from examples.booking.models import Booking
from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import session_create
from tests.world import make_agent

pytestmark = pytest.mark.django_db(transaction=True)


def _say(day: date) -> str:
    return f"{day:%B} {day.day}, {day.year}"


def _to_confirming(alice: Any) -> ChatSession:
    agent = make_agent(
        name="Booker",
        slug="booker",
        system_prompt="You book flights.",
        workflow="flight_booking",
        tools=["book_flight"],
    )
    session = session_create(user=alice, agent=agent)
    depart = date.today() + timedelta(days=40)
    for message in (
        "Hi, I'd like to book a flight",
        "From London",
        "to Paris",
        f"{_say(depart)} to {_say(depart + timedelta(days=5))}",
        "2 passengers",
    ):
        turn_run(session=session, message=message)
    session.refresh_from_db()
    assert session.state == "CONFIRMING"
    return session


def test_a_failed_outcome_write_leaves_the_call_recorded_alone_and_the_retry_writes_both(
    alice: Any, monkeypatch: Any
) -> None:
    session = _to_confirming(alice)
    real_insert = reply_module.tool_invocation_insert

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("the connection went away")

    monkeypatch.setattr(reply_module, "tool_invocation_insert", broken)
    failed = turn_run(session=session, message="yes, book it")
    assert failed.turn.status == Turn.Status.FAILED
    session.refresh_from_db()
    # No move to COMPLETED: the booking tool ran, but its outcome was not written. The call is recorded alone.
    assert session.state == "BOOKING" and not session.data.get("booking_reference")
    [alone] = ToolInvocation.objects.filter(session=session, name="book_flight")
    assert alone.turn_id == failed.turn.pk and alone.ok
    assert not Checkpoint.objects.filter(session=session, state="COMPLETED").exists()
    assert Booking.objects.filter(session=session).count() == 1

    monkeypatch.setattr(reply_module, "tool_invocation_insert", real_insert)
    again = turn_run(session=session, message="yes, book it")
    assert again.turn.status == Turn.Status.COMPLETED, again.turn.error
    session.refresh_from_db()
    booking = Booking.objects.get(session=session)  # still one: the action is idempotent
    assert session.state == "COMPLETED" and session.data["booking_reference"] == booking.reference
    invocation = ToolInvocation.objects.get(session=session, name="book_flight", turn=again.turn)
    assert invocation.ok and ToolInvocation.objects.filter(session=session, name="book_flight").count() == 2
    transition = Checkpoint.objects.get(session=session, state="COMPLETED", reason=Checkpoint.Reason.TRANSITION)
    assert transition.turn_id == again.turn.pk
