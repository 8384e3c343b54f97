"""A booking that fails has a way out inside the workflow (issue 36, the walk's third major): the failure says
why and which flights have the seats, a change ("make it 1 passenger", a flight number) is summarised and asked
again, then booked on "yes", "try again"
with nothing changed goes back to the confirmation instead of failing the same way until FAILED, and only an
explicit "start over" drops what was collected. Real turns, on the demo model."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest

from examples.booking.models import Booking
from examples.booking.tools import Flight, timetable
from orchestrator.runtime import turn_run
from sessions.models import ChatSession
from sessions.services import session_create
from tests.world import make_agent

pytestmark = pytest.mark.django_db(transaction=True)


def _say(day: date) -> str:
    return f"{day:%B} {day.day}, {day.year}"


def _tight_day(origin: str, destination: str) -> tuple[date, list[Flight]]:
    """A day whose first flight has exactly 1 seat left while another flight has room for 2 (found, not
    hard-coded: the timetable is generated)."""
    start = date.today() + timedelta(days=20)
    for offset in range(400):
        day = start + timedelta(days=offset)
        flights = timetable(origin=origin, destination=destination, on=day)
        if flights[0].seats_left == 1 and any(f.seats_left >= 2 for f in flights[1:]):
            return day, flights
    raise AssertionError("no such day in the simulated timetable")


def _to_a_failed_booking(alice: Any) -> tuple[ChatSession, list[Flight], str]:
    agent = make_agent("booking", slug="booker")
    session = session_create(user=alice, agent=agent)
    day, flights = _tight_day("London", "Paris")
    for message in ("Hi, I'd like to book a flight", "From London to Paris", _say(day), "2 passengers"):
        assert turn_run(session=session, message=message).turn.status == "completed"
    session.refresh_from_db()
    assert session.state == "CONFIRMING" and session.data["passengers"] == 2
    failed = turn_run(session=session, message="yes")
    session.refresh_from_db()
    return session, flights, failed.turn.assistant_message


def test_a_booking_that_fails_for_seats_offers_the_flights_and_completes_after_make_it_1_passenger(
    alice: Any,
) -> None:
    session, flights, reply = _to_a_failed_booking(alice)
    first = flights[0]
    # The reason, and the flights that do have two seats: the way out, not a dead end.
    assert f"flight {first.number} has only 1 seats left; 2 requested" in reply
    roomy = [f.number for f in flights if f.seats_left >= 2]
    assert roomy and all(number in reply for number in roomy)
    assert "make it 1 passenger" in reply and Booking.objects.count() == 0
    # Its example of a flight to choose is one of those offered, not one made up.
    assert any(f"for example “{number}”" in reply for number in roomy), reply
    collected = dict(session.data)

    asked = turn_run(session=session, message="make it 1 passenger")
    session.refresh_from_db()
    # Issue 55: the change is shown and asked again, not booked at once.
    assert session.state == "CONFIRMING" and "1 passenger" in asked.reply and "Shall I book it?" in asked.reply
    assert Booking.objects.count() == 0
    done = turn_run(session=session, message="yes")
    assert done.turn.status == "completed", done.turn.error
    session.refresh_from_db()
    booking = Booking.objects.get(session=session)
    assert session.state == "COMPLETED" and session.data["booking_reference"] == booking.reference
    assert booking.passengers == 1 and booking.flight_number == first.number
    # What was collected before the failure was kept; only the party changed.
    assert {k: v for k, v in session.data.items() if k not in ("passengers", "booking_reference")} == {
        k: v for k, v in collected.items() if k != "passengers"
    }
    # The reply names the booking: its reference, its flight, when it leaves and its price.
    reply = done.turn.assistant_message
    assert booking.reference in reply and booking.flight_number in reply and first.departs in reply and "EUR" in reply


def test_choosing_an_offered_flight_books_that_flight_for_the_whole_party(alice: Any) -> None:
    session, flights, _reply = _to_a_failed_booking(alice)
    other = next(f for f in flights if f.seats_left >= 2)
    turn_run(session=session, message=f"Then book {other.number} please")
    session.refresh_from_db()
    assert session.state == "CONFIRMING" and Booking.objects.count() == 0  # asked again first
    done = turn_run(session=session, message="yes")
    session.refresh_from_db()
    booking = Booking.objects.get(session=session)
    assert session.state == "COMPLETED" and done.turn.status == "completed"
    assert booking.flight_number == other.number and booking.passengers == 2


def test_try_again_with_nothing_changed_goes_back_to_confirming_and_never_to_failed(alice: Any) -> None:
    session, _flights, _reply = _to_a_failed_booking(alice)
    collected = dict(session.data)
    replies = []
    for _ in range(6):  # more than MAX_RETRIES: it used to end in FAILED, nothing changed
        replies.append(turn_run(session=session, message="try again").turn.assistant_message)
        session.refresh_from_db()
        assert session.state == "CONFIRMING" and session.status == ChatSession.Status.ACTIVE
        assert session.data == collected
    assert "Nothing has changed, so booking it again would fail the same way: flight" in replies[0]
    assert all("Shall I book it?" in r or "would fail the same way" in r for r in replies)
    assert Booking.objects.count() == 0

    done = turn_run(session=session, message="make it 1 passenger")
    session.refresh_from_db()
    # From the confirmation a change is confirmed first, then booked.
    assert session.state == "CONFIRMING" and session.data["passengers"] == 1, done.turn.assistant_message
    turn_run(session=session, message="yes")
    session.refresh_from_db()
    assert session.state == "COMPLETED" and Booking.objects.get(session=session).passengers == 1


def test_start_over_after_a_failed_booking_is_explicit_and_drops_the_data(alice: Any) -> None:
    session, _flights, _reply = _to_a_failed_booking(alice)
    assert session.state == "BOOKING" and session.data
    turn_run(session=session, message="start over")
    session.refresh_from_db()
    assert session.state == "IDLE" and session.data == {}


def test_a_models_decision_cannot_set_a_slot_only_the_booking_tool_sets() -> None:
    """Issue 55 (the probe): a decision {"next_state": "CONFIRMING", "slots": {..., "booking_reference": "FAKE123"}}
    put "booking_reference FAKE123" under Collected and into the checkpoints. No state collects that slot: only
    the booking's own result sets it."""
    from examples.booking.workflow import FLIGHT_BOOKING

    data = {"origin": "London", "destination": "Paris", "depart_date": "2027-03-10", "passengers": 2}
    forged = FLIGHT_BOOKING.decision_schema.model_validate(
        {"next_state": "CONFIRMING", "slots": {"passengers": 3, "booking_reference": "FAKE123"}}
    )
    result = FLIGHT_BOOKING.step(state="CONFIRMING", data=data, decision=forged)
    assert "booking_reference" not in result.data and result.data["passengers"] == 3
    assert any(error.startswith("booking_reference: set by the workflow's own actions") for error in result.slot_errors)
    booked = FLIGHT_BOOKING.decision(next_state="COMPLETED", slots={"booking_reference": "QK-1A2B3C"})
    done = FLIGHT_BOOKING.step(state="BOOKING", data={**data, "flight_number": "QK7431"}, decision=booked)
    assert done.applied and done.data["booking_reference"] == "QK-1A2B3C"
