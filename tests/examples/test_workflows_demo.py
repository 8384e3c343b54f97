"""The demo model walks the booking workflow: slot parsers, the decision handler and the reply handler."""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.booking.demo import booking_reply, propose_decision, read_prompt_state
from examples.booking.slot_parsing import extract_dates, extract_passengers, extract_places
from examples.booking.workflow import FLIGHT_BOOKING as WF
from llm.base import ToolSpec
from llm.demo import demo_reply, structured_instance

TODAY = date(2026, 11, 30)
BOOK_TOOL = ToolSpec(name="book_flight", description="book", parameters={"type": "object"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("March 10-15", {"depart_date": "2027-03-10", "return_date": "2027-03-15"}),
        ("10-15 March", {"depart_date": "2027-03-10", "return_date": "2027-03-15"}),
        ("next Friday", {"depart_date": "2026-12-04"}),
        ("leaving 2027-01-05, back 2027-01-09", {"depart_date": "2027-01-05", "return_date": "2027-01-09"}),
        ("on Dec 24", {"depart_date": "2026-12-24"}),
        ("no idea yet", {}),
    ],
)
def test_dates_are_read_with_dateparser(text: str, expected: dict[str, str]) -> None:
    assert extract_dates(text, today=TODAY) == expected


@pytest.mark.parametrize(
    ("text", "bare", "expected"),
    [
        ("2 adults", False, 2),
        ("three of us", False, 3),
        ("just me", False, 1),
        ("for 4", False, 4),
        ("for 3 days", False, None),
        ("2", True, 2),
        ("2", False, None),
        ("March 10", True, None),
    ],
)
def test_passengers_from_numbers_and_words(text: str, bare: bool, expected: int | None) -> None:
    assert extract_passengers(text, bare_answer=bare) == expected


@pytest.mark.parametrize(
    ("text", "bare", "expected"),
    [
        ("I want to fly from London to New York", "", {"origin": "London", "destination": "New York"}),
        ("to Rome from Oslo next friday", "", {"origin": "Oslo", "destination": "Rome"}),
        ("I want to fly to Paris", "", {"destination": "Paris"}),
        ("ldn", "origin", {"origin": "ldn"}),
        ("Paris, please", "destination", {"destination": "Paris"}),
        ("yes", "origin", {}),
        ("Hi, I would like to book a flight", "", {}),
        # A bare answer is a place only if no word of it is a word of a sentence: these were taken as origins.
        ("I'm not sure yet", "origin", {}),
        ("I don't want to book this", "origin", {}),
        ("no idea", "destination", {}),
        ("maybe later", "destination", {}),
        ("salt lake city", "destination", {"destination": "Salt Lake City"}),
        ("I'm in Lisbon", "origin", {"origin": "Lisbon"}),
    ],
)
def test_places_from_from_to_patterns(text: str, bare: str, expected: dict[str, str]) -> None:
    assert extract_places(text, bare=bare) == expected


def _walk(messages: list[str]) -> list[tuple[str, dict[str, Any], str]]:
    """Drive the demo's decision and reply handlers through the real workflow checks, turn by turn."""
    state, data = WF.initial_state, {}
    seen = []
    for text in messages:
        prompt = WF.decision_messages(state=state, data=data, user_message=text, recent_turns=[])
        decision = structured_instance(WF.decision_schema, prompt)
        result = WF.step(state=state, data=data, decision=decision)
        assert result.applied, result.errors
        state, data = result.to_state, result.data
        system = WF.resume_instruction(state, data)
        reply = demo_reply([{"role": "system", "content": system}, {"role": "user", "content": text}], [BOOK_TOOL])
        seen.append((state, data, reply.text or json.dumps([c.arguments for c in reply.tool_calls])))
    return seen


def test_demo_walks_the_booking_with_a_back_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt

    from django.utils import timezone

    # "April 3" is the next April 3 after today: fix today, or the expected year goes stale each April.
    monkeypatch.setattr(timezone, "localdate", lambda *args, **kwargs: dt.date(2026, 12, 1))
    steps = _walk(
        [
            "Hi, I want to book a flight",
            "from London",
            "to Paris",
            "March 10-15",
            "two of us",
            "change the dates",
            "April 3 to April 9",
            "yes",
        ]
    )
    states = [s for s, _, _ in steps]
    assert states == [
        "GATHERING_ORIGIN",
        "GATHERING_DESTINATION",
        "GATHERING_DATES",
        "GATHERING_PASSENGERS",
        "CONFIRMING",
        "GATHERING_DATES",
        "CONFIRMING",
        "BOOKING",
    ]
    assert steps[1][2] == "Got it: from London. Where would you like to fly to?"
    assert "Shall I book it?" in steps[4][2] and "London → Paris" in steps[4][2]
    assert steps[5][2] == "What are the new travel dates?"
    data = steps[-1][1]
    assert (data["depart_date"], data["return_date"], data["passengers"]) == ("2027-04-03", "2027-04-09", 2)
    args = json.loads(json.loads(steps[-1][2])[0])
    assert args == {
        "origin": "London",
        "destination": "Paris",
        "depart_date": "2027-04-03",
        "return_date": "2027-04-09",
        "passengers": 2,
    }


