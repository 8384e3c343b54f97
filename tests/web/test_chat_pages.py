"""The web chat through Django's test client: sign in/out, the session list, a new chat, streaming
with CSRF, the panels (workflow, memory, staff-only context inspector), safe rendering, and 404s for
other people's chats."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.utils.html import escape

from agents.models import Agent
from llm.providers import DEMO_LABEL
from memory.services import memory_create
from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Turn
from sessions.services import session_create
from tests.html_checks import active_parts

BOOKING = ["I want to book a flight", "from London to Paris", "March 10 to March 15", "2 passengers", "yes"]


def _signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _with_a_turn(session: ChatSession) -> ChatSession:
    Turn.objects.create(session=session, seq=1, user_message="hi", assistant_message="hello", status="completed")
    return session


def _stream(client: Client, session: ChatSession, message: str, **headers: Any) -> list[tuple[str, dict[str, Any]]]:
    response = client.post(
        f"/chats/{session.pk}/stream/",
        data=json.dumps({"message": message}),
        content_type="application/json",
        **headers,
    )
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/event-stream")
    events = []
    for block in b"".join(response.streaming_content).decode().split("\n\n"):
        lines = dict(line.split(":", 1) for line in block.splitlines() if not line.startswith(":"))
        if "data" in lines:
            events.append((lines["event"].strip(), json.loads(lines["data"])))
    return events


@pytest.mark.django_db
def test_anonymous_is_sent_to_sign_in(client: Client, alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    for path in ("/", f"/chats/{session.pk}/"):
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    # The page's own requests (its panels and its stream) get a JSON 401 naming where to sign in again.
    for response in (
        client.get(f"/chats/{session.pk}/panels/"),
        client.post(f"/chats/{session.pk}/stream/", {"message": "hi"}),
    ):
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["code"] == "not_authenticated"
        assert error["details"]["login_url"] == f"/accounts/login/?next=/chats/{session.pk}/"
    assert not Turn.objects.exists()


@pytest.mark.django_db
def test_sign_in_and_out(client: Client, alice: Any) -> None:
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b'name="username"' in page.content
    assert client.post("/accounts/login/", {"username": "alice", "password": "wrong"}).status_code == 200
    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-pass-123"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert b"Sign out" in client.get("/").content
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/").status_code == 302


@pytest.mark.django_db
def test_session_list_shows_only_my_chats_and_a_new_chat_starts_one(
    alice: Any, bob: Any, chat_agent: Agent, booking_agent: Agent
) -> None:
    session_create(user=alice, agent=chat_agent, title="Alice private chat")
    bob_client = _signed_in(bob)
    home = bob_client.get("/").content.decode()
    assert "Alice private chat" not in home
    assert "Flight booker" in home and "Chatty" in home  # the agent choice
    response = bob_client.post("/chats/new/", {"agent": booking_agent.pk})
    session = ChatSession.objects.get(user=bob)
    assert response.status_code == 302 and response["Location"] == f"/chats/{session.pk}/"
    assert session.agent == booking_agent and session.workflow == "flight_booking"
    assert bob_client.post("/chats/new/", {"agent": 999999}).status_code == 302
    assert ChatSession.objects.filter(user=bob).count() == 1


@pytest.mark.django_db
def test_other_peoples_chats_are_404(alice: Any, bob: Any, staff: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    for user in (bob, staff):
        client = _signed_in(user)
        # Staff who may read sessions read the page itself, read-only (test below); nothing else is theirs.
        assert client.get(f"/chats/{session.pk}/").status_code == (200 if user is staff else 404)
        assert client.get(f"/chats/{session.pk}/panels/").status_code == 404
        response = client.post(
            f"/chats/{session.pk}/stream/", data=json.dumps({"message": "hi"}), content_type="application/json"
        )
        assert response.status_code == 404
        assert client.post(f"/chats/{session.pk}/delete/").status_code == 404
    assert ChatSession.objects.filter(pk=session.pk).exists() and not Turn.objects.exists()


@pytest.mark.django_db
def test_streaming_needs_the_csrf_token(alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    page = client.get(f"/chats/{session.pk}/")
    refused = client.post(
        f"/chats/{session.pk}/stream/", data=json.dumps({"message": "hi"}), content_type="application/json"
    )
    assert refused.status_code == 403 and not Turn.objects.exists()
    token = page.context["csrf_token"]
    events = _stream(client, session, "hi", HTTP_X_CSRFTOKEN=str(token))
    assert events[-1][0] == "done"


@pytest.mark.django_db
def test_the_booking_conversation_streams_and_the_workflow_panel_follows(alice: Any, booking_agent: Agent) -> None:
    client = _signed_in(alice)
    session = session_create(user=alice, agent=booking_agent)
    page = client.get(f"/chats/{session.pk}/").content.decode()
    assert DEMO_LABEL in page
    states = []
    for message in BOOKING:
        events = _stream(client, session, message)
        kinds = [kind for kind, _ in events]
        assert kinds[0] == "turn" and kinds[-1] == "done" and "delta" in kinds
        done = events[-1][1]
        assert "".join(d["text"] for k, d in events if k == "delta") == done["reply"]
        states.append(done["state"])
        panels = client.get(f"/chats/{session.pk}/panels/").content.decode()
        assert f'data-state="{done["state"]}"' in panels
    assert states[-1] == "COMPLETED"
    assert states.index("GATHERING_DATES") < states.index("CONFIRMING")
    panels = client.get(f"/chats/{session.pk}/panels/").content.decode()
    for value in ("London", "Paris", "-03-10", "-03-15", "booking_reference"):
        assert value in panels
    chat = client.get(f"/chats/{session.pk}/").content.decode()
    assert "Booking reference" in chat


@pytest.mark.django_db
def test_memory_panel_shows_what_was_retrieved_and_why(alice: Any, chat_agent: Agent) -> None:
    memory_create(user=alice, kind="semantic", text="Alice's home airport is Oslo Gardermoen.")
    session = session_create(user=alice, agent=chat_agent)
    turn_run(session=session, message="Which airport is my home airport?")
    turn = Turn.objects.get(session=session)
    kept = [c for c in turn.retrieval["candidates"] if c["kept"]]
    assert kept, turn.retrieval
    panels = _signed_in(alice).get(f"/chats/{session.pk}/panels/").content.decode()
    assert "Oslo Gardermoen" in panels
    assert escape(kept[0]["reason"]) in panels


@pytest.mark.django_db
def test_memory_panel_says_what_a_follow_up_searched_for_escaped(alice: Any, chat_agent: Agent) -> None:
    """A short follow-up is searched with the user's earlier message; the panel says so, as text."""
    memory_create(user=alice, kind="semantic", text="Alice flies to Oslo in May.")
    session = session_create(user=alice, agent=chat_agent)
    turn_run(session=session, message="I fly to <b>Oslo</b> soon")
    turn_run(session=session, message="and when exactly?")
    panels = _signed_in(alice).get(f"/chats/{session.pk}/panels/").content.decode()
    assert "Searched for (with your earlier messages): and when exactly?" in panels
    assert escape("I fly to <b>Oslo</b> soon") in panels and "<b>Oslo</b>" not in panels


