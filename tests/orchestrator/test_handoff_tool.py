"""Asking for a person in a free chat with no tools of its own: the reply is offered the hand-to-a-person tool
(``llm.base.HANDOFF_TOOL``), and the model's call of it hands the chat to a person, as a workflow's
``wants_person`` and the routing of an agent with tools do. An endpoint that refuses tools is asked again
without it, and remembered."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents.models import Agent
from llm.base import HANDOFF_TOOL
from orchestrator.context import HANDOFF_NOTICE
from orchestrator.runtime import turn_run, turn_stream
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import session_create
from tests.fakes.openai_server import error, json_reply, stream, tool_call, tool_names
from tests.world import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat_agent(db: Any) -> Agent:
    return make_agent(name="Chat", slug="chat", system_prompt="Be kind.", workflow="free_chat", tools=[])


def test_the_demo_model_hands_a_free_chat_to_a_person_when_asked(alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    ordinary = turn_run(session=session, message="What is a good name for a cat?")
    assert ordinary.turn.assistant_message != HANDOFF_NOTICE
    session.refresh_from_db()
    assert session.status == ChatSession.Status.ACTIVE

    asked = turn_run(session=session, message="Can I talk to a human please?")
    session.refresh_from_db()
    assert session.status == ChatSession.Status.NEEDS_HUMAN
    assert asked.turn.assistant_message == HANDOFF_NOTICE and asked.turn.status == Turn.Status.COMPLETED
    handoff = Checkpoint.objects.get(session=session, reason=Checkpoint.Reason.HANDOFF)
    assert "the user asked for a person" in handoff.detail


def test_a_real_endpoints_call_of_the_tool_hands_off_with_its_reason(
    alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    args = json.dumps({"reason": "wants a refund agent"})
    remote_model.enqueue(stream(tool_calls=[tool_call(HANDOFF_TOOL.name, args)], finish_reason="tool_calls"))
    session = session_create(user=alice, agent=chat_agent)
    events = list(turn_stream(session=session, message="Get me somebody who can refund this."))
    request = remote_model.chat_requests()[0]
    assert tool_names(request) == ["hand_to_person"] and "tool_choice" not in request.body
    session.refresh_from_db()
    assert session.status == ChatSession.Status.NEEDS_HUMAN
    assert [e.get("status") for e in events if e["type"] == "state"] == ["needs_human"]
    assert next(e for e in events if e["type"] == "done")["reply"] == HANDOFF_NOTICE
    detail = Checkpoint.objects.get(session=session, reason=Checkpoint.Reason.HANDOFF).detail
    assert detail == "the model: wants a refund agent"


def test_an_endpoint_that_refuses_tools_is_asked_again_without_them_and_remembered(
    alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    remote_model.enqueue(
        error(400, "registry.ollama.ai/library/gemma:2b does not support tools"),
        stream("Hello there."),
        stream("Hello again."),
    )
    session = session_create(user=alice, agent=chat_agent)
    first = turn_run(session=session, message="Hi")
    second = turn_run(session=session, message="Hi again")
    assert first.turn.status == Turn.Status.COMPLETED and first.turn.assistant_message == "Hello there."
    assert second.turn.assistant_message == "Hello again."
    requests = remote_model.chat_requests()
    assert [tool_names(r) for r in requests] == [["hand_to_person"], [], []]


def test_a_refusal_of_tools_the_reply_needs_still_fails_the_turn(alice: Any, remote_model: Any, settings: Any) -> None:
    settings.TURN_DECISION_IN_REPLY = (
        False  # routed by a call of its own (the one-call path: tests/orchestrator/test_one_call.py)
    )
    agent = make_agent("tools", slug="flights")
    remote_model.enqueue(
        # The routing decision (structured), then the reply that needs the agent's tool.
        json_reply({"action": "use_tools", "reasoning": "flights", "confidence": 0.9}),
        error(400, "this model does not support tools"),
    )
    session = session_create(user=alice, agent=agent)
    result = turn_run(session=session, message="Flights to Oslo?")
    assert result.turn.status == Turn.Status.FAILED


def test_what_the_model_said_before_handing_off_is_kept_with_the_notice(
    alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    args = json.dumps({"reason": "billing"})
    remote_model.enqueue(
        stream(
            "Let me find someone for you.", tool_calls=[tool_call(HANDOFF_TOOL.name, args)], finish_reason="tool_calls"
        )
    )
    session = session_create(user=alice, agent=chat_agent)
    events = list(turn_stream(session=session, message="I need a human for my bill"))
    shown = "".join(e["text"] for e in events if e["type"] == "delta")
    turn = Turn.objects.get(session=session)
    assert turn.assistant_message == shown == f"Let me find someone for you.\n\n{HANDOFF_NOTICE}"


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ("registry.ollama.ai/library/gemma:2b does not support tools", True),
        ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set; tool_choice', True),
        ("Unrecognized request argument supplied: tools", True),
        ("tools: Extra inputs are not permitted", True),
        ("This model's maximum context length is 4096 tokens; the tools and messages are too long", False),
        ("Invalid 'messages[1].content': string too long", False),
    ],
)
def test_only_a_refusal_of_tools_leaves_the_optional_tool_out(message: str, refused: bool) -> None:
    from llm.capabilities import is_tools_refusal

    assert is_tools_refusal(400, message) is refused


def test_a_nul_in_an_endpoints_model_name_does_not_fail_the_turn_it_is_recorded_with(
    alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    from agents.models import LLMCall

    remote_model.enqueue(stream("Fine.", model="fake\x00model"))
    session = session_create(user=alice, agent=chat_agent)
    result = turn_run(session=session, message="Hello")
    assert result.turn.status == Turn.Status.COMPLETED and result.reply == "Fine."
    assert LLMCall.objects.get(turn=result.turn).model == "fake\ufffdmodel"


def test_the_records_of_a_failed_turns_calls_keep_the_time_of_each_call(alice: Any, remote_model: Any) -> None:
    from agents.models import LLMCall

    agent = make_agent("tools", slug="flights")
    args = {"origin": "Lisbon", "destination": "Oslo", "date": "2031-06-01"}
    remote_model.enqueue(
        stream(tool_calls=[tool_call("search_flights", args)], finish_reason="tool_calls"), error(400, "bad request")
    )
    session = session_create(user=alice, agent=agent)
    result = turn_run(session=session, message="Hello")
    assert result.turn.status == Turn.Status.FAILED
    calls = list(LLMCall.objects.filter(turn=result.turn).order_by("created_at"))
    assert [c.purpose for c in calls] == ["reply", "reply"]  # the call that decided (a tool), then the failed one
    # Written when the turn ended, each with the time of its call, not of the write.
    assert calls[0].created_at < calls[1].created_at <= result.turn.completed_at
