"""The staff's live chat (admin → a session → Live chat): the conversation as the user sees it, hand to a
person, reply, hand back; reading needs the view permission, acting the change permission."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import session_create
from tests.world import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(alice: Any) -> ChatSession:
    agent = make_agent(name="Chat", slug="chat", system_prompt="x", workflow="free_chat", tools=[])
    session = session_create(user=alice, agent=agent)
    turn_run(session=session, message="Hello <script>alert(1)</script> there")
    return session


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _urls(session: ChatSession) -> dict[str, str]:
    return {
        name: reverse(f"admin:chat_sessions_chatsession_{name}", args=[session.pk])
        for name in ("live", "live_transcript", "live_hand", "handoff_reply", "change")
    }


def test_staff_hand_a_chat_to_a_person_reply_and_hand_it_back_from_the_live_page(
    staff_client: Client, session: ChatSession
) -> None:
    urls = _urls(session)
    page = staff_client.get(urls["live"]).content.decode()
    assert "Hello &lt;script&gt;alert(1)&lt;/script&gt; there" in page and "<script>alert(1)" not in page
    assert 'id="hand-to-person"' in page and 'id="reply-form"' not in page
    assert urls["live"] in staff_client.get(urls["change"]).content.decode()  # linked from the session's page

    response = staff_client.post(urls["live_hand"], {"to": "person", "reason": "a complaint"})
    assert response.status_code == 302 and response["Location"] == urls["live"]
    session.refresh_from_db()
    assert session.status == ChatSession.Status.NEEDS_HUMAN
    detail = Checkpoint.objects.filter(session=session, reason=Checkpoint.Reason.HANDOFF).get().detail
    assert detail == "handed to a person by staff: a complaint"

    page = staff_client.get(urls["live"]).content.decode()
    assert 'id="reply-form"' in page and 'id="hand-back"' in page
    response = staff_client.post(urls["handoff_reply"], {"staff_reply": "Hi, I'm Sam.", "back": "live"})
    assert response["Location"] == urls["live"]
    transcript = staff_client.get(urls["live_transcript"]).content.decode()
    # Staff see how the user saw it signed, and who sent it.
    assert "staff · Support (staff)" in transcript and "Hi, I&#x27;m Sam." in transcript
    assert "A person has this chat" in transcript

    staff_client.post(urls["live_hand"], {"to": "agent"})
    session.refresh_from_db()
    assert session.status == ChatSession.Status.ACTIVE
    assert staff_client.post(urls["live_hand"], {"to": "nobody"}).status_code == 400
    assert staff_client.get(urls["live_hand"]).status_code == 405


def test_view_permission_reads_the_live_chat_and_only_change_permission_acts(
    viewer_staff: Any, session: ChatSession
) -> None:
    urls = _urls(session)
    viewer = _client(viewer_staff)
    page = viewer.get(urls["live"])
    assert page.status_code == 200 and 'id="hand-to-person"' not in page.content.decode()
    assert viewer.post(urls["live_hand"], {"to": "person"}).status_code == 403
    session.refresh_from_db()
    assert session.status == ChatSession.Status.ACTIVE

    viewer_staff.user_permissions.remove(Permission.objects.get(codename="view_chatsession"))
    viewer = _client(type(viewer_staff).objects.get(pk=viewer_staff.pk))
    assert viewer.get(urls["live"]).status_code == 403
    assert viewer.get(urls["live_transcript"]).status_code == 403


def test_people_who_are_not_staff_never_reach_the_live_chat(alice: Any, session: ChatSession) -> None:
    urls = _urls(session)
    for url in (urls["live"], urls["live_transcript"]):
        response = _client(alice).get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert Client().post(urls["live_hand"], {"to": "person"}).status_code == 302
    session.refresh_from_db()
    assert session.status == ChatSession.Status.ACTIVE
    assert Turn.objects.filter(session=session).count() == 1


def test_an_old_live_page_cannot_hand_back_a_chat_the_agent_has_or_reopen_a_closed_one(
    staff_client: Client, session: ChatSession
) -> None:
    urls = _urls(session)
    response = staff_client.post(urls["live_hand"], {"to": "agent"}, follow=True)
    assert "The agent has this chat already" in response.content.decode()
    assert not Checkpoint.objects.filter(session=session, reason=Checkpoint.Reason.RESUME).exists()
    ChatSession.objects.filter(pk=session.pk).update(status=ChatSession.Status.CLOSED)
    for to in ("person", "agent"):
        response = staff_client.post(urls["live_hand"], {"to": to}, follow=True)
        assert "This chat is closed" in response.content.decode()
    session.refresh_from_db()
    assert session.status == ChatSession.Status.CLOSED
