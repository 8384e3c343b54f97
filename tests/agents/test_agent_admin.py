"""The agent's settings as an operator edits them: values the runtime cannot use are refused at the save,
and an agent that got such a value anyway (saved around the admin) fails its own turns, not every page."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from agents.models import Agent
from sessions.models import ChatSession
from tests.api.conftest import assert_error, token_client
from tests.world import make_agent

pytestmark = pytest.mark.django_db


def _form(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "Typo",
        "slug": "typo",
        "is_active": "on",
        "system_prompt": "You help.",
        "endpoint": "",
        "model": "",
        "temperature": "0.3",
        "max_tokens": "512",
        "context_window": "8192",
        "response_reserve": "768",
        "safety_margin": "0.12",
        "section_budgets": json.dumps({"system": 0.1, "recent": 0.4}),
        "window_turns": "10",
        "memory_budget_tokens": "2000",
        "relevance_threshold": "0.5",
        "workflow": "free_chat",
        "routing_confidence_threshold": "0.4",
        "tools": ["search_flights"],
        "step_limit": "8",
        "step_limit_behaviour": "partial",
    }
    data.update(changes)
    return data


def test_a_valid_agent_is_saved(staff_client: Client) -> None:
    response = staff_client.post(reverse("admin:agents_agent_add"), _form(endpoint="demo"))
    assert response.status_code == 302, response.content.decode()[:2000]
    agent = Agent.objects.get(slug="typo")
    assert agent.tools == ["search_flights"] and agent.section_budgets == {"system": 0.1, "recent": 0.4}


def test_the_tools_are_ticked_from_the_registered_ones_not_typed_as_json(staff_client: Client) -> None:
    """Issue 36: the agent form's tools were a raw JSON box."""
    page = staff_client.get(reverse("admin:agents_agent_add")).content.decode()
    assert 'type="checkbox" name="tools" value="book_flight"' in page
    assert 'type="checkbox" name="tools" value="search_flights"' in page
    response = staff_client.post(reverse("admin:agents_agent_add"), _form(tools=["book_flight", "search_flights"]))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Agent.objects.get(slug="typo").tools == ["book_flight", "search_flights"]
    none = staff_client.post(reverse("admin:agents_agent_add"), _form(slug="none", name="None", tools=[]))
    assert none.status_code == 302 and Agent.objects.get(slug="none").tools == []


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("workflow", "free-chat", "Unknown workflow &#x27;free-chat&#x27;"),
        ("endpoint", "nope", "No endpoint profile &#x27;nope&#x27; is configured"),
        ("section_budgets", '"oops"', "An object of section shares"),
        ("section_budgets", '{"recent": 2}', "An object of section shares"),
        ("section_budgets", '{"history": 0.3}', "An object of section shares"),
        ("tools", ["no_such_tool"], "Select a valid choice. no_such_tool is not one of the available choices."),
    ],
)
def test_values_the_runtime_cannot_use_are_refused(staff_client: Client, field: str, value: Any, says: str) -> None:
    response = staff_client.post(reverse("admin:agents_agent_add"), _form(**{field: value}))
    assert response.status_code == 200
    assert says in response.content.decode()
    assert not Agent.objects.filter(slug="typo").exists()


def test_an_agent_whose_profile_is_gone_does_not_break_the_listing(alice: Any) -> None:
    make_agent(name="Gone", slug="gone", system_prompt="x", endpoint="removed-profile")
    client = token_client(alice)
    listing = client.get("/api/agents/")
    assert listing.status_code == 200
    [gone] = [a for a in listing.json()["results"] if a["slug"] == "gone"]
    assert gone["model_label"] == "not configured" and gone["is_demo"] is False


def test_an_agent_with_an_unknown_workflow_is_unavailable_not_a_500(alice: Any) -> None:
    agent = make_agent(name="Odd", slug="odd", system_prompt="x", workflow="removed-workflow")
    api: APIClient = token_client(alice)
    assert_error(api.post("/api/sessions/", {"agent": agent.slug}, format="json"), 503, "agent_unavailable")
    web = Client()
    web.force_login(alice)
    assert f'value="{agent.pk}"' not in web.get("/").content.decode()  # not offered (issue 55)
    page = web.post("/chats/new/", {"agent": str(agent.pk)}, follow=True)  # a stale form that still had it
    assert page.status_code == 200 and "That agent is not available now" in page.content.decode()
    assert not ChatSession.objects.filter(agent=agent).exists()


def test_the_admin_never_shows_a_whole_api_token(staff_client: Client, alice: Any) -> None:
    """Issue 36: the admin listed every API token in plain text."""
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=alice)
    listing = staff_client.get("/admin/authtoken/tokenproxy/")
    assert listing.status_code == 200 and f"{token.key[:4]}…" in listing.content.decode()
    page = staff_client.get(f"/admin/authtoken/tokenproxy/{alice.pk}/change/")
    assert page.status_code == 200
    for response in (listing, page):
        assert token.key not in response.content.decode()