def test_one_message_with_everything_goes_straight_to_confirming() -> None:
    steps = _walk(["I want to fly from Oslo to Rome on March 10 for 3 people"])
    assert steps[0][0] == "CONFIRMING" and steps[0][1]["passengers"] == 3


def test_start_over_and_resume_from_failed() -> None:
    data = {"origin": "Oslo", "destination": "Rome", "depart_date": "2027-03-10"}
    resume = propose_decision(state="FAILED", collected=data, user_message="let's continue", today=TODAY)
    assert resume.next_state == "GATHERING_PASSENGERS"
    over = propose_decision(state="FAILED", collected=data, user_message="start over please", today=TODAY)
    assert over.next_state == "IDLE"


def test_reply_reports_the_tool_result_and_the_tool_error() -> None:
    system = WF.resume_instruction(
        "BOOKING", {"origin": "Oslo", "destination": "Rome", "depart_date": "2027-03-10", "passengers": 1}
    )
    base = [{"role": "system", "content": system}, {"role": "user", "content": "yes"}]
    ok = booking_reply(
        [*base, {"role": "tool", "tool_call_id": "c1", "content": '{"reference": "BK7Q2X"}'}], [BOOK_TOOL]
    )
    assert ok is not None and "BK7Q2X" in ok.text
    failed = booking_reply(
        [*base, {"role": "tool", "tool_call_id": "c1", "content": "TOOL_ERROR: timeout after 5s"}], [BOOK_TOOL]
    )
    assert failed is not None and "did not go through: timeout after 5s" in failed.text


def test_reply_declines_prompts_that_are_not_booking_prompts() -> None:
    assert (
        booking_reply([{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "hi"}], None)
        is None
    )
    assert read_prompt_state("CURRENT_STATE: IDLE") is None  # no WORKFLOW line: not ours


_reachable_data = st.fixed_dictionaries(
    {},
    optional={
        "origin": st.sampled_from(["London", "Oslo"]),
        "destination": st.sampled_from(["Paris", "Rome"]),
        "depart_date": st.sampled_from(["2027-03-10", "2027-05-01"]),
        "return_date": st.just("2027-06-01"),
        "passengers": st.integers(min_value=1, max_value=9),
    },
)
_QUESTION_FOR = {
    "origin": re.compile(r"flying from|fly from", re.I),
    "destination": re.compile(r"fly to\b", re.I),
    "depart_date": re.compile(r"\bdates?\b", re.I),
    "passengers": re.compile(r"how many", re.I),
}


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(WF.states), _reachable_data, st.sampled_from(["ok", "from London", "2", "March 10", "hi"]))
def test_demo_reply_never_asks_for_an_already_collected_slot(state: str, data: dict[str, Any], said: str) -> None:
    if WF.missing_for(state, data) or (state == "COMPLETED"):
        return  # not a state the machine can be in with this data
    reply = booking_reply(
        [{"role": "system", "content": WF.resume_instruction(state, data)}, {"role": "user", "content": said}],
        [BOOK_TOOL],
    )
    assert reply is not None
    own = WF.specs[state].collects  # a deliberate back-edge re-asks its own slot
    for slot, pattern in _QUESTION_FOR.items():
        if slot in data and slot not in own:
            assert not pattern.search(reply.text), (state, data, reply.text)


def test_confirming_a_question_that_mentions_a_day_is_not_a_change_request() -> None:
    from examples.booking.demo import propose_decision

    collected = {"origin": "London", "destination": "Paris", "depart_date": "2027-03-10", "passengers": 2}
    decision = propose_decision(
        state="CONFIRMING", collected=collected, user_message="Which day of the week is that?", today=date(2026, 12, 1)
    )
    assert decision.next_state == "CONFIRMING"
    changed = propose_decision(
        state="CONFIRMING", collected=collected, user_message="Please change the dates", today=date(2026, 12, 1)
    )
    assert changed.next_state == "GATHERING_DATES"