@pytest.mark.django_db
def test_context_inspector_is_for_staff_only(alice: Any, staff: Any, chat_agent: Agent) -> None:
    for user in (alice, staff):
        session = session_create(user=user, agent=chat_agent)
        turn_run(session=session, message="hello there")
        page = _signed_in(user).get(f"/chats/{session.pk}/").content.decode()
        turn = Turn.objects.get(session=session)
        if user.is_staff:
            assert 'id="inspector"' in page
            assert f"{turn.composition['total']} of {turn.composition['limit']} prompt tokens" in page
            for name, tokens in turn.composition["sections"].items():
                if tokens:
                    assert f"seg-{name}" in page
        else:
            assert 'id="inspector"' not in page and "Context inspector" not in page


@pytest.mark.django_db
def test_model_output_and_messages_are_rendered_safely(alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    evil = 'Hi <script>alert("x")</script> <img src=x onerror=alert(1)> **bold**'
    events = _stream(_signed_in(alice), session, evil)
    assert active_parts(events[-1][1]["html"]) == []
    assert "&lt;img src=x onerror=alert(1)&gt;" in events[-1][1]["html"]  # what the user wrote, as text
    memory_create(user=alice, kind="semantic", text="<script>steal()</script> likes **tea**")
    turn_run(session=session, message="what do I like? tea")
    page = _signed_in(alice).get(f"/chats/{session.pk}/").content.decode()
    assert "<script>alert" not in page and "<script>steal" not in page
    assert "&lt;script&gt;alert" in page  # the user's own words are shown, as text
    assert "<img src=x" not in page


@pytest.mark.django_db
def test_stream_refusals_are_json_errors(alice: Any, chat_agent: Agent, settings: Any) -> None:
    settings.MAX_MESSAGE_CHARS = 100
    session = session_create(user=alice, agent=chat_agent)
    client = _signed_in(alice)
    url = f"/chats/{session.pk}/stream/"
    too_long = client.post(url, data=json.dumps({"message": "x" * 101}), content_type="application/json")
    assert too_long.status_code == 413 and too_long.json()["error"]["code"] == "message_too_long"
    empty = client.post(url, data=json.dumps({"message": " "}), content_type="application/json")
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_message"
    broken = client.post(url, data="{", content_type="application/json")
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "parse_error"
    nested = client.post(url, data="[" * 50_000 + "]" * 50_000, content_type="application/json")
    assert nested.status_code == 400 and nested.json()["error"]["code"] == "parse_error"
    surrogate = client.post(url, data='{"message": "hello \\ud800 world"}', content_type="application/json")
    assert surrogate.status_code == 400 and surrogate.json()["error"]["code"] == "invalid_characters"
    assert not Turn.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("form", "says"),
    [
        ({"agent": "abc"}, "Choose an agent"),
        ({"agent": "1.5"}, "Choose an agent"),
        ({"agent": "\x00"}, "Choose an agent"),
        ({"agent": "999999"}, "Choose an agent"),
        ({"title": "a\x00b"}, "Null characters are not allowed"),
        ({"title": "x" * 201}, "at most 200 characters"),
    ],
)
def test_a_bad_new_chat_form_is_a_message_not_an_error(
    alice: Any, chat_agent: Agent, form: dict[str, str], says: str
) -> None:
    client = _signed_in(alice)
    response = client.post("/chats/new/", {"agent": str(chat_agent.pk), **form}, follow=True)
    assert response.status_code == 200 and response.redirect_chain[-1][0] == "/"
    assert says in response.content.decode()
    assert not ChatSession.objects.exists()


