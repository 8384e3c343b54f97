"""The demo model runs a workflow of yours sensibly (issue 36, the walk's first major): it fills the slots it can
read from the message, asks the state's question, calls an action's tool, hands off when asked, and never
quotes the prompt's internals. On the docs' example (``examples/returns``, plugged in by settings) and on a
workflow declared in the admin, through the API, with no model configured."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import Agent, ToolInvocation
from agents.workflows import FREE_CHAT
from llm.demo import default_reply
from orchestrator.context import HANDOFF_NOTICE
from sessions.models import ChatSession
from tests.api.conftest import token_client
from tests.extending.conftest import RETURNS_TOOLS, RETURNS_WORKFLOW
from tests.world import make_agent
from web.admin.agents import EXAMPLE_DECLARATION

# What a reply must never show: the prompt's machine lines, or the demo's quoting of them.
INTERNALS = re.compile(r"WORKFLOW:|CURRENT_STATE|COLLECTED:|ALLOWED_NEXT_STATES|I was told|Next question:")


def say(client: Any, session_id: str, message: str) -> dict[str, Any]:
    response = client.post(f"/api/sessions/{session_id}/messages/", {"message": message}, format="json")
    assert response.status_code == 201, response.content
    body = dict(response.json())
    assert body["turn"]["status"] == "completed", body
    assert not INTERNALS.search(body["reply"]), body["reply"]
    return body


@pytest.fixture
def returns_agent(db: Any, plug_in: Any) -> Agent:
    plug_in(workflows=RETURNS_WORKFLOW, tools=RETURNS_TOOLS)
    return make_agent("chat", slug="returns", name="Returns", system_prompt="You handle returns.", workflow="returns")


@pytest.mark.django_db(transaction=True)
def test_the_docs_example_is_walked_to_its_refund_on_the_demo_model(
    alice: Any, returns_agent: Agent, caplog: Any
) -> None:
    client = token_client(alice)
    session_id = client.post("/api/sessions/", {"agent": "returns"}, format="json").json()["id"]
    with caplog.at_level("WARNING"):
        first = say(client, session_id, "Hi, I want to return something")
        assert first["session"]["state"] == "ASKING_ORDER" and "Which order is it?" in first["reply"]
        refused = say(client, session_id, "order 12")  # read, refused by the slot's pattern, and said so
        assert refused["session"]["state"] == "ASKING_ORDER" and "could not use that: order id" in refused["reply"]
        order = say(client, session_id, "It is order A1001")
        assert order["session"]["state"] == "ASKING_REASON" and "What is the reason" in order["reply"]
        reason = say(client, session_id, "Because it leaks")
        assert reason["session"]["state"] == "CONFIRMING" and "Shall I request the refund?" in reason["reply"]
        done = say(client, session_id, "yes")
    session = ChatSession.objects.get(pk=session_id)
    assert session.state == "DONE" and session.data["order_id"] == "A1001" and session.data["reason"] == "it leaks"
    assert session.data["refund_reference"].startswith("R-") and session.data["refund_reference"] in done["reply"]
    assert list(ToolInvocation.objects.filter(session=session).values_list("name", "ok")) == [("refund_request", True)]
    assert [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []


@pytest.mark.django_db(transaction=True)
def test_on_the_docs_example_a_refund_the_rule_refuses_and_a_request_for_a_person_hand_off(
    alice: Any, returns_agent: Agent
) -> None:
    client = token_client(alice)
    session_id = client.post("/api/sessions/", {"agent": "returns"}, format="json").json()["id"]
    # Both slots in one message: the order by its pattern, the reason is asked next.
    assert say(client, session_id, "I'd like to return order A1002")["session"]["state"] == "ASKING_REASON"
    say(client, session_id, "too heavy")
    last = say(client, session_id, "yes please")  # a bike over the automatic limit: a person decides
    session = ChatSession.objects.get(pk=session_id)
    assert session.state == "NEEDS_PERSON" and session.status == ChatSession.Status.NEEDS_HUMAN
    assert last["reply"] == HANDOFF_NOTICE

    other = client.post("/api/sessions/", {"agent": "returns"}, format="json").json()["id"]
    asked = say(client, other, "I want to talk to a human please")
    assert ChatSession.objects.get(pk=other).status == ChatSession.Status.NEEDS_HUMAN
    assert asked["reply"] == HANDOFF_NOTICE


def _declared(staff_client: Client) -> None:
    data = {
        "name": "callback",
        "spec": json.dumps(EXAMPLE_DECLARATION),
        "versions-TOTAL_FORMS": "0",
        "versions-INITIAL_FORMS": "0",
        "versions-MIN_NUM_FORMS": "0",
        "versions-MAX_NUM_FORMS": "1000",
    }
    assert staff_client.post(reverse("admin:agents_workflowdefinition_add"), data).status_code == 302
    make_agent("chat", slug="callbacks", name="Callbacks", system_prompt="You arrange callbacks.", workflow="callback")


@pytest.mark.django_db(transaction=True)
def test_a_workflow_declared_in_the_admin_reaches_its_end_on_the_demo_model(
    staff_client: Client, alice: Any, caplog: Any
) -> None:
    _declared(staff_client)
    client = token_client(alice)
    session_id = client.post("/api/sessions/", {"agent": "callbacks"}, format="json").json()["id"]
    with caplog.at_level("WARNING"):
        first = say(client, session_id, "Hello, I would like a callback.")
        assert first["session"]["state"] == "ASKING_PHONE" and "Which number should we call?" in first["reply"]
        phone = say(client, session_id, "Call me on +44 20 7946 0000 please")
        assert phone["session"]["state"] == "ASKING_TOPIC" and "What is it about?" in phone["reply"]
        done = say(client, session_id, "It's about my invoice")
    session = ChatSession.objects.get(pk=session_id)
    assert session.state == "DONE" and session.data == {"phone": "+44 20 7946 0000", "topic": "my invoice"}
    assert "+44 20 7946 0000" in done["reply"] and "my invoice" in done["reply"]
    assert [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []

    again = say(client, session_id, "start over")  # explicit: the initial state, the data dropped
    session.refresh_from_db()
    assert session.state == "ASKING_PHONE" and session.data == {} and "Which number" in again["reply"]
    say(client, session_id, "I want to talk to a human please")
    session.refresh_from_db()
    assert session.status == ChatSession.Status.NEEDS_HUMAN


def test_the_default_reply_never_quotes_the_workflow_section() -> None:
    section = FREE_CHAT.resume_instruction("CHATTING", {})
    system = f"You are helpful.\n\n## Current workflow step\n{section}\n\n## Notes\nThe workflow of the shop is open."
    reply = default_reply([{"role": "system", "content": system}, {"role": "user", "content": "which workflow?"}])
    assert "WORKFLOW:" not in reply and "CURRENT_STATE" not in reply and "Talk with the user" not in reply
    assert "The workflow of the shop is open." in reply  # the rest of what it was given is still quoted
