"""Workflows as FSMs: definitions, slot validation, resume instructions, and their invariants (hypothesis)."""

from __future__ import annotations

import json
import re
from datetime import date, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agents.workflows import (
    FREE_CHAT,
    UnknownWorkflowError,
    get_workflow,
    workflow_choices,
)
from examples.booking.workflow import FLIGHT_BOOKING

TODAY = date(2026, 11, 30)
WF = FLIGHT_BOOKING
COMPLETE = {"origin": "London", "destination": "Paris", "depart_date": "2027-03-10", "passengers": 2}


def decide(next_state: str, **slots: Any) -> Any:
    return WF.decision_schema.model_validate({"next_state": next_state, "slots": slots, "confidence": 0.9})


@pytest.mark.django_db  # the choices include the workflows declared in the admin
def test_registry_knows_the_shipped_workflows() -> None:
    assert get_workflow("flight_booking") is FLIGHT_BOOKING
    assert get_workflow("free_chat") is FREE_CHAT
    assert ("flight_booking", "Flight booking") in workflow_choices()
    with pytest.raises(UnknownWorkflowError, match="free_chat"):
        get_workflow("no_such_flow")


def test_booking_states_and_back_edges_follow_the_seed() -> None:
    assert WF.states == (
        "IDLE",
        "GATHERING_ORIGIN",
        "GATHERING_DESTINATION",
        "GATHERING_DATES",
        "GATHERING_PASSENGERS",
        "CONFIRMING",
        "BOOKING",
        "COMPLETED",
        "FAILED",
    )
    assert WF.can_transition("CONFIRMING", "GATHERING_DATES")  # the seed's back-edge
    assert WF.can_transition("FAILED", "CONFIRMING") and WF.can_transition("FAILED", "IDLE")
    assert WF.can_transition("COMPLETED", "IDLE")
    # Never straight to BOOKING without confirming; the tool's outcomes (and starting over) leave BOOKING.
    assert not any(WF.can_transition(s, "BOOKING") for s in WF.states if s not in ("CONFIRMING", "BOOKING"))
    assert WF.transitions["BOOKING"] == frozenset({"COMPLETED", "CONFIRMING", "IDLE"})
    # A gathering state cannot wander back and re-ask an answered question.
    assert not WF.can_transition("GATHERING_PASSENGERS", "GATHERING_DATES")
    assert WF.action_states == {"BOOKING": "book_flight"}
    # A failed booking goes back to the confirmation with its data, to be fixed (issue 36).
    assert WF.action_outcomes == {"BOOKING": ("COMPLETED", "CONFIRMING")}
    assert WF.recovery_state("BOOKING") == "CONFIRMING" and WF.recovery_state("CONFIRMING") is None
    assert WF.failed_state == "FAILED" and "COMPLETED" in WF.terminal_states
    assert not WF.is_free_chat and FREE_CHAT.is_free_chat
    assert WF.decides_in("FAILED") and not FREE_CHAT.decides_in("CHATTING")


def test_decision_schema_is_a_literal_of_the_states() -> None:
    schema = WF.decision_schema.model_json_schema()
    assert schema["properties"]["next_state"]["enum"] == list(WF.states)
    with pytest.raises(ValidationError, match="next_state"):
        WF.decision_schema.model_validate({"next_state": "TELEPORTING", "slots": {}, "confidence": 0.5})
    with pytest.raises(ValidationError, match="confidence"):
        WF.decision_schema.model_validate({"next_state": "IDLE", "slots": {}, "confidence": 1.5})
    # "slots": null from a model means "nothing said", not an error.
    assert (
        WF.decision_schema.model_validate({"next_state": "IDLE", "slots": None}).slots.model_dump(exclude_none=True)
        == {}
    )