@pytest.mark.django_db
def test_a_new_chat_title_is_trimmed(alice: Any, chat_agent: Agent) -> None:
    _signed_in(alice).post("/chats/new/", {"agent": str(chat_agent.pk), "title": "   "})
    assert ChatSession.objects.get().title == ""


@pytest.mark.django_db
def test_delete_a_chat(alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    response = _signed_in(alice).post(f"/chats/{session.pk}/delete/")
    assert response.status_code == 302 and response["Location"] == "/"
    assert not ChatSession.objects.filter(pk=session.pk).exists()


@pytest.mark.django_db
def test_the_web_chat_shares_the_apis_message_rate(alice: Any, chat_agent: Agent, monkeypatch: Any) -> None:
    """Each message is a model call: the web door has the API's per-user rate, on the same counter."""
    from rest_framework.throttling import SimpleRateThrottle

    from tests.api.conftest import token_client

    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "messages", "2/min")
    session = session_create(user=alice, agent=chat_agent)
    client = _signed_in(alice)
    api = token_client(alice)
    assert api.post(f"/api/sessions/{session.pk}/messages/", {"message": "one"}, format="json").status_code == 201
    _stream(client, session, "two")

    refused = client.post(
        f"/chats/{session.pk}/stream/", data=json.dumps({"message": "three"}), content_type="application/json"
    )

    assert refused.status_code == 429 and refused.json()["error"]["code"] == "throttled"
    assert 0 < int(refused["Retry-After"]) <= 60
    assert Turn.objects.filter(session=session).count() == 2


