"""The first word at the model's own speed: an agent with tools decides inside its reply's own streamed call (its
tools and the hand-off offered as functions; plain text is the answer), so a turn that needs no tool makes one
model call, and one that calls a tool the calls a LangGraph agent makes for it (decide-and-call, then reply).
An endpoint that cannot take tools falls back to a routing call of its own, and the turn's record says which
path it ran. Real HTTP: the fake OpenAI server (tests/fakes/openai_server.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents.models import Agent, LLMCall, ToolInvocation
from llm.base import HANDOFF_TOOL
from orchestrator.context import HANDOFF_NOTICE
from orchestrator.runtime import turn_run, turn_stream
from sessions.models import ChatSession, Turn
from sessions.services import session_create
from tests.fakes.openai_server import error, json_reply, stream, tool_call, tool_names
from tests.world import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def flights(db: Any) -> Agent:
    return make_agent("tools", slug="flights")


def test_a_turn_that_needs_no_tool_makes_exactly_one_model_call(alice: Any, flights: Agent, remote_model: Any) -> None:
    remote_model.enqueue(stream("Oslo is lovely in June."))
    session = session_create(user=alice, agent=flights)
    events = list(turn_stream(session=session, message="Is Oslo nice in summer?"))

    requests = remote_model.chat_requests()
    assert len(requests) == 1  # before: a structured routing call, then the reply
    assert requests[0].body.get("stream") is True and "response_format" not in requests[0].body
    assert tool_names(requests[0]) == ["search_flights", HANDOFF_TOOL.name]
    assert "tool_choice" not in requests[0].body  # offered, never forced
    assert "TOOL_ERROR" in requests[0].messages[0]["content"]  # the model is told what a tool's error looks like
    turn = Turn.objects.get(session=session)
    assert (turn.status, turn.assistant_message) == (Turn.Status.COMPLETED, "Oslo is lovely in June.")
    assert list(LLMCall.objects.filter(turn=turn).values_list("purpose", flat=True)) == ["reply"]
    assert turn.composition["route"] == {"path": "in_reply", "tools": ["search_flights"], "action": "answer"}
    assert turn.composition["calls"]["calls"] == 1 and set(turn.composition["calls"]["by_purpose"]) == {"reply"}
    first_delta = next(i for i, e in enumerate(events) if e["type"] == "delta")
    assert all(e["type"] != "state" for e in events[:first_delta])  # nothing decided before the first word


def test_a_turn_that_calls_a_tool_makes_two_calls_and_runs_the_tool_once(
    alice: Any, flights: Agent, remote_model: Any
) -> None:
    args = {"origin": "Lisbon", "destination": "Oslo", "date": "2031-06-01"}
    remote_model.enqueue(
        stream(tool_calls=[tool_call("search_flights", args)], finish_reason="tool_calls"),
        stream("Two flights go from Lisbon to Oslo that day."),
    )
    session = session_create(user=alice, agent=flights)
    result = turn_run(session=session, message="Flights from Lisbon to Oslo on 1 June 2031?")

    assert result.turn.status == Turn.Status.COMPLETED
    assert result.turn.assistant_message == "Two flights go from Lisbon to Oslo that day."
    assert len(remote_model.chat_requests()) == 2  # decide-and-call, then reply: as a LangGraph agent
    assert ToolInvocation.objects.filter(turn=result.turn, name="search_flights").count() == 1
    assert result.turn.composition["route"]["action"] == "use_tools"
    assert remote_model.chat_requests()[1].messages[-1]["role"] == "tool"


def test_asking_for_a_person_inside_the_reply_hands_off_in_one_call(
    alice: Any, flights: Agent, remote_model: Any
) -> None:
    reason = json.dumps({"reason": "wants a person"})
    remote_model.enqueue(stream(tool_calls=[tool_call(HANDOFF_TOOL.name, reason)], finish_reason="tool_calls"))
    session = session_create(user=alice, agent=flights)
    result = turn_run(session=session, message="I'd like a person please")
    session.refresh_from_db()
    assert session.status == ChatSession.Status.NEEDS_HUMAN
    assert result.turn.assistant_message == HANDOFF_NOTICE
    assert len(remote_model.chat_requests()) == 1


def test_an_unknown_tool_named_inside_the_reply_is_refused_as_text_and_never_runs(
    alice: Any, flights: Agent, remote_model: Any
) -> None:
    """The decision inside the call is still validated before it acts: a function the agent was not offered is a
    TOOL_ERROR for the model to read, not an action."""
    remote_model.enqueue(
        stream(tool_calls=[tool_call("book_flight", {"flight": "X1"})], finish_reason="tool_calls"),
        stream("I cannot book from here; I can look flights up."),
    )
    session = session_create(user=alice, agent=flights)
    result = turn_run(session=session, message="Book me on X1")
    assert result.turn.status == Turn.Status.COMPLETED
    tool_message = remote_model.chat_requests()[1].messages[-1]
    assert tool_message["role"] == "tool" and tool_message["content"].startswith("TOOL_ERROR:")
    assert not ToolInvocation.objects.filter(turn=result.turn, name="book_flight", ok=True).exists()


def test_an_endpoint_without_tool_calls_falls_back_to_two_calls_and_says_so(
    alice: Any, flights: Agent, remote_model: Any
) -> None:
    remote_model.enqueue(
        error(400, "this model does not support tools"),  # the one call, with tools: refused
        stream("Answered without tools."),  # asked again without them
        json_reply({"action": "answer", "reasoning": "chat", "confidence": 0.9}),  # next turn: its routing call
        stream("Routed, then answered."),
    )
    session = session_create(user=alice, agent=flights)
    first = turn_run(session=session, message="Hello")
    second = turn_run(session=session, message="Hello again")

    assert first.turn.assistant_message == "Answered without tools."
    assert first.turn.composition["route"]["path"] == "in_reply"
    assert second.turn.assistant_message == "Routed, then answered."
    assert second.turn.composition["route"]["path"] == "route_call"
    requests = remote_model.chat_requests()
    assert [tool_names(r) for r in requests] == [["search_flights", HANDOFF_TOOL.name], [], [], []]
    assert "response_format" in requests[2].body  # the routing call of the second turn
    purposes = list(LLMCall.objects.filter(turn=second.turn).order_by("pk").values_list("purpose", flat=True))
    assert purposes == ["route", "reply"]


def test_the_decision_in_the_reply_can_be_switched_off(
    alice: Any, flights: Agent, remote_model: Any, settings: Any
) -> None:
    settings.TURN_DECISION_IN_REPLY = False
    remote_model.enqueue(json_reply({"action": "answer", "reasoning": "chat", "confidence": 0.9}), stream("Hi."))
    session = session_create(user=alice, agent=flights)
    result = turn_run(session=session, message="Hi")
    assert result.turn.composition["route"]["path"] == "route_call"
    assert len(remote_model.chat_requests()) == 2


def test_the_demo_model_answers_an_agent_with_tools_in_one_call_and_hands_off_when_asked(alice: Any) -> None:
    agent = make_agent("memory", slug="helper")  # search_memory, the shape of the default assistant
    session = session_create(user=alice, agent=agent)
    answered = turn_run(session=session, message="What is a good name for a cat?")
    assert answered.turn.composition["route"]["path"] == "in_reply"
    assert LLMCall.objects.filter(turn=answered.turn).count() == 1
    asked = turn_run(session=session, message="Can I talk to a human please?")
    session.refresh_from_db()
    assert session.status == ChatSession.Status.NEEDS_HUMAN and asked.turn.assistant_message == HANDOFF_NOTICE
    assert LLMCall.objects.filter(turn=asked.turn).count() == 1