@pytest.mark.parametrize(
    ("update", "error"),
    [
        ({"passengers": 0}, "passengers"),
        ({"passengers": 10}, "passengers"),
        ({"origin": "x"}, "origin"),
        ({"origin": "1234"}, "origin"),
        ({"origin": "L" * 81}, "origin"),
        ({"depart_date": "2026-11-29"}, "in the past"),
        ({"depart_date": "tomorrow-ish"}, "depart_date"),
        ({"colour": "blue"}, "not a slot"),
    ],
)
def test_merge_slots_refuses_invalid_values_and_keeps_the_rest(update: dict[str, Any], error: str) -> None:
    merged, errors = WF.merge_slots({"origin": "Oslo"}, {**update, "destination": " Rome "}, today=TODAY)
    assert merged["destination"] == "Rome"  # stripped, and kept despite the other error
    assert merged["origin"] == "Oslo"  # an invalid new origin never replaces the stored one
    assert any(error in e for e in errors), errors


def test_merge_slots_cross_field_rules() -> None:
    merged, errors = WF.merge_slots({"depart_date": "2027-03-10"}, {"return_date": "2027-03-01"}, today=TODAY)
    assert "return_date" not in merged and any("before the departure" in e for e in errors)
    merged, errors = WF.merge_slots({"origin": "Paris"}, {"destination": "paris"}, today=TODAY)
    assert "destination" not in merged and errors
    # Changing both dates at once is accepted even though the new departure is after the old return.
    merged, errors = WF.merge_slots(
        {"depart_date": "2027-03-10", "return_date": "2027-03-15"},
        {"depart_date": "2027-04-03", "return_date": "2027-04-09"},
        today=TODAY,
    )
    assert (merged["depart_date"], merged["return_date"], errors) == ("2027-04-03", "2027-04-09", [])


def test_a_stored_date_does_not_go_stale_when_it_passes() -> None:
    # Validated on the day it was given; a later merge must not throw it away.
    merged, errors = WF.merge_slots({"depart_date": "2026-01-01"}, {"passengers": 3}, today=TODAY)
    assert merged == {"depart_date": "2026-01-01", "passengers": 3} and errors == []


def test_step_skips_forward_only_when_the_target_has_its_slots() -> None:
    ok = WF.step(
        state="IDLE", data={}, decision=decide("GATHERING_DATES", origin="Oslo", destination="Rome"), today=TODAY
    )
    assert ok.applied and ok.to_state == "GATHERING_DATES"
    refused = WF.step(state="IDLE", data={}, decision=decide("CONFIRMING", origin="Oslo"), today=TODAY)
    assert not refused.applied and refused.to_state == "IDLE" and refused.data == {}
    assert any("CONFIRMING needs" in e for e in refused.errors)


def test_step_invalid_transition_changes_nothing() -> None:
    data = dict(COMPLETE)
    result = WF.step(state="GATHERING_PASSENGERS", data=data, decision=decide("COMPLETED", passengers=4), today=TODAY)
    assert not result.applied and result.to_state == "GATHERING_PASSENGERS" and result.data == COMPLETE


def test_start_over_clears_the_data() -> None:
    result = WF.step(state="CONFIRMING", data=COMPLETE, decision=decide("IDLE"), today=TODAY)
    assert result.applied and result.to_state == "IDLE" and result.data == {}


