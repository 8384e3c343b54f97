"""Agents through the API: active ones only, with the demo-model label when no LLM is configured."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agents.models import Agent
from llm.providers import DEMO_LABEL
from tests.api.conftest import assert_error


@pytest.mark.django_db
def test_lists_active_agents_with_the_demo_label(
    alice_client: APIClient, booking_agent: Agent, chat_agent: Agent, retired_agent: Agent, settings: object
) -> None:
    body = alice_client.get("/api/agents/").json()
    assert [a["slug"] for a in body["results"]] == ["chatty", "flight-booker"]
    booking = next(a for a in body["results"] if a["slug"] == "flight-booker")
    assert booking["workflow"] == "flight_booking" and booking["tools"] == ["book_flight"]
    assert booking["is_demo"] is True and booking["model_label"] == DEMO_LABEL
    assert "system_prompt" not in booking and "endpoint" not in booking
    assert alice_client.get(f"/api/agents/{chat_agent.pk}/").json()["name"] == "Chatty"
    assert_error(alice_client.get(f"/api/agents/{retired_agent.pk}/"), 404, "not_found")


@pytest.mark.django_db
def test_a_configured_endpoint_is_not_labelled_demo(
    alice_client: APIClient, chat_agent: Agent, settings: object
) -> None:
    settings.LLM_PROFILES = {  # type: ignore[attr-defined]
        "default": {"base_url": "http://127.0.0.1:9/v1", "model": "real-model", "api_key_env": "NOPE"}
    }
    body = alice_client.get(f"/api/agents/{chat_agent.pk}/").json()
    assert body["is_demo"] is False and body["model_label"] == "real-model"
