"""A workflow's decision inside its reply's own call (issue 54): one structured output a turn, the decision's fields
first and the reply last, streamed to the user while it is written. The decision is settled before a word is shown;
when it is invalid, unsure or refused, nothing of that reply is shown and the turn makes the separate reply call (as
today's two-call turn). An endpoint that cannot stream structured output keeps the separate decision and says so.
Real HTTP: the fake OpenAI server (tests/fakes/openai_server.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents.models import Agent, LLMCall, ToolInvocation
from llm.capabilities import forget_all
from orchestrator.runtime import turn_run, turn_stream
from orchestrator.steps import decision_path
from sessions.models import Checkpoint, Turn
from sessions.services import session_create
from tests.fakes.openai_server import error, json_reply, stream, tool_call, tool_names
from tests.world import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def booker(db: Any) -> Agent:
    forget_all()
    return make_agent("booking", slug="booker")


def decided(next_state: str, reply: str, *, confidence: float = 0.9, **slots: Any) -> str:
    """The JSON a model writes for a booking turn: the decision first, then the reply."""
    return json.dumps(
        {
            "next_state": next_state,
            "slots": slots,
            "confidence": confidence,
            "reasoning": "what the user said",
            "wants_person": False,
            "reply": reply,
        }
    )


def _deltas(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "delta")


def test_a_workflow_turn_that_needs_no_tool_makes_exactly_one_model_call(
    alice: Any, booker: Agent, remote_model: Any
) -> None:
    said = "Lisbon it is. Where would you like to fly to?"
    remote_model.enqueue(stream(decided("GATHERING_DESTINATION", said, origin="Lisbon")))
    session = session_create(user=alice, agent=booker)
    events = list(turn_stream(session=session, message="I want to fly from Lisbon"))

    requests = remote_model.chat_requests()
    assert len(requests) == 1  # before: the workflow's structured decision call, then the reply's
    body = requests[0].body
    assert body.get("stream") is True and body["response_format"]["type"] == "json_schema"
    assert list(body["response_format"]["json_schema"]["schema"]["properties"])[-1] == "reply"
    system = requests[0].messages[0]["content"]
    assert "ALLOWED_NEXT_STATES" in system and system.count("Reply with exactly one JSON object") == 1
    session.refresh_from_db()
    assert (session.state, session.data["origin"]) == ("GATHERING_DESTINATION", "Lisbon")
    turn = Turn.objects.get(session=session)
    assert (turn.status, turn.assistant_message) == (Turn.Status.COMPLETED, said)
    assert _deltas(events) == said  # the reply's text only, never the JSON around it
    assert list(LLMCall.objects.filter(turn=turn).values_list("purpose", flat=True)) == ["reply"]
    assert turn.composition["route"]["path"] == "in_reply" and turn.composition["route"]["decision"] == "applied"
    assert turn.composition["calls"]["calls"] == 1
    # The decision is applied (its state event) before the first word of the reply reaches the user.
    first_delta = next(i for i, e in enumerate(events) if e["type"] == "delta")
    assert any(e["type"] == "state" and e["state"] == "GATHERING_DESTINATION" for e in events[:first_delta])
    assert session.checkpoints.filter(turn=turn, reason=Checkpoint.Reason.TRANSITION).count() == 1
    assert decision_path(booker) == "workflow_in_reply"


def test_an_invalid_decision_inside_the_call_takes_the_safe_default_and_records_why(
    alice: Any, booker: Agent, remote_model: Any
) -> None:
    remote_model.enqueue(
        stream(decided("SOMEWHERE_ELSE", "Booked you to the moon!", origin="Lisbon")),
        stream("Sorry, where are you flying from?"),
    )
    session = session_create(user=alice, agent=booker)
    events = list(turn_stream(session=session, message="from Lisbon"))

    session.refresh_from_db()
    assert session.state == "IDLE" and not session.data.get("origin")  # nothing changed
    assert "moon" not in _deltas(events)  # the reply written for the invalid decision is never shown
    turn = Turn.objects.get(session=session)
    assert turn.assistant_message == "Sorry, where are you flying from?"
    assert turn.composition["route"]["decision"] == "invalid"
    why = session.checkpoints.get(turn=turn, reason=Checkpoint.Reason.RETRY).detail
    assert "no valid workflow decision" in why and "inside the reply" in why
    assert any(e["type"] == "state" and "No valid decision" in e.get("error", "") for e in events)
    assert len(remote_model.chat_requests()) == 2
    assert "response_format" not in remote_model.chat_requests()[1].body  # the separate reply asks again


def test_a_low_confidence_decision_inside_the_call_stays_put_and_records_why(
    alice: Any, booker: Agent, remote_model: Any
) -> None:
    remote_model.enqueue(
        stream(decided("GATHERING_DESTINATION", "Great, Lisbon!", confidence=0.2, origin="Lisbon")),
        stream("Just to be sure: where are you flying from?"),
    )
    session = session_create(user=alice, agent=booker)
    events = list(turn_stream(session=session, message="maybe lisbon or porto, not sure"))

    session.refresh_from_db()
    assert session.state == "IDLE" and not session.data.get("origin")
    assert "Great, Lisbon" not in _deltas(events)
    turn = Turn.objects.get(session=session)
    detail = session.checkpoints.get(turn=turn, reason=Checkpoint.Reason.INVALID_TRANSITION).detail
    assert "confidence 0.20 below" in detail
    assert turn.composition["route"]["decision"] == "unsure"
    assert turn.assistant_message == "Just to be sure: where are you flying from?"


def test_a_refused_transition_never_leaves_a_reply_that_claims_it(alice: Any, booker: Agent, remote_model: Any) -> None:
    # CONFIRMING needs every detail: the FSM refuses it with only the origin known.
    remote_model.enqueue(
        stream(decided("CONFIRMING", "All set: your trip is ready to book. Shall I book it?", origin="Lisbon")),
        stream("I still need to know where you are flying to."),
    )
    session = session_create(user=alice, agent=booker)
    events = list(turn_stream(session=session, message="Lisbon, and just book it"))

    session.refresh_from_db()
    assert session.state == "IDLE"
    assert "ready to book" not in _deltas(events)
    assert any(e["type"] == "state" and e.get("rejected") for e in events)
    turn = Turn.objects.get(session=session)
    assert turn.composition["route"]["decision"] == "refused"
    assert turn.assistant_message == "I still need to know where you are flying to."
    # The stopped call is recorded as stopped, not as a failure.
    first = LLMCall.objects.filter(turn=turn).order_by("pk").first()
    assert first is not None and (first.outcome, first.finish_reason) == ("ok", "stopped")


def test_a_refused_slot_value_is_explained_by_the_separate_reply_not_claimed(
    alice: Any, booker: Agent, remote_model: Any
) -> None:
    remote_model.enqueue(
        stream(decided("GATHERING_PASSENGERS", "Flying on 1 January 2020, noted!", depart_date="2020-01-01")),
        stream("That date is in the past; which date would you like?"),
    )
    session = session_create(user=alice, agent=booker, title="")
    session.state, session.data = "GATHERING_DATES", {"origin": "Lisbon", "destination": "Oslo"}
    session.save(update_fields=["state", "data"])
    events = list(turn_stream(session=session, message="on 1 January 2020"))

    assert "noted" not in _deltas(events)
    second = remote_model.chat_requests()[1].messages[0]["content"]
    assert "NOT ACCEPTED" in second and "in the past" in second  # the separate reply is told what was refused
    assert Turn.objects.get(session=session).composition["route"]["decision"] == "refused"


def test_an_endpoint_that_cannot_stream_structured_output_falls_back_to_two_calls_and_says_so(
    alice: Any, booker: Agent, remote_model: Any
) -> None:
    refusal = "response_format is not supported together with stream"
    remote_model.enqueue(
        error(400, refusal),
        error(400, refusal),
        error(400, refusal),
        json_reply({"next_state": "GATHERING_DESTINATION", "slots": {"origin": "Lisbon"}, "confidence": 0.9}),
        stream("Where to?"),
    )
    session = session_create(user=alice, agent=booker)
    result = turn_run(session=session, message="from Lisbon")

    assert result.turn.status == Turn.Status.COMPLETED and result.reply == "Where to?"
    session.refresh_from_db()
    assert session.state == "GATHERING_DESTINATION"
    route = result.turn.composition["route"]
    assert route["path"] == "workflow_call" and "in_reply refused" in route["fallback"]
    purposes = list(
        LLMCall.objects.filter(turn=result.turn, outcome="ok").order_by("pk").values_list("purpose", flat=True)
    )
    assert purposes == ["slots", "reply"]
    # Remembered: the next turn, and /ops/, take the two-call path at once.
    assert decision_path(booker) == "workflow_call"
    remote_model.enqueue(
        json_reply({"next_state": "GATHERING_DATES", "slots": {"destination": "Oslo"}, "confidence": 0.9}),
        stream("When?"),
    )
    assert turn_run(session=session, message="to Oslo").reply == "When?"
    assert len(remote_model.chat_requests()) == 7


def test_a_reply_that_needs_a_tool_says_so_in_the_decision_and_the_tool_runs_before_the_reply(
    alice: Any, remote_model: Any
) -> None:
    flights = make_agent("booking", slug="flights-booker", tools=["search_flights"])
    needs = {k: v for k, v in json.loads(decided("GATHERING_DESTINATION", "", origin="Lisbon")).items() if k != "reply"}
    args = {"origin": "Lisbon", "destination": "Oslo", "date": "2031-06-01"}
    remote_model.enqueue(
        stream(json.dumps({**needs, "needs_tool": True, "reply": "I will make something up"})),
        stream(tool_calls=[tool_call("search_flights", args)], finish_reason="tool_calls"),
        stream("Two flights leave Lisbon that day. Where to?"),
    )
    session = session_create(user=alice, agent=flights)
    events = list(turn_stream(session=session, message="From Lisbon: which flights are there on 1 June 2031?"))

    assert "make something up" not in _deltas(events)
    requests = remote_model.chat_requests()
    assert "search_flights" in requests[0].messages[0]["content"]  # the guide names the tools it may need
    assert tool_names(requests[1]) == ["search_flights"] and "response_format" not in requests[1].body
    turn = Turn.objects.get(session=session)
    assert turn.assistant_message == "Two flights leave Lisbon that day. Where to?"
    assert turn.composition["route"]["decision"] == "use_tools" and len(requests) == 3
    assert ToolInvocation.objects.filter(turn=turn, name="search_flights").count() == 1
    session.refresh_from_db()
    assert session.state == "GATHERING_DESTINATION"  # the decision stands; the tool ran once


def test_a_reply_cut_off_after_its_decision_is_continued_once_and_the_decision_is_not_taken_again(
    alice: Any, booker: Agent, remote_model: Any
) -> None:
    whole = decided("GATHERING_DESTINATION", "Lisbon it is. Where would you like to fly to?", origin="Lisbon")
    cut = whole[: whole.index("Where")]  # the object ends in the middle of the reply's text
    remote_model.enqueue(
        stream(cut, finish_reason="length"),
        stream("Where would you like to fly to?"),
    )
    session = session_create(user=alice, agent=booker)
    events = list(turn_stream(session=session, message="I want to fly from Lisbon"))

    turn = Turn.objects.get(session=session)
    assert turn.assistant_message == "Lisbon it is. Where would you like to fly to?" and not turn.truncated
    assert _deltas(events) == turn.assistant_message  # what was shown, then only the rest
    second = remote_model.chat_requests()[1]
    assert "response_format" not in second.body and second.messages[-2]["content"] == "Lisbon it is. "
    assert session.checkpoints.filter(turn=turn, reason=Checkpoint.Reason.TRANSITION).count() == 1
    assert turn.composition["continuations"] == 1
