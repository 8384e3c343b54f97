"""The sessions admin: timeline, reset and resume actions, and no API keys on any page."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from examples.booking.workflow import FLIGHT_BOOKING as WF
from sessions.models import ChatSession, Checkpoint
from sessions.services import session_create, transition_apply
from tests.world import make_agent

SECRET = "sk-test-DO-NOT-SHOW-4f9a2c"


@pytest.fixture
def walked(alice: Any) -> ChatSession:
    agent = make_agent(name="Booker", slug="booker", system_prompt="Book.", workflow="flight_booking")
    session = session_create(user=alice, agent=agent, title="Oslo trip")
    for state, slots in [("GATHERING_DESTINATION", {"origin": "Oslo"}), ("GATHERING_DATES", {"destination": "Rome"})]:
        decision = WF.decision_schema.model_validate({"next_state": state, "slots": slots})
        transition_apply(session=session, turn=None, decision=decision, today=date(2026, 11, 30))
    return session


@pytest.mark.django_db
def test_session_page_shows_state_and_checkpoint_timeline_without_keys(
    walked: ChatSession, staff_client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_API_KEY", SECRET)
    settings.LLM_API_KEY = SECRET
    settings.LLM_PROFILES = {
        "default": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "LLM_API_KEY"}
    }
    listing = staff_client.get(reverse("admin:chat_sessions_chatsession_changelist"))
    assert listing.status_code == 200
    page = listing.content.decode()
    assert "Oslo trip" in page and "GATHERING_DATES" in page
    change = staff_client.get(reverse("admin:chat_sessions_chatsession_change", args=[walked.pk]))
    html = change.content.decode()
    assert change.status_code == 200
    assert "Checkpoint timeline" in html and "IDLE -&gt; GATHERING_DESTINATION" in html
    assert "Resume from #1" in html and "Resume from #2" in html
    searched = staff_client.get(reverse("admin:chat_sessions_chatsession_changelist"), {"q": "alice"})
    assert "Oslo trip" in searched.content.decode()
    checkpoints = staff_client.get(reverse("admin:chat_sessions_checkpoint_changelist"))
    for response in (listing, change, searched, checkpoints):
        assert SECRET not in response.content.decode()


@pytest.mark.django_db
def test_resume_from_a_chosen_checkpoint_in_the_admin(walked: ChatSession, staff_client: Client) -> None:
    first = Checkpoint.objects.get(session=walked, seq=1)
    url = reverse("admin:chat_sessions_chatsession_resume", args=[walked.pk, first.pk])
    assert staff_client.get(url).status_code == 405  # changes state: POST only
    response = staff_client.post(url)
    assert response.status_code == 302
    walked.refresh_from_db()
    assert (walked.state, walked.data) == ("GATHERING_DESTINATION", {"origin": "Oslo"})
    last = Checkpoint.objects.filter(session=walked).order_by("-seq").first()
    assert last is not None and last.reason == "resume" and "staff" in last.detail


@pytest.mark.django_db
def test_reset_action_and_checkpoint_action(walked: ChatSession, staff_client: Client) -> None:
    response = staff_client.post(
        reverse("admin:chat_sessions_chatsession_changelist"),
        {"action": "reset_sessions", "_selected_action": [str(walked.pk)]},
    )
    assert response.status_code == 302
    walked.refresh_from_db()
    assert (walked.state, walked.data) == ("IDLE", {})
    second = Checkpoint.objects.get(session=walked, seq=2)
    staff_client.post(
        reverse("admin:chat_sessions_checkpoint_changelist"),
        {"action": "resume_session_here", "_selected_action": [str(second.pk)]},
    )
    walked.refresh_from_db()
    assert (walked.state, walked.data) == ("GATHERING_DATES", {"origin": "Oslo", "destination": "Rome"})


@pytest.mark.django_db
def test_non_staff_cannot_open_the_session_admin(walked: ChatSession, alice: Any) -> None:
    client = Client()
    client.force_login(alice)
    first = Checkpoint.objects.get(session=walked, seq=1)
    response = client.post(reverse("admin:chat_sessions_chatsession_resume", args=[walked.pk, first.pk]))
    assert response.status_code == 302 and "/login/" in response["Location"]
    walked.refresh_from_db()
    assert walked.state == "GATHERING_DATES"
