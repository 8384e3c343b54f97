"""The flight-booking workflow of the first seed article, with its back-edges.

IDLE → GATHERING_ORIGIN → GATHERING_DESTINATION → GATHERING_DATES → GATHERING_PASSENGERS → CONFIRMING
→ BOOKING → COMPLETED. A message that answers several questions at once may skip forward (each state's
``requires`` guards that); going back to change a value is allowed only from CONFIRMING (and FAILED), so a
confused model cannot wander back and re-ask a question already answered.

A booking that fails (no seats for the party on that flight) is not a dead end: ``book_flight`` says why and
which flights of the day have the seats; in BOOKING a change ("make it 1 passenger", "QK7431") is booked
straight away, and the failures of the action go back to CONFIRMING (``action_outcomes``), with everything
collected kept. FAILED is where repeated failures of any kind end (``MAX_RETRIES``); starting over is only
ever the user's explicit choice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date
from typing import Annotated, Any, Literal

from django.utils import timezone
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agents.workflows.base import StateSpec, Workflow, WorkflowDecision

BookingState = Literal[
    "IDLE",
    "GATHERING_ORIGIN",
    "GATHERING_DESTINATION",
    "GATHERING_DATES",
    "GATHERING_PASSENGERS",
    "CONFIRMING",
    "BOOKING",
    "COMPLETED",
    "FAILED",
]

# A place name: letters first, then letters, digits, spaces and the punctuation real names use.
_PLACE = re.compile(r"^[^\W\d_][\w .,'()/-]*$")


# Words of a sentence, never of a city's name: "Paris instead of Berlin" is a change of mind, not a place.
_SENTENCE_WORDS = frozenset("instead rather than not but want wanna please actually i i'd i'm we go fly".split())


def place_name(value: str) -> str:
    """``value`` as a city or airport name (spaces normalised); ``ValueError`` for anything else, a sentence
    included."""
    words = value.split()
    if not _PLACE.match(value) or len(words) > 5 or any(w.lower().strip(".,") in _SENTENCE_WORDS for w in words):
        raise ValueError("must be a city or airport name")
    return " ".join(words)


PlaceName = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=2, max_length=80), AfterValidator(place_name)
]


class BookingSlots(BaseModel):
    """The booking's slots with their real types and rules; every field optional until collected."""

    model_config = ConfigDict(extra="forbid")

    origin: PlaceName | None = Field(default=None, description="departure city or airport")
    destination: PlaceName | None = Field(default=None, description="arrival city or airport")
    depart_date: date | None = Field(default=None, description="outbound date, YYYY-MM-DD, not in the past")
    return_date: date | None = Field(default=None, description="optional return date, YYYY-MM-DD")
    passengers: int | None = Field(default=None, ge=1, le=9, description="number of travellers, 1-9")
    flight_number: str | None = Field(
        default=None,
        pattern=r"^[A-Z]{2}\d{3,4}$",
        description="a flight of the day chosen by the user (e.g. QK7431); none: the first flight of the day",
    )
    booking_reference: str | None = Field(
        default=None, min_length=4, max_length=20, pattern=r"^[A-Za-z0-9-]+$", description="set by the booking tool"
    )

    @field_validator("depart_date", "return_date")
    @classmethod
    def _not_in_the_past(cls, value: date | None, info: ValidationInfo) -> date | None:
        ctx = info.context or {}
        # Note: stored dates are re-validated without this check, so data does not go stale overnight.
        if value is not None and ctx.get("check_past", True):
            today = ctx.get("today") or timezone.localdate()
            if value < today:
                raise ValueError(f"{value.isoformat()} is in the past")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BookingSlots:
        if self.depart_date and self.return_date and self.return_date < self.depart_date:
            raise ValueError("the return date is before the departure date")
        if self.origin and self.destination and self.origin.casefold() == self.destination.casefold():
            raise ValueError("origin and destination are the same place")
        return self


class BookingSlotsUpdate(BaseModel):
    """Slot values the model read from the latest message. Loosely typed on purpose: a wrong value is
    reported by ``BookingSlots`` and dropped, instead of failing the whole decision."""

    model_config = ConfigDict(extra="ignore")

    origin: str | None = None
    destination: str | None = None
    depart_date: str | None = Field(default=None, description="YYYY-MM-DD")
    return_date: str | None = Field(default=None, description="YYYY-MM-DD")
    passengers: int | None = None
    flight_number: str | None = Field(default=None, description="e.g. QK7431")
    booking_reference: str | None = None


class BookingDecision(WorkflowDecision):
    """The structured output of every booking turn."""

    next_state: BookingState
    slots: BookingSlotsUpdate = Field(default_factory=BookingSlotsUpdate)


_GATHERING = ("GATHERING_ORIGIN", "GATHERING_DESTINATION", "GATHERING_DATES", "GATHERING_PASSENGERS")
_ROUTE_AND_DATES = ("origin", "destination", "depart_date", "passengers")


def _forward(after: int) -> frozenset[str]:
    return frozenset((*_GATHERING[after:], "CONFIRMING"))


