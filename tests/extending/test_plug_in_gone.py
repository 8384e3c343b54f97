"""A plug-in's workflow gone (a restart without its setting): its agent is not offered, its chats say it is
unavailable (503 ``agent_unavailable``, nothing saved), and restoring the setting restores them."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client

from agents.models import Agent
from agents.tools.registry import default_registry_reset
from agents.workflows import registry_reset
from sessions.models import Turn
from sessions.services import session_create
from tests.api.conftest import token_client
from tests.extending.conftest import RETURNS_TOOLS, RETURNS_WORKFLOW


@pytest.mark.django_db
def test_an_agent_whose_workflow_is_gone_is_unavailable_until_its_setting_is_back(
    alice: Any, settings: Any, plug_in: Any, caplog: pytest.LogCaptureFixture
) -> None:
    plug_in(workflows=RETURNS_WORKFLOW, tools=RETURNS_TOOLS)
    agent = Agent.objects.create(
        name="Returns", slug="returns", system_prompt="You handle returns.", workflow="returns", tools=["order_status"]
    )
    session = session_create(user=alice, agent=agent)
    api = token_client(alice)
    assert "returns" in [row["slug"] for row in api.get("/api/agents/").json()["results"]]

    # The restart without the plug-in's settings.
    plugged = settings.AGENT_WORKFLOWS
    settings.AGENT_WORKFLOWS = [path for path in plugged if path not in RETURNS_WORKFLOW]
    registry_reset()
    default_registry_reset()
    with caplog.at_level(logging.WARNING):
        listed = [row["slug"] for row in api.get("/api/agents/").json()["results"]]
        refused = api.post(f"/api/sessions/{session.pk}/messages/", {"message": "Where is my refund?"}, format="json")
        streamed = api.post(
            f"/api/sessions/{session.pk}/messages/stream/", {"message": "Where is my refund?"}, format="json"
        )
        created = api.post("/api/sessions/", {"agent": "returns"}, format="json")
        page = Client()
        page.force_login(alice)
        home, chat = page.get("/"), page.get(f"/chats/{session.pk}/")
    assert "returns" not in listed
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "agent_unavailable", refused.content
    assert "'returns' is not installed" in refused.json()["error"]["message"]
    assert streamed.status_code == 503 and streamed.json()["error"]["code"] == "agent_unavailable"
    assert created.status_code == 503 and created.json()["error"]["code"] == "agent_unavailable"
    assert not Turn.objects.filter(session=session).exists(), "nothing saved"
    assert 'value="returns"' not in home.content.decode() and "Returns" not in home.content.decode()
    html = chat.content.decode()
    assert 'id="agent-unavailable"' in html and "is not installed" in html
    assert '<textarea id="message" name="message" rows="2" placeholder="Type a message…" required disabled>' in html
    ours = [r for r in caplog.records if r.name != "django.request"]  # Django's own line for each 503 response
    assert not [r for r in ours if "could not record" in r.getMessage() or r.levelno >= logging.ERROR]
    assert any("its workflow 'returns'" in r.getMessage() and r.levelno == logging.WARNING for r in ours)

    # The setting back: the agent is offered again and its chats answer.
    settings.AGENT_WORKFLOWS = plugged
    registry_reset()
    assert "returns" in [row["slug"] for row in api.get("/api/agents/").json()["results"]]
    answered = api.post(f"/api/sessions/{session.pk}/messages/", {"message": "Where is my refund?"}, format="json")
    assert answered.status_code == 201, answered.content
