"""search_flights and book_flight: a deterministic timetable and bookings made once per session."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser

from agents.models import ToolInvocation
from agents.tools import ToolContext, run_tool_call
from agents.tools.faults import faults, inject_fault
from examples.booking.models import Booking
from examples.booking.tools import city_label, timetable
from llm.base import ToolCallRequest
from sessions.models import ChatSession
from tests.world import make_agent

DAY = date.today() + timedelta(days=45)


def _first_day(origin: str, destination: str, fits: Any) -> tuple[date, list[Any]]:
    """The first day from DAY whose generated timetable ``fits`` (so no test skips on an unlucky day)."""
    for offset in range(90):
        day = DAY + timedelta(days=offset)
        flights = timetable(origin=origin, destination=destination, on=day)
        if fits(flights):
            return day, flights
    raise AssertionError(f"no day in 90 with a fitting timetable {origin} → {destination}")


@pytest.fixture(autouse=True)
def fast_retries(settings: Any) -> Iterator[None]:
    settings.TOOLS_RETRY_BASE_DELAY = 0.01
    settings.TOOLS_RETRY_MAX_DELAY = 0.05
    settings.TOOLS_FAULTS = ""
    yield
    faults.clear()


def call(name: str, **arguments: Any) -> ToolCallRequest:
    return ToolCallRequest(id="f1", name=name, arguments=json.dumps(arguments))


def context_for(user: Any, *, slug: str = "booker") -> ToolContext:
    agent = make_agent(name=slug, slug=slug, system_prompt="Book.", tools=["search_flights", "book_flight"])
    session = ChatSession.objects.create(user=user, agent=agent, workflow="flight_booking", state="IDLE")
    return ToolContext(user=user, session=session, agent=agent)


# --- the timetable (no database) ------------------------------------------------------------------


def test_the_timetable_is_deterministic_and_plausible() -> None:
    first = timetable(origin="Paris", destination="Rome", on=DAY)
    again = timetable(origin="  paris ", destination="ROME", on=DAY)
    assert first == again  # same question, same flights, whatever the spelling
    assert 2 <= len(first) <= 5
    assert len({f.number for f in first}) == len(first)
    assert [f.departs for f in first] == sorted(f.departs for f in first)
    assert all(f.origin == "Paris" and f.destination == "Rome" and f.depart_date == DAY for f in first)
    assert all(re.fullmatch(r"[A-Z]{2}\d{3,4}", f.number) for f in first)
    # The day changes the schedule, the route keeps its airline.
    week = [timetable(origin="Paris", destination="Rome", on=DAY + timedelta(days=n)) for n in range(7)]
    assert len({tuple(f.departs for f in day) for day in week}) > 1
    assert len({day[0].number[:2] for day in week}) == 1
    assert timetable(origin="Rome", destination="Paris", on=DAY) != first
    assert city_label("  new   york ") == "New York"


@pytest.mark.django_db
def test_search_flights_lists_the_timetable(alice: Any) -> None:
    result = run_tool_call(
        call=call("search_flights", origin="Lisbon", destination="Berlin", date=DAY.isoformat()),
        context=ToolContext(user=alice),
    )
    assert result.ok
    assert result.content.startswith(f"Flights from Lisbon to Berlin on {DAY.isoformat()}")
    for flight in timetable(origin="Lisbon", destination="Berlin", on=DAY):
        assert flight.line() in result.content


# --- booking: the tool runs in a worker thread, so its rows are committed (transaction=True) --------


@pytest.mark.django_db(transaction=True)
def test_booking_once_per_session_flight_and_day(alice: Any, bob: Any) -> None:
    context = context_for(alice)
    day, flights = _first_day("Paris", "Rome", lambda fs: any(f.seats_left >= 2 for f in fs))
    chosen = next(f for f in flights if f.seats_left >= 2)
    args = {
        "origin": "Paris",
        "destination": "Rome",
        "depart_date": day.isoformat(),
        "return_date": (day + timedelta(days=7)).isoformat(),
        "passengers": 2,
        "flight_number": chosen.number.lower(),
    }

    first = run_tool_call(call=call("book_flight", **args), context=context)
    assert first.ok, first.content
    booking = Booking.objects.get()
    assert (booking.user, booking.session, booking.flight_number) == (alice, context.session, chosen.number)
    assert (booking.depart_date, booking.return_date, booking.passengers) == (day, day + timedelta(days=7), 2)
    assert first.content.startswith(f"Booked. reference {booking.reference}: flight {chosen.number} Paris → Rome")
    assert f"Total EUR {chosen.price_eur * 2}" in first.content

    # The model repeats the call (or a retry lands twice): the same booking comes back.
    again = run_tool_call(call=call("book_flight", **args), context=context)
    assert again.ok
    assert again.content.startswith("Already booked in this conversation, not booked twice")
    assert booking.reference in again.content
    assert Booking.objects.count() == 1

    # Another session of another user books the same flight on its own.
    other = run_tool_call(call=call("book_flight", **args), context=context_for(bob, slug="booker-2"))
    assert other.ok and booking.reference not in other.content
    assert Booking.objects.count() == 2
    assert ToolInvocation.objects.filter(name="book_flight", ok=True).count() == 3


@pytest.mark.django_db(transaction=True)
def test_booking_without_a_number_takes_the_first_flight_and_survives_a_503(alice: Any) -> None:
    context = context_for(alice)
    day, flights = _first_day("Oslo", "Madrid", lambda fs: fs[0].seats_left >= 1)
    first = flights[0]
    with inject_fault("book_flight", "http_503", times=1):
        result = run_tool_call(
            call=call("book_flight", origin="Oslo", destination="Madrid", depart_date=day.isoformat(), passengers=1),
            context=context,
        )
    assert result.ok, result.content
    assert result.attempts == 2
    assert Booking.objects.get().flight_number == first.number


@pytest.mark.django_db(transaction=True)
def test_booking_refusals_are_tool_errors(alice: Any) -> None:
    context = context_for(alice)
    flights = timetable(origin="Paris", destination="Rome", on=DAY)

    unknown = run_tool_call(
        call=call(
            "book_flight",
            origin="Paris",
            destination="Rome",
            depart_date=DAY.isoformat(),
            passengers=1,
            flight_number="ZZ9999",
        ),
        context=context,
    )
    assert unknown.error_kind == "invalid_arguments"
    assert unknown.attempts == 1
    assert unknown.content.startswith(
        "TOOL_ERROR: book_flight could not use these arguments: there is no flight ZZ9999"
    )
    assert all(f.number in unknown.content for f in flights)

    anonymous = run_tool_call(
        call=call("book_flight", origin="Paris", destination="Rome", depart_date=DAY.isoformat(), passengers=1),
        context=ToolContext(user=AnonymousUser(), session=context.session, agent=context.agent),
    )
    assert anonymous.error_kind == "invalid_arguments"
    assert "signed-in user" in anonymous.content

    # A day whose first flight has fewer seats than nine passengers need (found, not hard-coded).
    day, flight = next(
        (d, f)
        for d in (DAY + timedelta(days=n) for n in range(60))
        for f in timetable(origin="Paris", destination="Rome", on=d)[:1]
        if f.seats_left < 9
    )
    full = run_tool_call(
        call=call("book_flight", origin="Paris", destination="Rome", depart_date=day.isoformat(), passengers=9),
        context=context,
    )
    assert full.error_kind == "invalid_arguments"
    assert f"flight {flight.number} has only {flight.seats_left} seats left; 9 requested" in full.content
    assert Booking.objects.count() == 0


@pytest.mark.django_db
def test_inside_a_transaction_the_tool_sees_the_callers_uncommitted_rows(alice: Any) -> None:
    # The test's transaction is still open: user, agent and session are not committed. The tool's thread
    # borrows the caller's connection, so the booking can refer to them.
    context = context_for(alice)
    day, flights = _first_day("Vienna", "Prague", lambda fs: fs[0].seats_left >= 1)
    first = flights[0]
    result = run_tool_call(
        call=call("book_flight", origin="Vienna", destination="Prague", depart_date=day.isoformat(), passengers=1),
        context=context,
    )
    assert result.ok, result.content
    assert Booking.objects.get(session=context.session).flight_number == first.number


@pytest.mark.django_db
def test_the_booking_tools_refuse_a_sentence_as_a_city(alice: Any) -> None:
    args = {
        "origin": "London",
        "destination": "Paris instead of Berlin",
        "depart_date": DAY.isoformat(),
        "passengers": 1,
    }
    booked = run_tool_call(call=call("book_flight", **args), context=context_for(alice))
    assert not booked.ok and "city or airport" in booked.content
    searched = run_tool_call(
        call=call("search_flights", origin="London", destination="I want to go to Paris", date=DAY.isoformat()),
        context=ToolContext(user=alice),
    )
    assert not searched.ok and "city or airport" in searched.content
    assert Booking.objects.count() == 0
