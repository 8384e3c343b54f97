"""The admin links a session to its turns, memories, model calls and tool calls, and lets staff answer handoffs."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from agents.models import ToolInvocation
from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import session_create
from tests.world import make_agent


@pytest.fixture
def session(alice: Any, db: Any) -> ChatSession:
    agent = make_agent("chat")
    session = session_create(user=alice, agent=agent)
    turn_run(session=session, message="hello <script>alert(1)</script>")
    ToolInvocation.objects.create(
        session=session, turn=session.turns.first(), name="search_flights", result="TOOL_ERROR: x", ok=False
    )
    return session


def test_staff_see_linked_pages(client: Client, staff: Any, session: ChatSession) -> None:
    client.force_login(staff)
    page = client.get(f"/admin/chat_sessions/chatsession/{session.pk}/change/").content.decode()
    assert f"/admin/memory/memory/?source_session__id__exact={session.pk}" in page
    assert f"/admin/agents/toolinvocation/?session__id__exact={session.pk}" in page
    turn = session.turns.get()
    turn_page = client.get(f"/admin/chat_sessions/turn/{turn.pk}/change/")
    assert turn_page.status_code == 200
    body = turn_page.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>alert(1)" not in body
    assert f"/admin/agents/llmcall/?turn__id__exact={turn.pk}" in body
    assert client.get("/admin/agents/toolinvocation/").status_code == 200


def test_non_staff_cannot_open_the_admin(client: Client, alice: Any, session: ChatSession) -> None:
    client.force_login(alice)
    response = client.get(f"/admin/chat_sessions/turn/{session.turns.get().pk}/change/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_staff_hand_a_session_to_a_person_answer_it_and_hand_it_back(
    client: Client, staff: Any, session: ChatSession
) -> None:
    client.force_login(staff)
    client.post(
        "/admin/chat_sessions/chatsession/",
        {"action": "hand_to_a_person", "_selected_action": [str(session.pk)]},
    )
    session.refresh_from_db()
    assert session.status == ChatSession.Status.NEEDS_HUMAN
    handed = Checkpoint.objects.get(session=session, reason=Checkpoint.Reason.HANDOFF)
    assert "handed to a person by staff" in handed.detail
    url = f"/admin/chat_sessions/chatsession/{session.pk}/handoff-reply/"
    assert client.get(url).status_code == 200
    response = client.post(url, {"staff_reply": "Hi, this is a person."})
    assert response.status_code == 302
    turn = Turn.objects.get(session=session)
    assert "Hi, this is a person." in turn.assistant_message
    assert [r["text"] for r in turn.staff_replies] == ["Hi, this is a person."]
    client.post(
        "/admin/chat_sessions/chatsession/",
        {"action": "hand_back_to_agent", "_selected_action": [str(session.pk)]},
    )
    session.refresh_from_db()
    assert session.status == ChatSession.Status.ACTIVE
    assert Checkpoint.objects.filter(session=session, reason=Checkpoint.Reason.RESUME).exists()


def _form_fields(page: str) -> dict[str, str]:
    """The change form's inputs as a browser would post them (hidden ones included)."""
    from html.parser import HTMLParser

    fields: dict[str, str] = {}

    class Inputs(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            a = dict(attrs)
            if tag == "input" and a.get("name") and a.get("type") not in ("submit", "button", "checkbox"):
                fields[str(a["name"])] = a.get("value") or ""

    Inputs().feed(page)
    return fields


def test_a_long_sessions_page_shows_its_latest_rows_and_still_saves(
    client: Client, staff: Any, session: ChatSession
) -> None:
    """A thousand-turn chat made this page 6.5 MB: it shows the latest 50 turns and checkpoints, links to the
    rest, and a title edited while a new turn arrives (moving the window) still saves."""
    from web.admin.sessions import INLINE_LATEST_ROWS

    Turn.objects.bulk_create(
        Turn(session=session, seq=seq, user_message=f"question {seq}", status="completed") for seq in range(2, 121)
    )
    last = Checkpoint.objects.filter(session=session).count()
    Checkpoint.objects.bulk_create(
        Checkpoint(session=session, seq=last + i, state="CHATTING", reason="before_call") for i in range(1, 131)
    )
    client.force_login(staff)
    url = f"/admin/chat_sessions/chatsession/{session.pk}/change/"
    page = client.get(url).content.decode()

    assert INLINE_LATEST_ROWS == 50 and page.count("Resume from #") == 50
    assert "question 120" in page and "question 71" in page and "question 70<" not in page
    assert f"/admin/chat_sessions/checkpoint/?session__id__exact={session.pk}" in page
    assert client.get(f"/admin/chat_sessions/checkpoint/?session__id__exact={session.pk}").status_code == 200
    assert client.get(f"/admin/chat_sessions/turn/?session__id__exact={session.pk}").status_code == 200

    Turn.objects.create(session=session, seq=121, user_message="question 121", status="completed")
    fields = _form_fields(page)
    fields["title"] = "Renamed by staff"
    saved = client.post(url, fields)
    assert saved.status_code == 302, saved.content.decode()[-3000:]
    session.refresh_from_db()
    assert session.title == "Renamed by staff" and session.turns.count() == 121
