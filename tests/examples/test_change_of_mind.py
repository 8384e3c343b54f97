"""A change of mind in the words people use, read by the demo model's booking parsers (examples/booking).

The phrasings were written from how people correct a booking they have just seen summarised (London → Berlin,
15 January 2027, 2 passengers), with and without commas and capitals: never the code's own examples. Each row
says what the person means; a row that reads something else, or nothing, fails.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest

from examples.booking.slot_parsing import extract_slots
from examples.booking.workflow import BookingSlots

TODAY = date(2026, 12, 7)
BOOKED = {"origin": "London", "destination": "Berlin", "depart_date": "2027-01-15", "passengers": 2}

CHANGES: list[tuple[str, dict[str, Any]]] = [
    # The destination.
    ("Actually Paris instead of Berlin", {"destination": "Paris"}),
    ("actually Paris", {"destination": "Paris"}),
    ("make it Paris instead", {"destination": "Paris"}),
    ("Actually, make that Paris.", {"destination": "Paris"}),
    ("sorry I meant Paris not Berlin", {"destination": "Paris"}),
    ("no wait, Paris", {"destination": "Paris"}),
    ("Oops, Paris, not Berlin!", {"destination": "Paris"}),
    ("can we do Paris instead?", {"destination": "Paris"}),
    ("let's go with Paris", {"destination": "Paris"}),
    ("hmm how about Paris then", {"destination": "Paris"}),
    ("I'd rather go to Paris", {"destination": "Paris"}),
    ("change Berlin to Paris please", {"destination": "Paris"}),
    ("change the destination to Paris", {"destination": "Paris"}),
    ("swap Berlin for Paris", {"destination": "Paris"}),
    ("not Berlin but Paris", {"destination": "Paris"}),
    ("Berlin -> Paris", {"destination": "Paris"}),
    ("Instead of Berlin, Paris please", {"destination": "Paris"}),
    ("paris rather than berlin", {"destination": "Paris"}),
    ("On second thought, fly me to Paris", {"destination": "Paris"}),
    ("Actually I want to go to Paris, not Berlin", {"destination": "Paris"}),
    ("I said Paris, not Berlin", {"destination": "Paris"}),
    ("Could you change it to Amsterdam?", {"destination": "Amsterdam"}),
    ("make it Rome instead, same dates", {"destination": "Rome"}),
    ("actually new york", {"destination": "New York"}),
    # The origin.
    ("actually from Manchester", {"origin": "Manchester"}),
    ("Sorry, I'm flying out of Manchester, not London", {"origin": "Manchester"}),
    ("change the origin to Manchester", {"origin": "Manchester"}),
    ("Leaving from Leeds instead", {"origin": "Leeds"}),
    ("make that Manchester instead of London", {"origin": "Manchester"}),
    ("the departure city should be Bristol", {"origin": "Bristol"}),
    # The dates.
    ("actually make it January 20", {"depart_date": "2027-01-20"}),
    ("Can we change the date to Jan 20 instead?", {"depart_date": "2027-01-20"}),
    ("sorry, the 20th of January, not the 15th", {"depart_date": "2027-01-20"}),
    ("Jan 20 instead of Jan 15", {"depart_date": "2027-01-20"}),
    ("make it the 22nd of January please", {"depart_date": "2027-01-22"}),
    ("Push it back to January 22", {"depart_date": "2027-01-22"}),
    ("and the return should be Jan 25 instead", {"return_date": "2027-01-25"}),
    ("flying back on the 25th of January", {"return_date": "2027-01-25"}),
    # The passengers.
    ("make it 3", {"passengers": 3}),
    ("actually three of us", {"passengers": 3}),
    ("sorry, 3 passengers not 2", {"passengers": 3}),
    ("change the passengers to 4", {"passengers": 4}),
    ("Actually it'll just be me", {"passengers": 1}),
    ("can we make it 1 passenger instead", {"passengers": 1}),
    ("My sister's joining, so make it three", {"passengers": 3}),
    ("the number of passengers should be 4", {"passengers": 4}),
    # Two at once.
    ("Actually Paris, and make it 3 people", {"destination": "Paris", "passengers": 3}),
    ("Rome instead, and 4 of us", {"destination": "Rome", "passengers": 4}),
]

NOT_CHANGES = [
    "yes",
    "Yes please, book it",
    "Is Paris nice in winter?",
    "not sure, what do you think?",
    "No thanks",
    "Actually that's perfect, book it",
    "Paris sounds lovely but I'll stick with Berlin",
    "sorry, what was the price again?",
    "hmm, let me think",
]


@pytest.mark.parametrize(("said", "meant"), CHANGES, ids=[said for said, _ in CHANGES])
def test_a_change_of_mind_is_read_as_meant(said: str, meant: dict[str, Any]) -> None:
    found = extract_slots(said, today=TODAY, current=BOOKED)
    assert found == meant
    # And what it reads is a valid booking: a sentence never becomes a city.
    BookingSlots.model_validate({**BOOKED, **found})


@pytest.mark.parametrize("said", NOT_CHANGES)
def test_words_that_change_nothing_change_nothing(said: str) -> None:
    assert extract_slots(said, today=TODAY, current=BOOKED) == {}


def test_the_table_is_the_size_the_issue_asks() -> None:
    assert len(CHANGES) >= 40 and len({said.lower() for said, _ in CHANGES}) == len(CHANGES)


@pytest.mark.django_db(transaction=True)
def test_actually_paris_instead_of_berlin_books_paris_after_a_new_summary(alice: Any) -> None:
    """The walk of issue 55, on the demo model through real turns: the change shows a Paris summary and asks
    again; "yes" books Paris."""
    from examples.booking.models import Booking
    from orchestrator.runtime import turn_run
    from sessions.services import session_create
    from tests.world import make_agent

    session = session_create(user=alice, agent=make_agent("booking", slug="booker"))
    day = "2027-01-15"
    first = turn_run(session=session, message=f"book a flight from London to Berlin on {day} for 2 passengers")
    assert "Berlin" in first.reply and "Shall I book it?" in first.reply
    changed = turn_run(session=session, message="Actually Paris instead of Berlin")
    assert "Paris" in changed.reply and "Berlin" not in changed.reply and "Shall I book it?" in changed.reply
    assert "I could not use that" not in changed.reply
    turn_run(session=session, message="yes")
    booking = Booking.objects.get(session=session)
    assert booking.destination == "Paris" and booking.origin == "London" and booking.passengers == 2