TRANSITIONS: dict[str, frozenset[str]] = {
    "IDLE": _forward(0),
    "GATHERING_ORIGIN": _forward(1) | {"IDLE"},
    "GATHERING_DESTINATION": _forward(2) | {"IDLE"},
    "GATHERING_DATES": _forward(3) | {"IDLE"},
    "GATHERING_PASSENGERS": _forward(4) | {"IDLE"},
    # The back-edges: the user saw the summary and wants to change something, or start over.
    "CONFIRMING": frozenset({"BOOKING", *_GATHERING, "IDLE"}),
    # The book_flight outcomes leave BOOKING (``action_outcomes``: COMPLETED, or CONFIRMING to fix a failure);
    # a change after a failed attempt goes back to the confirmation (the new summary, asked again); starting over
    # stays possible, as everywhere.
    "BOOKING": frozenset({"CONFIRMING", "IDLE"}),
    "COMPLETED": frozenset({"IDLE"}),
    # Resume from where the data says, or start over.
    "FAILED": frozenset({"IDLE", *_GATHERING, "CONFIRMING"}),
}

SPECS = [
    StateSpec(
        name="IDLE",
        label="Getting started",
        instruction="Greet the user and find out where they want to fly.",
        asks_next_missing=True,
    ),
    StateSpec(
        name="GATHERING_ORIGIN",
        label="Where from",
        instruction="Collect the departure city or airport.",
        collects=("origin",),
        question="Where are you flying from?",
        change_question="Where would you like to fly from instead?",
    ),
    StateSpec(
        name="GATHERING_DESTINATION",
        label="Where to",
        instruction="Collect the destination city or airport.",
        collects=("destination",),
        requires=("origin",),
        question="Where would you like to fly to?",
        change_question="Where would you like to fly to instead?",
    ),
    StateSpec(
        name="GATHERING_DATES",
        label="When",
        instruction="Collect the travel dates (departure, and return if it is a round trip).",
        collects=("depart_date",),
        accepts=("return_date",),
        requires=("origin", "destination"),
        question="What dates would you like to travel (departure, and return if any)?",
        change_question="What are the new travel dates?",
    ),
    StateSpec(
        name="GATHERING_PASSENGERS",
        label="Passengers",
        instruction="Collect the number of passengers.",
        collects=("passengers",),
        requires=("origin", "destination", "depart_date"),
        question="How many passengers are travelling (1-9)?",
        change_question="How many passengers should I book for instead?",
    ),
    StateSpec(
        name="CONFIRMING",
        label="Checking the details",
        instruction=(
            "Summarize the booking ({trip}) and ask the user to confirm before booking; "
            "if they want to change something, ask what. If booking it failed, say why and offer the flights "
            "that have the seats (from the book_flight error), or fewer passengers."
        ),
        accepts=("flight_number",),
        requires=_ROUTE_AND_DATES,
    ),
    StateSpec(
        name="BOOKING",
        label="Booking",
        instruction=("Call the book_flight tool once for {trip}. Do not ask the user anything."),
        requires=_ROUTE_AND_DATES,
    ),
    StateSpec(
        name="COMPLETED",
        label="Booked",
        instruction=(
            "The flight is booked (reference {booking_reference}). Give the user the reference and offer "
            "help with another trip."
        ),
        requires=(*_ROUTE_AND_DATES, "booking_reference"),
    ),
    StateSpec(
        name="FAILED",
        label="Something went wrong",
        instruction=(
            "Something went wrong several times. Apologize briefly and clearly, then offer two choices: "
            "resume from the last good step with the details already collected, or start over."
        ),
        question="Would you like to pick up where we left off, or start over?",
    ),
]


def trip_summary(data: Mapping[str, Any]) -> str:
    """One line describing the trip collected so far ("London → Paris, 2026-03-10, one way, 2 passengers")."""
    parts = [f"{data.get('origin') or '?'} → {data.get('destination') or '?'}"]
    if data.get("depart_date"):
        parts.append(f"departing {data['depart_date']}")
    parts.append(f"returning {data['return_date']}" if data.get("return_date") else "one way")
    if data.get("passengers"):
        n = int(data["passengers"])
        parts.append(f"{n} passenger{'s' if n != 1 else ''}")
    if data.get("flight_number"):
        parts.append(f"flight {data['flight_number']}")
    return ", ".join(parts)


FLIGHT_BOOKING = Workflow(
    name="flight_booking",
    title="Flight booking",
    initial_state="IDLE",
    specs=SPECS,
    transitions=TRANSITIONS,
    terminal_states=frozenset({"COMPLETED", "FAILED"}),
    failed_state="FAILED",
    slots_model=BookingSlots,
    decision_schema=BookingDecision,
    complete_state="CONFIRMING",
    action_states={"BOOKING": "book_flight"},
    # A failed booking goes back to the confirmation, with the data, to be fixed (the engine checks it can).
    action_outcomes={"BOOKING": ("COMPLETED", "CONFIRMING")},
    describe=lambda data: {"trip": trip_summary(data)},
    # book_flight's structured output: {"reference": "…", …}
    on_action_result=lambda data: {"booking_reference": str(data["reference"]) if data.get("reference") else None},
)
