"""The returns example, plugged in by settings only, runs real turns through the API on a scripted model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.models import Agent, ToolInvocation
from llm.base import ToolCallRequest
from llm.scripted import ScriptedProvider, ScriptedReply
from orchestrator.context import HANDOFF_NOTICE
from orchestrator.runtime import handoff_resume
from sessions.models import ChatSession, Checkpoint
from tests.api.conftest import token_client
from tests.extending.conftest import RETURNS_TOOLS, RETURNS_WORKFLOW


@pytest.fixture
def returns_agent(db: Any, plug_in: Any) -> Agent:
    plug_in(workflows=RETURNS_WORKFLOW, tools=RETURNS_TOOLS)
    agent = Agent(
        name="Returns",
        slug="returns",
        system_prompt="You handle returns and refunds.",
        workflow="returns",
        tools=["order_status"],
    )
    agent.full_clean()  # what the admin's form checks: the workflow and the tools are known
    agent.save()
    return agent


def decision(state: str, **slots: Any) -> dict[str, Any]:
    return {"next_state": state, "slots": slots, "confidence": 0.95, "reasoning": "scripted"}


def call(name: str, **arguments: Any) -> ScriptedReply:
    return ScriptedReply(tool_calls=[ToolCallRequest(id=f"call-{name}", name=name, arguments=json.dumps(arguments))])


def say(client: APIClient, session_id: str, message: str) -> dict[str, Any]:
    response = client.post(f"/api/sessions/{session_id}/messages/", {"message": message}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["turn"]["status"] == "completed", body
    return body


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("order_id", ["A1001", "A1002", "A1003"])  # a jacket; a bike over the limit; a tent too old
def test_a_return_is_walked_to_its_refund_or_to_a_person_through_the_api(
    alice: Any, returns_agent: Agent, use_provider: Any, order_id: str
) -> None:
    eligible = order_id == "A1001"
    model = ScriptedProvider(
        [
            decision("ASKING_ORDER"),
            "Which order is it?",
            decision("ASKING_REASON", order_id=order_id),
            call("order_status", order_id=order_id),
            "Found it. Why are you returning it?",
            decision("CONFIRMING", reason="it leaks"),
            "Shall I request the refund?",
            decision("CHECKING"),  # the user confirms; the rule runs in Python, no model call
            *(
                [call("refund_request", order_id=order_id, reason="it leaks"), "Done: the refund is on its way."]
                if eligible
                else []
            ),
        ]
    )
    use_provider(model)
    client = token_client(alice)
    created = client.post("/api/sessions/", {"agent": "returns"}, format="json")
    assert created.status_code == 201 and created.json()["state"] == "ASKING_ORDER"
    session_id = created.json()["id"]

    say(client, session_id, "I want to return something")
    say(client, session_id, f"Order {order_id}")
    say(client, session_id, "It leaks")
    last = say(client, session_id, "Yes please")

    session = ChatSession.objects.get(pk=session_id)
    runs = list(ToolInvocation.objects.filter(session=session).order_by("pk").values_list("name", "ok"))
    if eligible:
        assert session.state == "DONE" and session.data["refund_reference"].startswith("R-")
        assert last["reply"] == "Done: the refund is on its way."
        assert runs == [("order_status", True), ("refund_request", True)]
    else:
        # The rule refused: the chat is a person's now, and the model was not asked to reply.
        assert session.state == "NEEDS_PERSON" and session.status == ChatSession.Status.NEEDS_HUMAN
        assert last["reply"] == HANDOFF_NOTICE and "refund_reference" not in session.data
        assert runs == [("order_status", True)]
        detail = session.checkpoints.filter(reason=Checkpoint.Reason.HANDOFF).values_list("detail", flat=True).get()
        assert "NEEDS_PERSON" in detail
        # Given back to the agent in that state, the next message is answered, not handed off again.
        handoff_resume(session=session, actor="staff")
        model.add(decision("NEEDS_PERSON"), "A colleague is looking at it.")
        again = say(client, session_id, "Any news?")
        session.refresh_from_db()
        assert again["reply"] == "A colleague is looking at it." and session.status == ChatSession.Status.ACTIVE
    # Every decision was asked for with the schema generated from the declaration, and nothing is left over.
    schemas = {r.schema.__name__ for r in model.requests if r.schema is not None}
    assert schemas == {"ReturnsDecision"} and model.remaining == 0


@pytest.mark.django_db
def test_a_value_the_slots_refuse_is_dropped_and_said(alice: Any, returns_agent: Agent, use_provider: Any) -> None:
    model = ScriptedProvider([decision("ASKING_REASON", order_id="12"), "Which order?"])
    use_provider(model)
    client = token_client(alice)
    session_id = client.post("/api/sessions/", {"agent": "returns"}, format="json").json()["id"]
    say(client, session_id, "order 12")
    session = ChatSession.objects.get(pk=session_id)
    assert session.state == "ASKING_ORDER" and "order_id" not in session.data
    reply_prompt = model.requests[-1].messages[0]["content"]
    refused = reply_prompt.split("NOT ACCEPTED", 1)[1]  # the reply is told what was dropped, and why
    assert "order id: String should match pattern" in refused


@pytest.mark.django_db
def test_a_python_action_that_breaks_goes_to_its_failure_state_and_the_turn_goes_on(
    alice: Any, returns_agent: Agent, use_provider: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    from agents.workflows import get_workflow

    def broken(context: Any) -> dict[str, Any]:
        raise RuntimeError("the order service is down")

    monkeypatch.setitem(get_workflow("returns").action_states, "CHECKING", broken)  # type: ignore[index]
    use_provider(ScriptedProvider([decision("CHECKING")]))
    client = token_client(alice)
    session_id = client.post("/api/sessions/", {"agent": "returns"}, format="json").json()["id"]
    ChatSession.objects.filter(pk=session_id).update(
        state="CONFIRMING", data={"order_id": "A1001", "reason": "it leaks"}
    )
    body = say(client, session_id, "yes")
    session = ChatSession.objects.get(pk=session_id)
    assert session.state == "NEEDS_PERSON" and body["reply"] == HANDOFF_NOTICE
    assert "action broken failed" in caplog.text and "the order service is down" in caplog.text