def test_a_stated_change_of_a_collected_place_is_applied() -> None:
    data = {"origin": "London", "destination": "Paris"}
    for said in ("make that Rome instead of Paris", "Rome instead of Paris, please", "not Paris but Rome"):
        decision = propose_decision(state="GATHERING_DATES", collected=data, user_message=said, today=TODAY)
        merged, errors = WF.merge_slots(data, decision.slots, today=TODAY)
        assert (merged["destination"], merged["origin"], errors) == ("Rome", "London", []), said


@pytest.mark.parametrize(
    ("said", "collected"),
    [
        # The walk of 2026-12-03: the destination became "Paris instead of Berlin", and was booked.
        ("Actually… I want to go to Paris instead of Berlin", {"origin": "London", "destination": "Berlin"}),
        ("I'd rather fly to Paris instead of Berlin.", {"origin": "London", "destination": "Berlin"}),
        ("Actually I want to go to Paris instead of Berlin", {"origin": "London"}),  # no Berlin collected yet
        ("to Paris rather than Berlin", {"origin": "London"}),
    ],
)
def test_x_instead_of_y_changes_the_slot_to_x_exactly(said: str, collected: dict[str, Any]) -> None:
    decision = propose_decision(state="GATHERING_DATES", collected=collected, user_message=said, today=TODAY)
    merged, errors = WF.merge_slots(collected, decision.slots, today=TODAY)
    assert (merged["destination"], merged["origin"], errors) == ("Paris", "London", []), said


@pytest.mark.parametrize("sentence", ["Paris instead of Berlin", "I want to go to Paris", "not Paris but Rome"])
def test_a_place_slot_refuses_a_sentence(sentence: str) -> None:
    merged, errors = WF.merge_slots({"origin": "London"}, {"destination": sentence}, today=TODAY)
    assert "destination" not in merged and errors and "city or airport" in errors[0]


@pytest.mark.parametrize(
    ("said", "reason"),
    [
        ("250 passengers", "passengers: at most 9"),
        ("10 passengers", "passengers: at most 9"),
        ("0 passengers", "passengers: at least 1"),
        ("on the 31st of February", "depart_date: there is no 31 February"),
        ("April 31", "depart_date: there is no 31 April"),
    ],
)
def test_a_refused_value_says_why_in_words(said: str, reason: str) -> None:
    data = {"origin": "London", "destination": "Paris", "depart_date": "2027-03-10"}
    decision = propose_decision(state="GATHERING_PASSENGERS", collected=data, user_message=said, today=TODAY)
    merged, errors = WF.merge_slots(data, decision.slots, today=TODAY)
    assert errors == [reason] and merged == data
    assert "Input should be" not in WF.refusal_text(errors[0])


def test_a_booked_trip_is_not_changed_by_later_words() -> None:
    booked = {
        "origin": "London",
        "destination": "Paris",
        "depart_date": "2027-03-10",
        "passengers": 2,
        "booking_reference": "AB12CD",
    }
    said = "I am allergic to peanuts"
    decision = propose_decision(state="COMPLETED", collected=booked, user_message=said, today=TODAY)
    assert decision.next_state == "COMPLETED" and decision.slots.model_dump(exclude_none=True) == {}
    # Whatever a model proposes, the workflow keeps a finished run as it is and says why.
    model_says = WF.decision(next_state="COMPLETED", slots={"destination": "Peanuts"}, reasoning="misread")
    step = WF.step(state="COMPLETED", data=booked, decision=model_says, today=TODAY)
    assert step.to_state == "COMPLETED" and step.data == booked
    assert step.slot_errors == [
        "destination: the flight booking is finished, so it is not changed; start a new one to change it"
    ]
    # Leaving it for a new trip is still possible.
    new_trip = WF.step(state="COMPLETED", data=booked, decision=WF.decision(next_state="IDLE"), today=TODAY)
    assert new_trip.applied and new_trip.to_state == "IDLE"


def test_asking_for_a_person_is_part_of_the_decision() -> None:
    data = {"origin": "London"}
    for said in ("I want to talk to a human", "can I speak with a real person?", "connect me to an agent please"):
        decision = propose_decision(state="GATHERING_DESTINATION", collected=data, user_message=said, today=TODAY)
        assert decision.wants_person is True and decision.next_state == "GATHERING_DESTINATION", said
    for said in ("Paris", "the person travelling is my wife", "book it for 2 people"):
        decision = propose_decision(state="GATHERING_DESTINATION", collected=data, user_message=said, today=TODAY)
        assert decision.wants_person is False, said
