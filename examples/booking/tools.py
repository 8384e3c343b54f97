"""``search_flights`` and ``book_flight``: the booking workflow's tools (plain functions made tools by ``@tool``),
on local simulated data.

No airline is called. The timetable is generated deterministically from (origin, destination, date),
so the same question always gets the same flights — in tests, in benchmarks and in the demo. A
booking is an ``examples.booking.models.Booking`` row, made at most once per (session, flight, date): a
retried or repeated call returns the first booking's reference instead of booking twice.
"""

from __future__ import annotations

import hashlib
import random
import re
import secrets
from dataclasses import dataclass
from datetime import date, datetime
from typing import Annotated, Any

from django.db import IntegrityError, transaction
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from agents.tools import ToolContext, ToolOutput, tool
from agents.tools.errors import ToolInputError
from examples.booking.models import Booking
from examples.booking.workflow import place_name

_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_date(value: object) -> date:
    if isinstance(value, date) and not isinstance(value, datetime):
        return value
    if isinstance(value, str) and _ISO_DATE.fullmatch(value.strip()):
        try:
            return date.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not a real calendar date") from None
    raise ValueError("must be a date string YYYY-MM-DD")


# A calendar date the model sends as "YYYY-MM-DD"; nothing else (no timestamps, no "next Friday"). The schema
# says so with the standard "format": "date" (which llama.cpp turns into a date grammar), not a regex "pattern":
# llama-cpp-python 0.3.36 mistranslates "\d{4}" into a grammar that crashes its server.
IsoDate = Annotated[
    date,
    BeforeValidator(_iso_date),
    WithJsonSchema({"type": "string", "format": "date", "description": "YYYY-MM-DD"}),
]
# A city the booking tools take: a name, never a sentence ("Paris instead of Berlin" is refused, not booked).
City = Annotated[str, Field(min_length=2, max_length=80), AfterValidator(place_name)]


class SearchFlightsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    origin: City = Field(description="City the flight leaves from, e.g. 'Paris'.")
    destination: City = Field(description="City the flight goes to, e.g. 'Rome'.")
    date: IsoDate = Field(description="Day of departure, YYYY-MM-DD.")

    @model_validator(mode="after")
    def _different_cities(self) -> SearchFlightsArgs:
        if self.origin.casefold() == self.destination.casefold():
            raise ValueError("origin and destination must be different cities")
        return self


class BookFlightArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    origin: City = Field(description="City the flight leaves from.")
    destination: City = Field(description="City the flight goes to.")
    depart_date: IsoDate = Field(description="Day of departure, YYYY-MM-DD.")
    return_date: IsoDate | None = Field(default=None, description="Day of the return trip, YYYY-MM-DD, if any.")
    passengers: int = Field(ge=1, le=9, description="Number of passengers, 1 to 9.")
    flight_number: str | None = Field(
        default=None,
        min_length=3,
        max_length=12,
        description="Flight number from search_flights (e.g. 'QK1234'); omitted: the first flight of the day.",
    )

    @field_validator("flight_number")
    @classmethod
    def _normalise_number(cls, value: str | None) -> str | None:
        return None if value is None else re.sub(r"\s+", "", value).upper()

    @model_validator(mode="after")
    def _consistent(self) -> BookFlightArgs:
        if self.origin.casefold() == self.destination.casefold():
            raise ValueError("origin and destination must be different cities")
        if self.return_date is not None and self.return_date < self.depart_date:
            raise ValueError("return_date must not be before depart_date")
        return self


# --- the simulated timetable ------------------------------------------------------------------

_AIRLINES = ("QK", "ZV", "JT", "RM", "NX", "WP")


@dataclass(frozen=True)
class Flight:
    number: str
    origin: str
    destination: str
    depart_date: date
    departs: str  # "HH:MM"
    arrives: str  # "HH:MM", "+1" when the next day
    duration_min: int
    price_eur: int
    seats_left: int

    def line(self) -> str:
        hours, minutes = divmod(self.duration_min, 60)
        return (
            f"{self.number}  dep {self.departs}  arr {self.arrives}  {hours}h{minutes:02d}m  "
            f"EUR {self.price_eur}  seats left {self.seats_left}"
        )


def city_label(name: str) -> str:
    """A city as shown and stored: whitespace collapsed, title case ("  new york " → "New York")."""
    return " ".join(name.split()).title()