def test_resume_instruction_lists_known_data_and_asks_the_next_question() -> None:
    text = WF.resume_instruction(
        "GATHERING_PASSENGERS", {k: COMPLETE[k] for k in ("origin", "destination", "depart_date")}
    )
    assert "CURRENT_STATE: GATHERING_PASSENGERS" in text
    assert "Already collected: origin=London, destination=Paris, depart_date=2027-03-10 — do not ask" in text
    assert "Next question: How many passengers" in text
    collected = json.loads(re.search(r"^COLLECTED: (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert collected == {"origin": "London", "destination": "Paris", "depart_date": "2027-03-10"}


def test_back_edge_asks_only_for_the_new_value() -> None:
    text = WF.resume_instruction("GATHERING_DATES", COMPLETE)
    assert "Next question: What are the new travel dates?" in text
    assert "change depart_date=2027-03-10" in text


def test_decision_messages_carry_state_data_and_history() -> None:
    messages = WF.decision_messages(
        state="GATHERING_DATES",
        data={"origin": "Oslo"},
        user_message="March 10",
        recent_turns=[("from Oslo", "Where to?")],
    )
    system = messages[0]["content"]
    assert "CURRENT_STATE: GATHERING_DATES" in system and 'COLLECTED: {"origin": "Oslo"}' in system
    assert "ALLOWED_NEXT_STATES: CONFIRMING, GATHERING_DATES, GATHERING_PASSENGERS, IDLE" in system
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[-1]["content"] == "March 10"


# --- the seed's death spiral -------------------------------------------------------------------------------
_DATE_WORDS = re.compile(r"\b(date|dates|when|day)\b", re.IGNORECASE)


@pytest.mark.parametrize("state", ["GATHERING_PASSENGERS", "CONFIRMING", "BOOKING", "COMPLETED"])
def test_death_spiral_dates_are_never_asked_again_in_later_states(state: str) -> None:
    # Only session.data remains: the turns that collected the dates have left the prompt.
    data = {**COMPLETE, "return_date": "2027-03-15", "booking_reference": "ABC123"}
    if state == "GATHERING_PASSENGERS":
        data.pop("passengers")
    text = WF.resume_instruction(state, data)
    question = re.search(r"^Next question: (.*)$", text, re.M)
    assert question is None or not _DATE_WORDS.search(question.group(1))
    assert "depart_date=2027-03-10" in text and "do not ask for these again" in text


# --- properties ------------------------------------------------------------------------------------------
_place = st.one_of(
    st.sampled_from(["London", "Paris", "New York", "ldn", "São Paulo", "Zürich"]),
    st.text(max_size=90),
)
_day = st.one_of(
    st.dates(min_value=TODAY - timedelta(days=30), max_value=TODAY + timedelta(days=400)).map(date.isoformat),
    st.text(max_size=12),
)
_slots = st.fixed_dictionaries(
    {},
    optional={
        "origin": _place,
        "destination": _place,
        "depart_date": _day,
        "return_date": _day,
        "passengers": st.integers(min_value=-3, max_value=15),
        "booking_reference": st.sampled_from(["ABC123", "x", "BK-2027-001"]),
    },
)
_decisions = st.builds(
    lambda state, slots, confidence: {"next_state": state, "slots": slots, "confidence": confidence},
    st.sampled_from(WF.states),
    _slots,
    st.floats(min_value=0, max_value=1),
)


def _slot_valid(name: str, value: Any) -> bool:
    _, errors = WF.merge_slots({}, {name: value}, today=TODAY - timedelta(days=400))
    return not errors


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_decisions, max_size=25))
def test_no_sequence_of_outputs_makes_a_forbidden_transition_or_loses_data(decisions: list[dict[str, Any]]) -> None:
    state, data = WF.initial_state, {}
    for raw in decisions:
        decision = WF.decision_schema.model_validate(raw)
        result = WF.step(state=state, data=data, decision=decision, today=TODAY)
        if result.applied:
            assert WF.can_transition(state, result.to_state)
            assert not WF.missing_for(result.to_state, result.data) or WF.clears_data_on_entry(state, result.to_state)
            if WF.clears_data_on_entry(state, result.to_state):
                assert result.data == {}  # start over: explicit, and the old data stays in the checkpoint log
            else:
                assert set(data) <= set(result.data)  # nothing collected is ever dropped
        else:
            assert (result.to_state, result.data) == (state, data)
        for name, value in result.data.items():
            assert _slot_valid(name, value), (name, value)
        state, data = result.to_state, result.data


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(WF.states), _slots)
def test_the_question_never_asks_for_a_settled_slot(state: str, raw: dict[str, Any]) -> None:
    data, _ = WF.merge_slots({}, raw, today=TODAY)
    if WF.missing_for(state, data):
        return  # the machine cannot be here with this data
    asked = WF.asked_slots(state, data)
    own = WF.specs[state].collects
    # A question is either about a missing slot, or this state's own slot after a deliberate back-edge.
    assert all(s not in data or s in own for s in asked)
