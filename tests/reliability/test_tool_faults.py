"""Tools failing inside a real turn (the model asks for the tool over HTTP; the fault fires in the tool's
worker thread): every kind comes back to the model as a ``TOOL_ERROR:`` result, retryable kinds are
retried, the turn still completes, and one ``ToolInvocation`` records what happened."""

from __future__ import annotations

import json
from datetime import date, timedelta
from typing import Any

import pytest

from agents.models import Agent, ToolInvocation
from agents.tools.faults import ALWAYS, inject_fault
from orchestrator.runtime import turn_run
from sessions.models import Turn
from sessions.services import session_create
from tests.fakes.openai_server import stream, tool_call
from tests.world import make_agent

pytestmark = pytest.mark.django_db

ARGS = {"origin": "Paris", "destination": "Rome", "date": (date.today() + timedelta(days=30)).isoformat()}


@pytest.fixture
def flights_agent(db: Any) -> Agent:
    return make_agent(
        name="Flights", slug="flights", system_prompt="Find flights.", workflow="free_chat", tools=["search_flights"]
    )


@pytest.fixture(autouse=True)
def _fast_tools(settings: Any) -> None:
    settings.TOOLS_DEFAULT_TIMEOUT = 0.3
    settings.TOOLS_RETRY_BASE_DELAY = 0.0
    settings.TOOLS_RETRY_MAX_DELAY = 0.0
    settings.TOOLS_MAX_ATTEMPTS = 3


def _script_tool_turn(remote_model: Any, final: str) -> None:
    # The decision is the reply's own call of the tool (one call decides and calls, the next answers).
    remote_model.enqueue(
        stream(tool_calls=[tool_call("search_flights", ARGS)], finish_reason="tool_calls"),
        stream(final),
    )


def _tool_message_seen_by_model(remote_model: Any) -> str:
    last = remote_model.chat_requests()[-1]
    tool_messages = [m for m in last.messages if m.get("role") == "tool"]
    assert len(tool_messages) == 1, last.messages
    return str(tool_messages[0]["content"])


@pytest.mark.parametrize(
    ("kind", "error_kind", "attempts"),
    [
        ("timeout", "timeout", 3),
        ("http_503", "http_5xx", 3),
        ("connection_error", "connection", 3),
        ("http_400", "http_4xx", 1),  # a client error is never retried
        ("malformed_payload", "malformed_payload", 1),
    ],
)
def test_a_failing_tool_becomes_a_tool_error_and_the_turn_completes(
    kind: str, error_kind: str, attempts: int, alice: Any, flights_agent: Agent, remote_model: Any
) -> None:
    session = session_create(user=alice, agent=flights_agent)
    _script_tool_turn(remote_model, "Sorry, the flight search is not working right now.")
    with inject_fault("search_flights", kind, times=ALWAYS):
        result = turn_run(session=session, message="Flights from Paris to Rome next month?")
    assert result.turn.status == Turn.Status.COMPLETED, result.turn.error
    assert result.reply == "Sorry, the flight search is not working right now."
    assert _tool_message_seen_by_model(remote_model).startswith("TOOL_ERROR:")
    invocation = ToolInvocation.objects.get(turn=result.turn)
    assert (invocation.name, invocation.ok, invocation.error_kind, invocation.attempts) == (
        "search_flights",
        False,
        error_kind,
        attempts,
    )
    # The system prompt told the model what a TOOL_ERROR means.
    system = remote_model.chat_requests()[-1].messages[0]["content"]
    assert "TOOL_ERROR" in system


def test_a_transient_tool_failure_is_retried_and_the_model_gets_the_result(
    alice: Any, flights_agent: Agent, remote_model: Any
) -> None:
    session = session_create(user=alice, agent=flights_agent)
    _script_tool_turn(remote_model, "Here are the flights.")
    with inject_fault("search_flights", "http_503", times=2):
        result = turn_run(session=session, message="Flights from Paris to Rome next month?")
    assert result.turn.status == Turn.Status.COMPLETED
    content = _tool_message_seen_by_model(remote_model)
    assert not content.startswith("TOOL_ERROR"), content
    invocation = ToolInvocation.objects.get(turn=result.turn)
    assert (invocation.ok, invocation.attempts) == (True, 3)


def test_arguments_the_model_got_wrong_never_run_the_tool(alice: Any, flights_agent: Agent, remote_model: Any) -> None:
    session = session_create(user=alice, agent=flights_agent)
    remote_model.enqueue(
        stream(
            tool_calls=[tool_call("search_flights", '{"origin": "Paris", "destination": ')],  # truncated JSON
            finish_reason="tool_calls",
        ),
        stream(tool_calls=[tool_call("drop_tables", json.dumps({"all": True}))], finish_reason="tool_calls"),
        stream("I could not search."),
    )
    result = turn_run(session=session, message="Flights?")
    assert result.turn.status == Turn.Status.COMPLETED, result.turn.error
    kinds = list(ToolInvocation.objects.filter(turn=result.turn).order_by("id").values_list("error_kind", "attempts"))
    assert kinds == [("invalid_arguments", 0), ("unknown_tool", 0)]