def _rng(*parts: str) -> random.Random:
    digest = hashlib.sha256("|".join(parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def timetable(*, origin: str, destination: str, on: date) -> list[Flight]:
    """The flights from ``origin`` to ``destination`` on ``on``, earliest first (deterministic)."""
    o, d = city_label(origin), city_label(destination)
    # The route fixes airline, flight-number block, duration and price level; the day fixes the rest.
    route = _rng(o.casefold(), d.casefold())
    airline = route.choice(_AIRLINES)
    number_base = route.randrange(100, 9000, 10)
    duration = route.randint(55, 720)
    price_level = 40 + duration // 3 + route.randint(0, 80)
    day = _rng(o.casefold(), d.casefold(), on.isoformat())
    count = day.randint(2, 5)
    departures = sorted(day.sample(range(6 * 60, 22 * 60, 5), count))
    flights = []
    for index, minute in enumerate(departures):
        arrival = minute + duration
        next_day = "+1" if arrival >= 24 * 60 else ""
        arrival %= 24 * 60
        flights.append(
            Flight(
                number=f"{airline}{number_base + index}",
                origin=o,
                destination=d,
                depart_date=on,
                departs=f"{minute // 60:02d}:{minute % 60:02d}",
                arrives=f"{arrival // 60:02d}:{arrival % 60:02d}{next_day}",
                duration_min=duration,
                price_eur=price_level + day.randint(-20, 120),
                seats_left=day.randint(0, 40),
            )
        )
    return flights


@tool(
    description=(
        "List the flights between two cities on one day: flight number, departure and arrival times, "
        "duration, price per passenger and seats left."
    )
)
def search_flights(args: SearchFlightsArgs, context: ToolContext) -> str:
    flights = timetable(origin=args.origin, destination=args.destination, on=args.date)
    header = (
        f"Flights from {city_label(args.origin)} to {city_label(args.destination)} on {args.date.isoformat()} "
        "(simulated timetable; prices per passenger):"
    )
    lines = [f"{i}. {flight.line()}" for i, flight in enumerate(flights, start=1)]
    return "\n".join([header, *lines, "To book one, call book_flight with its flight_number."])


# --- booking -----------------------------------------------------------------------------------

_REFERENCE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O or 1/I: references are read aloud


def _new_reference() -> str:
    return "".join(secrets.choice(_REFERENCE_ALPHABET) for _ in range(6))


def _describe(booking: Any, flight: Flight | None) -> str:
    when = booking.depart_date.isoformat()
    if flight is not None:
        when += f" {flight.departs}, arriving {flight.arrives}"
    text = (
        f"reference {booking.reference}: flight {booking.flight_number} {booking.origin} → {booking.destination}, "
        f"departs {when}, {booking.passengers} passenger{'s' if booking.passengers != 1 else ''}"
    )
    if booking.return_date:
        text += f", return {booking.return_date.isoformat()}"
    if flight is not None:
        text += f". Total EUR {flight.price_eur * booking.passengers}"
    return text + "."


@tool(
    description=(
        "Book a flight for the user and return the booking reference. Call it once the user has confirmed "
        "the trip; repeating the same call returns the same booking rather than booking twice."
    )
)
def book_flight(args: BookFlightArgs, context: ToolContext) -> ToolOutput:
    user = context.user
    if user is None or not getattr(user, "is_authenticated", False):
        raise ToolInputError("booking needs a signed-in user.")
    flights = timetable(origin=args.origin, destination=args.destination, on=args.depart_date)
    if args.flight_number:
        flight = next((f for f in flights if f.number == args.flight_number), None)
        if flight is None:
            available = ", ".join(f"{f.number} ({f.departs})" for f in flights)
            raise ToolInputError(
                f"there is no flight {args.flight_number} from {city_label(args.origin)} to "
                f"{city_label(args.destination)} on {args.depart_date.isoformat()}. Flights that day: {available}."
            )
    else:
        flight = flights[0]

    existing = Booking.objects.filter(
        user=user, session=context.session, flight_number=flight.number, depart_date=flight.depart_date
    ).first()
    if existing is not None:
        return _already_booked(existing, flight)
    if flight.seats_left < args.passengers:
        raise ToolInputError(seats_refusal(flight, flights, passengers=args.passengers))
    for _ in range(5):
        try:
            with transaction.atomic():
                booking = Booking.objects.create(
                    user=user,
                    session=context.session,
                    reference=_new_reference(),
                    flight_number=flight.number,
                    origin=flight.origin,
                    destination=flight.destination,
                    depart_date=flight.depart_date,
                    return_date=args.return_date,
                    passengers=args.passengers,
                )
            return ToolOutput("Booked. " + _describe(booking, flight), _booking_data(booking))
        except IntegrityError:
            # Either a concurrent (or abandoned-then-finished) attempt booked this flight first, or the
            # random reference collided. The first case answers with that booking; the second tries again.
            existing = Booking.objects.filter(
                user=user, session=context.session, flight_number=flight.number, depart_date=flight.depart_date
            ).first()
            if existing is not None:
                return _already_booked(existing, flight)
    raise RuntimeError("could not allocate a unique booking reference")


def seats_refusal(flight: Flight, flights: list[Flight], *, passengers: int) -> str:
    """Why ``flight`` cannot take ``passengers``, and the way out: the flights of that day that can (or the most
    seats any of them has), so that the user can choose instead of starting over."""
    reason = f"flight {flight.number} has only {flight.seats_left} seats left; {passengers} requested."
    roomy = [f for f in flights if f.seats_left >= passengers]
    if roomy:
        options = ", ".join(f"{f.number} at {f.departs} (EUR {f.price_eur})" for f in roomy)
        return f"{reason} Flights that day with {passengers} seats: {options}."
    most = max((f.seats_left for f in flights), default=0)
    if most:
        return f"{reason} No flight that day has {passengers} seats; at most {most} on one flight."
    return f"{reason} Every flight that day is full."


def _already_booked(existing: Any, flight: Flight) -> ToolOutput:
    return ToolOutput(
        "Already booked in this conversation, not booked twice: " + _describe(existing, flight), _booking_data(existing)
    )


def _booking_data(booking: Any) -> dict[str, Any]:
    return {"reference": booking.reference, "flight_number": booking.flight_number, "booking_id": booking.pk}


# The names settings.AGENT_TOOLS (and older code) use for the two tools.
SEARCH_FLIGHTS = search_flights
BOOK_FLIGHT = book_flight