def _locked_elsewhere(session_id: Any) -> bool:
    """Is the session's turn lock held, asked from another connection (a lock is re-entrant on its own)?"""
    import threading

    from django.db import connection

    from sessions.locks import session_is_locked

    answer: list[bool] = []

    def ask() -> None:
        try:
            answer.append(session_is_locked(session_id))
        finally:
            connection.close()

    thread = threading.Thread(target=ask)
    thread.start()
    thread.join(30)
    return answer[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("chunks_read", [0, 1])
def test_a_stream_closed_early_finishes_its_turn_and_lets_the_session_go(
    alice: Any, chat_agent: Agent, chunks_read: int
) -> None:
    """The server closes the response when the client is gone: before any byte was sent, or after the first.
    The turn is answered anyway and its reply saved (it was left running, and the next message or the sweep
    asked the model again); the session's lock goes with the response (it stayed held by the thread's
    connection, and every later message got 409)."""
    from agents.models import LLMCall

    session = session_create(user=alice, agent=chat_agent)
    client = _signed_in(alice)
    response = client.post(
        f"/chats/{session.pk}/stream/", data=json.dumps({"message": "hello"}), content_type="application/json"
    )
    assert response.status_code == 200 and _locked_elsewhere(session.pk)
    body = iter(response.streaming_content)
    for _ in range(chunks_read):
        assert next(body).startswith(b": stream open")

    response.close()

    assert not _locked_elsewhere(session.pk)
    first = Turn.objects.get(session=session)
    assert first.status == "completed" and first.assistant_message
    assert list(LLMCall.objects.filter(turn=first).values_list("purpose", "outcome")) == [("reply", "ok")]
    events = _stream(client, session, "hello again")
    assert [e for e, _ in events if e in ("recovered", "done")] == ["done"]  # nothing left to recover
    assert list(Turn.objects.filter(session=session).order_by("seq").values_list("status", flat=True)) == [
        "completed",
        "completed",
    ]


@pytest.mark.django_db
def test_a_long_chat_shows_its_latest_turns_and_links_to_the_earlier_ones(alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    Turn.objects.bulk_create(
        Turn(session=session, seq=seq, user_message=f"question {seq}.", assistant_message=f"answer {seq}.")
        for seq in range(1, 121)
    )
    client = _signed_in(alice)

    latest = client.get(f"/chats/{session.pk}/").content.decode()
    assert "question 120." in latest and "question 71." in latest and "question 70." not in latest
    assert 'href="?before=71"' in latest and 'id="composer"' in latest

    earlier = client.get(f"/chats/{session.pk}/", {"before": "71"}).content.decode()
    assert "question 70." in earlier and "question 21." in earlier and "question 71." not in earlier
    assert 'href="?before=21"' in earlier
    # Reading back: no composer (a reply would land under old turns), a way back to the latest instead.
    assert 'id="composer"' not in earlier and f'href="/chats/{session.pk}/"' in earlier

    first = client.get(f"/chats/{session.pk}/", {"before": "21"}).content.decode()
    assert "question 1." in first and "question 20." in first and "?before=" not in first
    for junk in ("x", "-5", "1e9", "٣", "99999999999999999999"):  # ignored: the latest turns
        page = client.get(f"/chats/{session.pk}/", {"before": junk})
        assert page.status_code == 200 and "question 120." in page.content.decode(), junk
    assert client.get(f"/chats/{session.pk}/", {"before": "\x00"}).status_code == 400  # as for every page


@pytest.mark.django_db
def test_the_chat_list_pages_through_all_my_chats(alice: Any, bob: Any, chat_agent: Agent) -> None:
    for i in range(1, 121):
        _with_a_turn(session_create(user=alice, agent=chat_agent, title=f"chat number {i}."))
    _with_a_turn(session_create(user=bob, agent=chat_agent, title="bob's chat."))
    client = _signed_in(alice)

    first = client.get("/").content.decode()
    assert "chat number 120." in first and "chat number 71." in first and "chat number 70." not in first
    assert 'href="?page=2"' in first and "page 1 of 3" in first
    last = client.get("/", {"page": "3"}).content.decode()
    assert "chat number 1." in last and "chat number 20." in last and "bob&#x27;s chat." not in last
    assert 'href="?page=2"' in last and "?page=4" not in last
    for junk in ("99", "x", "-1"):  # past the end or not a number: the last or the first page, never an error
        assert client.get("/", {"page": junk}).status_code == 200


@pytest.mark.django_db
def test_a_chat_nothing_was_sent_in_is_not_listed(alice: Any, chat_agent: Agent) -> None:
    session_create(user=alice, agent=chat_agent, title="started and left")
    _with_a_turn(session_create(user=alice, agent=chat_agent, title="talked"))
    home = _signed_in(alice).get("/").content.decode()
    assert "talked" in home and "started and left" not in home


@pytest.mark.django_db
def test_a_turn_still_being_answered_says_so(alice: Any, chat_agent: Agent) -> None:
    """Back on the page while the reply is still being written (a reload mid-stream): not an empty bubble."""
    session = session_create(user=alice, agent=chat_agent)
    Turn.objects.create(session=session, seq=1, user_message="first", assistant_message="done.", status="completed")
    Turn.objects.create(session=session, seq=2, user_message="second", status="running")
    page = _signed_in(alice).get(f"/chats/{session.pk}/").content.decode()
    assert page.count("Being answered…") == 1 and page.count('data-running="1"') == 1 and "done." in page


def test_raw_html_in_a_reply_is_shown_as_text_and_cannot_swallow_the_rest() -> None:
    """Markdown passed raw HTML through to the sanitizer: a tag it does not allow lost its name ("use the
    <div> tag" read "use the  tag"), and an unclosed <iframe took every word after it as its own text."""
    from web.chat.rendering import markdown_to_safe_html

    html = markdown_to_safe_html("**markdown** <iframe src=//evil> and **after**, `<b>` in code, use the <div> tag")
    assert active_parts(html) == []
    assert "<strong>after</strong>" in html and "&lt;iframe src=//evil&gt;" in html
    assert "use the &lt;div&gt; tag" in html and "<code>&lt;b&gt;</code>" in html
    assert "&lt;/p&gt;" not in html
    link = markdown_to_safe_html("[go](javascript:alert(1)) <https://example.com>")
    assert active_parts(link) == [] and 'href="https://example.com"' in link


@pytest.mark.django_db
def test_the_home_page_says_which_agents_the_demo_model_answers(alice: Any, chat_agent: Agent) -> None:
    _with_a_turn(session_create(user=alice, agent=chat_agent, title="My demo chat"))
    page = _signed_in(alice).get("/").content.decode()
    assert "My demo chat" in page
    assert page.count("demo model, not an LLM") == 3  # the agent choice, the note under it, the chat


def test_markdown_too_deep_for_the_parser_is_plain_text_and_a_models_br_is_a_line_break() -> None:
    from web.chat.rendering import markdown_to_safe_html

    deep = "\n".join("    " * i + "- x" for i in range(2000))  # a RecursionError after 48 s, before
    shown = markdown_to_safe_html(deep)
    assert shown.startswith("<p>- x<br>") and active_parts(shown) == []
    table = markdown_to_safe_html("| a |\n|---|\n| one<br>two |\n\n`<br>` stays in code")
    assert "<td>one<br>two</td>" in table and "<code>&lt;br&gt;</code>" in table
    inline = markdown_to_safe_html("E = mc<sup>2</sup>, <b>bold</b>, <b onclick=x>not a tag</b>, <div>")
    assert "mc<sup>2</sup>" in inline and "<b>bold</b>" in inline and active_parts(inline) == []
    assert "&lt;b onclick=x&gt;" in inline and "&lt;div&gt;" in inline


@pytest.mark.django_db(transaction=True)
def test_a_reply_that_cannot_be_rendered_does_not_stop_the_stream_or_the_turn_after_it(
    alice: Any, chat_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream renders each reply's HTML: a failure there (the recovered answer of an earlier message, here)
    sends that event without HTML, and the new message is still answered."""
    from orchestrator.runtime import turn_stream
    from web.chat import streaming

    session = session_create(user=alice, agent=chat_agent)
    turn_stream(session=session, message="hello").close()  # its answer cut off: recovered by the next message
    real = streaming.markdown_to_safe_html
    calls: list[str] = []

    def fails_first(text: str) -> str:
        calls.append(text)
        if len(calls) == 1:
            raise RecursionError("maximum recursion depth exceeded")
        return real(text)

    monkeypatch.setattr(streaming, "markdown_to_safe_html", fails_first)
    events = _stream(_signed_in(alice), session, "second")

    kinds = [kind for kind, _ in events]
    assert kinds.count("recovered") == 1 and kinds[-1] == "done" and "error" not in kinds
    recovered = next(data for kind, data in events if kind == "recovered")
    assert "html" not in recovered and recovered["reply"]
    assert list(Turn.objects.filter(session=session).order_by("seq").values_list("status", flat=True)) == [
        "completed",
        "completed",
    ]


def _events(client: Client, session: ChatSession, since: str) -> list[tuple[str, dict[str, Any]]]:
    response = client.get(f"/chats/{session.pk}/events/", {"since": since})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
    found = []
    for chunk in b"".join(response.streaming_content).decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line)
        if "event" in lines:
            found.append((lines["event"], json.loads(lines["data"])))
    return found


@pytest.mark.django_db
def test_the_chat_events_say_what_staff_did_since_the_page_was_drawn(
    alice: Any, staff: Any, chat_agent: Agent, monkeypatch: Any
) -> None:
    from django.utils import timezone

    from orchestrator.runtime import handoff_reply, handoff_request
    from web.chat import events as views

    monkeypatch.setattr(views, "EVENTS_HOLD_SECONDS", 0.0)  # one look, then the page asks again
    session = _with_a_turn(session_create(user=alice, agent=chat_agent))
    client = _signed_in(alice)
    drawn = timezone.now().isoformat()
    # Nothing new (a status is repeated within the look-back margin: the page takes it as it is).
    assert [name for name, _ in _events(client, session, drawn) if name != "status"] == []

    assert handoff_request(session=session, actor=staff) is True
    assert handoff_request(session=session, actor=staff) is False  # already with a person
    handoff_reply(session=session, text="Hi, I'm Sam <b>from support</b>.", author=staff)
    events = _events(client, session, drawn)
    # With the state as people read it (the page's step panel shows that, not the name).
    assert ("status", {"status": "needs_human", "state": session.state, "label": "Chatting"}) in events
    [staff_event] = [data for name, data in events if name == "staff"]
    assert staff_event["author"] == "Support" and staff_event["text"] == "Hi, I'm Sam <b>from support</b>."
    # The page shows it apart and signed; the agent's own reply is unchanged.
    page = client.get(f"/chats/{session.pk}/").content.decode()
    assert "Support · a person on our team" in page and "&lt;b&gt;from support&lt;/b&gt;" in page
    turn = session.turns.get()
    assert turn.agent_message == "hello" and turn.assistant_message.endswith(
        "[Support (staff)] Hi, I'm Sam <b>from support</b>."
    )
    # Nobody else's events: someone else's chat is a 404.
    assert _signed_in(staff).get(f"/chats/{session.pk}/events/").status_code == 404


def test_the_memory_panel_lists_each_memory_once() -> None:
    from web.selectors import memory_panel_lists

    candidates = [
        {"id": 7, "kind": "semantic", "preview": "The user is vegetarian.", "kept": True, "tier": 1},
        {"id": 7, "kind": "semantic", "preview": "The user is vegetarian.", "kept": True, "tier": 2},
        {"id": 9, "kind": "episodic", "preview": "The user is  vegetarian.", "kept": True, "tier": 2},
        {"id": 7, "kind": "semantic", "preview": "The user is vegetarian.", "kept": False, "tier": 2},
        {"id": 11, "kind": "episodic", "preview": "Talked about Lisbon.", "kept": False, "tier": 2},
    ]
    lists = memory_panel_lists(candidates)
    assert [c["id"] for c in lists["retrieval_kept"]] == [7]
    assert [c["id"] for c in lists["retrieval_dropped"]] == [11]


@pytest.mark.django_db(transaction=True)
def test_one_user_holds_at_most_two_event_streams_at_once_on_the_database_cache(
    alice: Any, staff: Any, chat_agent: Agent, monkeypatch: Any, settings: Any
) -> None:
    """Ten event requests of one person at once on the default cache (the database table, shared by every
    process): two hold a thread and wait for news, eight answer at once and ask again a second later. The count used to
    be a read-then-write increment, which many requests at once all read as under the limit."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from django.core.cache import caches

    from orchestrator.runtime import handoff_request
    from web.chat import events as views

    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "app_cache"}}
    caches._settings = caches.settings = settings.CACHES  # type: ignore[attr-defined]
    monkeypatch.setattr(views, "cache", caches.create_connection("default"))
    monkeypatch.setattr(views, "EVENTS_HOLD_SECONDS", 3.0)
    session = _with_a_turn(session_create(user=alice, agent=chat_agent))
    assert handoff_request(session=session, actor=staff) is True  # with a person: an events request holds
    cookies = _signed_in(alice).cookies
    start = threading.Barrier(10)

    def listen(_: int) -> str:
        client = Client()
        client.cookies = cookies
        start.wait()
        response = client.get(f"/chats/{session.pk}/events/")
        return b"".join(response.streaming_content).decode()

    with ThreadPoolExecutor(max_workers=10) as pool:
        bodies = list(pool.map(listen, range(10)))
    assert sorted(": waiting" in body for body in bodies) == [False] * 8 + [True] * 2  # two held, eight at once
    assert all(body.rstrip().endswith(f"retry: {views.EVENTS_RETRY_MS}") for body in bodies)
    assert views.cache.get(f"chat-events-slot:{alice.pk}:0") is None  # the slots were given back


@pytest.mark.django_db
@pytest.mark.parametrize(
    "cursor",
    ["0001-01-01T00:00:00", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59.999999-14:00", "9999-12-31T23:59:59"],
)
def test_a_cursor_at_the_ends_of_time_is_taken_not_a_500(
    alice: Any, chat_agent: Agent, monkeypatch: Any, cursor: str
) -> None:
    from web.chat import events as views

    monkeypatch.setattr(views, "EVENTS_HOLD_SECONDS", 0.0)
    session = _with_a_turn(session_create(user=alice, agent=chat_agent))
    client = _signed_in(alice)
    events = _events(client, session, cursor)  # the ?since= of the page
    assert isinstance(events, list)
    by_header = client.get(f"/chats/{session.pk}/events/", HTTP_LAST_EVENT_ID=cursor)  # the browser's reconnect
    assert by_header.status_code == 200
    body = b"".join(by_header.streaming_content).decode()
    assert "id: " in body


@pytest.mark.django_db
def test_a_handed_off_chat_keeps_the_agents_last_memory_search_and_the_inspector(staff: Any, chat_agent: Agent) -> None:
    """Issue 36: after three turns answered by a person the memory panel said "No turn yet." and the staff
    context inspector was gone: those turns have no retrieval and no prompt. The panels show the agent's last."""
    memory_create(user=staff, kind="semantic", text="The user's parcel number is 4417.")
    session = session_create(user=staff, agent=chat_agent)
    assert turn_run(session=session, message="where is my parcel 4417").turn.retrieval
    ChatSession.objects.filter(pk=session.pk).update(status=ChatSession.Status.NEEDS_HUMAN)
    for message in ("hello?", "anyone there?", "parcel 4417 please"):
        turn_run(session=session, message=message)
    assert session.turns.count() == 4
    page = _signed_in(staff).get(f"/chats/{session.pk}/").content.decode()
    memory = page[page.index('id="memory-panel"') :]
    assert "No turn yet." not in memory
    assert "parcel number is 4417" in memory and "turn #1, the agent's last" in memory
    assert 'id="inspector"' in page and "turn #1 · staff" in page


@pytest.mark.django_db
def test_the_tool_a_turn_ran_is_still_marked_after_a_reload(alice: Any, booking_agent: Agent) -> None:
    """Issue 36: the live stream marks "tool book_flight ✓" under the reply; a reload lost it."""
    session = session_create(user=alice, agent=booking_agent)
    for message in BOOKING:
        turn_run(session=session, message=message)
    page = _signed_in(alice).get(f"/chats/{session.pk}/").content.decode()
    assert page.count('<span class="tool">tool book_flight ✓</span>') == 1


@pytest.mark.django_db
def test_the_collected_data_is_in_the_workflows_order_and_each_step_has_a_plain_label(
    alice: Any, booking_agent: Agent
) -> None:
    """Issue 36: the panel listed what was collected in the stored dict's order (jsonb keeps keys shortest
    first: "origin" after "passengers"), and named a step "How many travel"."""
    session = session_create(user=alice, agent=booking_agent)
    arrived = {"passengers": 2, "destination": "Paris", "booking_reference": "4U83VC", "origin": "London"}
    ChatSession.objects.filter(pk=session.pk).update(data=arrived, state="CONFIRMING")
    page = _signed_in(alice).get(f"/chats/{session.pk}/").content.decode()
    collected = page[page.index('id="collected"') : page.index("</dl>")]
    keys = [part.split("</dt>")[0] for part in collected.split("<dt>")[1:]]
    assert keys == ["origin", "destination", "passengers", "booking_reference"]
    assert ">Passengers</li>" in page and "How many travel" not in page


@pytest.mark.django_db
def test_staff_who_may_read_chats_open_a_persons_chat_read_only_with_its_inspector(
    alice: Any, bob: Any, viewer_staff: Any, django_user_model: Any, chat_agent: Agent
) -> None:
    """Issue 55: staff got a 404 on a user's chat and read its context only as raw JSON in the admin. With the view
    permissions on sessions, turns and memories they read it here, read-only; nobody else does."""
    session = session_create(user=alice, agent=chat_agent)
    turn_run(session=session, message="<script>alert('x')</script> What is my name?")
    url = f"/chats/{session.pk}/"
    for other in (bob, django_user_model.objects.create_user(username="bare", password="bare-pass-123", is_staff=True)):
        client = Client()
        client.force_login(other)
        assert client.get(url).status_code == 404
    reader = Client()
    reader.force_login(viewer_staff)
    page = reader.get(url)
    html = page.content.decode()
    assert page.status_code == 200 and 'id="reading-as-staff"' in html and "alice's chat as staff" in html
    assert 'id="inspector"' in html and 'id="composer"' not in html and "Delete chat" not in html
    assert "<script>alert" not in html and "&lt;script&gt;alert" in html
    own = Client()
    own.force_login(alice)
    assert 'id="composer"' in own.get(url).content.decode() and "as staff" not in own.get(url).content.decode()
