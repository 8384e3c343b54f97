"""The web chat in a real browser: headless Chromium from Debian's packages, driven by Playwright.

Alice signs in, starts a chat with the booking agent (the offline demo model), and books a flight:
each reply streams in piece by piece and the workflow panel advances to COMPLETED. Then staff open
the context inspector. Screenshots go to test-artifacts/screenshots/ (git-ignored).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.models import Agent
from llm.providers import DEMO_LABEL
from tests.web.test_mcp import mcp_url  # noqa: F401 - the MCP server over HTTP, a fixture of this module too
from tests.world import make_agent

# Playwright's sync API runs an event loop in this thread; Django would otherwise refuse the ORM calls
# that the fixtures make around it.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path("/usr/bin/chromium")
# `make screenshots` points this at docs/img/ (the pictures in the README and the docs).
SCREENSHOTS = Path(
    os.environ.get("SCREENSHOTS_DIR") or Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
BOOKING = ["I want to book a flight", "from London to Paris", "March 10 to March 15", "2 passengers", "yes"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium package")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def booking_agent(db: Any) -> Agent:
    return make_agent(
        name="Flight booker",
        slug="flight-booker",
        system_prompt="You book flights.",
        workflow="flight_booking",
        tools=["book_flight"],
    )


def _sign_in(page: Any, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")


def _start_chat(page: Any, agent_name: str) -> None:
    # The option reads the agent's name (then "(demo model, not an LLM)" when no LLM is configured).
    value = page.locator("select#agent option", has_text=agent_name).first.get_attribute("value")
    page.select_option("select#agent", value=value)
    page.click("form.new-chat button[type=submit]")
    page.wait_for_selector("#composer")


def _send(page: Any, message: str) -> Any:
    """Send a message and wait for its reply to finish; return the reply's list item."""
    done_before = page.locator("li.msg.assistant[data-done='1']").count()
    page.fill("#message", message)
    page.click("#send")
    page.wait_for_function(
        "n => document.querySelectorAll(\"li.msg.assistant[data-done='1']\").length > n",
        arg=done_before,
        timeout=30_000,
    )
    # The panels are re-fetched after "done": wait until the send button is usable again.
    page.wait_for_selector("#send:not([disabled])")
    return page.locator("li.msg.assistant[data-done='1']").last


def test_alice_books_a_flight_with_the_demo_model(
    browser: Any, live_server: Any, alice: Any, booking_agent: Agent
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    external: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(live_server.url) else external.append(r.url))

    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    page.screenshot(path=str(SCREENSHOTS / "01-home.png"), full_page=True)
    _start_chat(page, "Flight booker")
    assert page.locator("#demo-label").is_visible()
    assert page.locator("#demo-label").inner_text() == DEMO_LABEL
    # The workflow's label for the state; the state's name is for staff views.
    assert page.locator("#workflow-state").inner_text() == "Getting started"

    # Record every text the streaming bubble shows, to see the reply grow rather than appear at once.
    page.evaluate(
        """() => {
        window.__partials = [];
        new MutationObserver(() => {
          const b = document.querySelector('li.msg.assistant.streaming .bubble');
          if (b) window.__partials.push(b.textContent.length);
        }).observe(document.getElementById('turns'), {subtree: true, childList: true, characterData: true});
      }"""
    )

    states, labels = [], []
    for i, message in enumerate(BOOKING, start=1):
        reply = _send(page, message)
        assert int(reply.get_attribute("data-deltas") or 0) > 1, "the reply should arrive in several pieces"
        assert reply.locator(".bubble").inner_text().strip()
        states.append(page.locator("#workflow-state").get_attribute("data-state"))
        assert "_" not in page.locator("#workflow-state").inner_text()
        labels.append(page.locator("#workflow-state").inner_text())
        page.screenshot(path=str(SCREENSHOTS / f"02-booking-{i}-{states[-1].lower()}.png"), full_page=True)

    partials = page.evaluate("window.__partials")
    assert len(set(partials)) > 2, partials
    assert states[0] != "IDLE" and states[-1] == "COMPLETED"
    assert states.index("CONFIRMING") > states.index("GATHERING_PASSENGERS")
    collected = page.locator("#collected").inner_text()
    for value in ("London", "Paris", "2", "booking_reference"):
        assert value in collected
    assert "Booking reference" in page.locator("li.msg.assistant").last.inner_text()
    assert page.locator("#workflow-panel .steps li.current").inner_text() == "Booked"
    # Set live from each turn's state event, as the panel's reload would (labels, not names).
    assert labels[-1] == "Booked" and "Checking the details" in labels, labels
    # No context inspector for a non-staff user.
    assert page.locator("#inspector").count() == 0

    # A phone-sized screen: everything fits without sideways scrolling.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    assert page.locator("#demo-label").is_visible()
    page.screenshot(path=str(SCREENSHOTS / "03-phone.png"), full_page=True)

    page.click("header button:has-text('Sign out')")
    page.wait_for_url("**/accounts/login/")
    assert external == [], f"the page loaded from outside: {external}"
    context.close()


def test_staff_open_the_context_inspector(browser: Any, live_server: Any, staff: Any, booking_agent: Agent) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    external: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(live_server.url) else external.append(r.url))
    _sign_in(page, live_server.url, "staff", "staff-pass-123")
    _start_chat(page, "Flight booker")
    assert page.locator("#inspector").count() == 0  # nothing to inspect before the first turn
    _send(page, "I want to fly from Oslo to Rome")
    inspector = page.locator("#inspector")
    inspector.wait_for()
    assert "prompt tokens" in inspector.inner_text()
    segments = inspector.locator(".bar .seg")
    assert segments.count() >= 3
    names = [segments.nth(i).get_attribute("title") or "" for i in range(segments.count())]
    assert any(n.startswith("system:") for n in names) and any(n.startswith("workflow:") for n in names)
    widths = [segments.nth(i).bounding_box()["width"] for i in range(segments.count())]
    assert all(w > 0 for w in widths)
    inspector.locator("summary").click()
    assert '"sections"' in inspector.locator("pre").inner_text()
    inspector.screenshot(path=str(SCREENSHOTS / "04-context-inspector.png"))
    page.screenshot(path=str(SCREENSHOTS / "05-staff-chat.png"), full_page=True)

    # From the inspector to the operators' views of the same session.
    session_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    inspector.locator("a:has-text('Session health')").click()
    page.wait_for_url(f"{live_server.url}/ops/sessions/{session_id}/")
    assert "GATHERING_DATES" in page.locator("body").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "06-session-health.png"), full_page=True)
    response = page.goto(f"{live_server.url}/ops/")
    assert response is not None and response.status == 200
    page.screenshot(path=str(SCREENSHOTS / "07-ops-dashboard.png"), full_page=True)
    assert external == [], f"the pages loaded from outside: {external}"
    context.close()


def test_a_refused_message_leaves_no_bubble_and_keeps_the_text(
    browser: Any, live_server: Any, alice: Any, booking_agent: Agent, settings: Any
) -> None:
    settings.MAX_MESSAGE_CHARS = 20
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    _start_chat(page, "Flight booker")
    too_long = "I want to book a flight to Paris"

    page.fill("#message", too_long)
    page.click("#send")
    page.wait_for_selector("#send:not([disabled])")

    error = page.locator("#chat-error")
    assert error.is_visible() and "limit is 20" in error.inner_text()
    assert page.locator("li.msg").count() == 0  # nothing was saved, so nothing is shown as sent
    assert page.input_value("#message") == too_long
    context.close()


def test_the_page_fills_a_recovered_answer_and_says_when_a_person_has_the_chat(
    browser: Any, live_server: Any, alice: Any, booking_agent: Agent
) -> None:
    """A message whose server died mid-answer is answered first by the next one (its `recovered` event): the
    page fills that bubble in place. A chat handed to a person gets no automatic reply: the page says so
    instead of showing an empty bubble."""
    from orchestrator.runtime import turn_stream
    from sessions.models import ChatSession, Turn

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    _start_chat(page, "Flight booker")
    session = ChatSession.objects.get(user=alice)
    turn_stream(session=session, message="I want to book a flight").close()  # saved, its answer cut off
    orphan = Turn.objects.get(session=session)
    assert orphan.status == Turn.Status.RUNNING

    page.reload()
    cut_off = page.locator(f'li.msg.assistant[data-turn="{orphan.pk}"] .bubble')
    # Followed from its events, it says a reply is being written (the typing dots), not an empty bubble.
    assert page.locator(f'li.msg.assistant[data-turn="{orphan.pk}"] .typing').count() == 1
    _send(page, "from London to Paris")
    orphan.refresh_from_db()
    assert orphan.status == Turn.Status.COMPLETED and orphan.assistant_message
    assert "Being answered" not in cut_off.inner_text() and cut_off.inner_text().strip()

    ChatSession.objects.filter(pk=session.pk).update(status=ChatSession.Status.NEEDS_HUMAN)
    reply = _send(page, "Can a person help me?")
    assert "this chat is with a person now" in reply.inner_text()
    page.reload()
    assert "this chat is with a person now" in page.locator("li.msg.assistant").last.inner_text()
    context.close()


def test_a_reply_still_cut_off_says_so_and_continue_asks_for_the_rest(
    browser: Any, live_server: Any, alice: Any, settings: Any, fake_openai: Any
) -> None:
    from llm.continuation import MAX_CONTINUATIONS
    from tests.fakes.openai_server import stream

    settings.LLM_PROFILES = {"default": fake_openai.profile(max_retries=0)}
    make_agent(name="Essayist", slug="essayist", system_prompt="Write long.", workflow="free_chat")
    # The reply and each of its continuations stop at the token limit: it is kept, and marked.
    fake_openai.enqueue(
        *(stream(f"Part {n} of the essay. ", finish_reason="length") for n in range(MAX_CONTINUATIONS + 1))
    )
    context = browser.new_context(viewport={"width": 390, "height": 844})  # a phone
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    _start_chat(page, "Essayist")

    reply = _send(page, "Write me an essay.")
    assert f"Part {MAX_CONTINUATIONS} of the essay." in reply.inner_text()
    note = reply.locator(".cut-note")
    assert note.is_visible() and "cut off" in note.inner_text()
    button = note.locator("button.continue-reply")
    button.scroll_into_view_if_needed()
    assert button.is_visible()
    page.screenshot(path=str(SCREENSHOTS / "cut-off-reply-phone.png"))

    fake_openai.enqueue(stream("And that is the end."))
    done_before = page.locator("li.msg.assistant[data-done='1']").count()
    button.click()
    page.wait_for_function(
        "n => document.querySelectorAll(\"li.msg.assistant[data-done='1']\").length > n", arg=done_before
    )
    last = page.locator("li.msg.assistant[data-done='1']").last
    assert "And that is the end." in last.inner_text()
    assert last.locator(".cut-note").count() == 0
    assert page.locator("button.continue-reply").count() == 0  # offered for the cut reply only, used once
    assert page.locator("li.msg.user .bubble").last.inner_text() == "Please continue where you stopped."
    # The request for the rest reached the model with the cut reply in the conversation.
    last_request = fake_openai.chat_requests()[-1].messages
    assert any("Part 0 of the essay." in str(m.get("content")) for m in last_request if m["role"] == "assistant")
    context.close()


@pytest.mark.real_embedder
def test_the_chat_says_starting_up_until_the_memory_model_is_loaded(
    browser: Any, live_server: Any, alice: Any, booking_agent: Agent, settings: Any, monkeypatch: Any
) -> None:
    from memory import embedding
    from memory.embedding import registry
    from web import warmup

    settings.EMBEDDING_BACKEND = "sentence-transformers"
    monkeypatch.setattr(registry, "_instances", {})  # as in a process that has not loaded it yet
    monkeypatch.setattr(warmup, "_thread", None)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    _start_chat(page, "Flight booker")
    notice = page.locator("#starting-up")
    notice.wait_for(state="visible", timeout=10_000)
    assert "Starting up" in notice.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "starting-up.png"))
    # The page asked /readyz, which started loading the model; once it is in, the notice goes.
    notice.wait_for(state="hidden", timeout=180_000)
    assert embedding.embedder_ready()
    context.close()


def test_every_page_runs_under_a_content_security_policy_without_a_violation(
    browser: Any, live_server: Any, staff: Any, booking_agent: Agent
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    refused: list[str] = []
    page.on("console", lambda msg: refused.append(msg.text) if "Content Security Policy" in msg.text else None)
    _sign_in(page, live_server.url, "staff", "staff-pass-123")
    _start_chat(page, "Flight booker")
    header = page.evaluate("async () => (await fetch(location.href)).headers.get('content-security-policy')")
    assert "script-src 'self'" in header and "unsafe-inline" not in header.split("script-src")[1].split(";")[0]
    reply = _send(page, "I want to book a flight")
    assert reply.is_visible()
    # Deleting asks first (a listener, not an inline handler): dismissed, nothing is deleted.
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("form.delete-chat button")
    assert "/chats/" in page.url
    for path in ("/", "/ops/", "/admin/agents/agent/add/", "/admin/agents/modelendpoint/add/"):
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
    page.goto(f"{live_server.url}/api/docs/")
    page.locator(".opblock").first.wait_for(state="visible", timeout=20_000)  # Swagger UI ran
    assert refused == []
    context.close()


DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def _in_view_above_composer(page: Any, item: Any) -> bool:
    """The element is wholly in the window, above the composer (which stays at the bottom of the window)."""
    box = item.bounding_box()
    composer = page.locator("#composer").bounding_box()
    return bool(box and composer and box["y"] >= 0 and box["y"] + box["height"] <= composer["y"] + 1)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_a_long_chat_opens_at_its_newest_message_and_a_new_reply_is_fully_visible(
    browser: Any, live_server: Any, alice: Any, viewport: dict[str, int]
) -> None:
    from sessions.models import ChatSession, Turn

    agent = make_agent(name="Chatter", slug="chatter", system_prompt="Chat.", workflow="free_chat")
    session = ChatSession.objects.create(user=alice, agent=agent, workflow="free_chat", state="CHATTING", title="Long")
    for seq in range(1, 31):
        Turn.objects.create(
            session=session,
            seq=seq,
            user_message=f"Question {seq}: tell me about the weather.",
            assistant_message=f"Answer {seq}. " + "It was sunny and mild all day. " * 6,
            status=Turn.Status.COMPLETED,
        )
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    page.goto(f"{live_server.url}/chats/{session.pk}/")
    page.wait_for_load_state("networkidle")
    newest = page.locator("li.msg.assistant").last
    assert "Answer 30." in newest.inner_text()
    assert _in_view_above_composer(page, newest), "the chat should open at its newest message"
    reply = _send(page, "And tomorrow?")
    assert _in_view_above_composer(page, reply), "the new reply should be wholly visible, above the composer"
    page.screenshot(path=str(SCREENSHOTS / f"long-chat-after-send-{viewport['width']}.png"))
    context.close()


def test_a_typing_indicator_shows_from_send_to_the_first_token(
    browser: Any, live_server: Any, alice: Any, settings: Any, fake_openai: Any
) -> None:
    from tests.fakes.openai_server import hang, stream

    settings.LLM_PROFILES = {"default": fake_openai.profile(read_timeout=30.0, max_retries=0)}
    make_agent(name="Slow", slug="slow", system_prompt="Think.", workflow="free_chat")
    fake_openai.enqueue(hang(2.0, then=stream("Here I am.")))
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    _start_chat(page, "Slow")
    page.fill("#message", "Are you there?")
    page.click("#send")
    dots = page.locator("li.msg.assistant .typing")
    dots.wait_for(state="visible", timeout=2_000)
    assert _in_view_above_composer(page, page.locator("li.msg.assistant").last)
    page.locator("li.msg.assistant[data-done='1']").wait_for(timeout=30_000)
    assert dots.count() == 0
    assert page.locator("li.msg.assistant").last.inner_text().startswith("Here I am.")
    context.close()


def test_an_expired_sign_in_says_so_and_keeps_the_typed_text(
    browser: Any, live_server: Any, alice: Any, booking_agent: Agent
) -> None:
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    _start_chat(page, "Flight booker")
    panels_before = page.locator("#panels").inner_html()
    # Signed out in another tab: the session cookie is gone.
    other = context.new_page()
    other.goto(f"{live_server.url}/")
    other.evaluate(
        """async () => {
            const token = document.cookie.split('; ').find(c => c.startsWith('csrftoken=')).split('=')[1];
            await fetch('/accounts/logout/', {method: 'POST', headers: {'X-CSRFToken': token}});
        }"""
    )
    other.close()
    page.fill("#message", "Book me a flight to Rome")
    page.click("#send")
    error = page.locator("#chat-error")
    error.wait_for(state="visible", timeout=10_000)
    assert "sign-in has expired" in error.inner_text()
    assert error.locator("a").get_attribute("href").startswith("/accounts/login/?next=/chats/")
    assert page.input_value("#message") == "Book me a flight to Rome"  # nothing lost
    assert page.locator("li.msg").count() == 0  # no empty bubble: nothing was sent
    assert page.locator("#panels").inner_html() == panels_before  # no sign-in page in the side panel
    page.screenshot(path=str(SCREENSHOTS / "sign-in-expired.png"))
    context.close()


def test_the_title_follows_the_first_message_and_a_cut_message_says_so(
    browser: Any, live_server: Any, alice: Any
) -> None:
    make_agent(name="Chatter", slug="chatter", system_prompt="Chat.", workflow="free_chat")
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    _start_chat(page, "Chatter")
    assert page.locator("#chat-title").inner_text() == "New chat"
    _send(page, "Trip to Lisbon\nWhat should I see first?")
    assert page.locator("#chat-title").inner_text() == "Trip to Lisbon"
    assert page.title().startswith("Trip to Lisbon")
    pasted = "A pasted itinerary line with many words in it. " * 600  # far over the message's budget
    _send(page, pasted)
    cut = page.locator("li.msg.user").last.locator(".cut-note")
    assert cut.is_visible() and "tokens in the middle were left out" in cut.inner_text()
    page.reload()
    assert page.locator("li.msg.user").last.locator(".cut-note").is_visible()  # said again on reload
    context.close()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_asking_for_a_person_hands_over_and_a_staff_reply_arrives_live_signed(
    browser: Any, live_server: Any, alice: Any, staff: Any, booking_agent: Agent, viewport: dict[str, int]
) -> None:
    from orchestrator.runtime import handoff_reply, handoff_resume
    from sessions.models import ChatSession

    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    _start_chat(page, "Flight booker")
    _send(page, "I want to book a flight from London to Paris")
    reply = _send(page, "Actually, I want to talk to a human")
    session = ChatSession.objects.get(user=alice)
    assert session.status == ChatSession.Status.NEEDS_HUMAN  # the decision's routing outcome, not a demo answer
    notice = page.locator("#with-a-person")
    assert notice.is_visible() and "A person on our team has this chat now" in notice.inner_text()
    assert "passed this conversation to a person" in reply.inner_text()

    # Staff answer from the admin's side: the reply appears in the open page, signed with the staff member's
    # name (never their username: "staff"), without a reload.
    staff.first_name, staff.last_name = "Sam", "Lee"
    staff.save(update_fields=["first_name", "last_name"])
    handoff_reply(session=session, text="Hello Alice, I'm Sam. Where would you like to go?", author=staff)
    staff_bubble = page.locator("li.msg.staff").last
    staff_bubble.wait_for(state="visible", timeout=15_000)
    assert "Hello Alice, I'm Sam." in staff_bubble.inner_text()
    assert staff_bubble.locator(".who").inner_text() == "Sam Lee · a person on our team"
    assert _in_view_above_composer(page, staff_bubble)
    page.screenshot(path=str(SCREENSHOTS / f"staff-reply-live-{viewport['width']}.png"))

    # Handed back: the page says so live too.
    handoff_resume(session=session, actor=staff)
    notice.wait_for(state="hidden", timeout=15_000)
    page.reload()
    assert page.locator("li.msg.staff").count() == 1  # kept, signed, after a reload as well
    assert page.locator("li.msg.staff .who").inner_text() == "Sam Lee · a person on our team"
    assert "(staff)]" not in page.locator("li.msg.assistant").last.inner_text()
    context.close()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_staff_live_chat_shows_the_user_live_and_hands_over_from_the_page(
    browser: Any, live_server: Any, alice: Any, staff: Any, viewport: dict[str, int]
) -> None:
    from sessions.models import ChatSession

    make_agent(name="Helper", slug="helper", system_prompt="Help.", workflow="free_chat", tools=[])
    user_context, staff_context = browser.new_context(viewport=viewport), browser.new_context(viewport=viewport)
    user, desk = user_context.new_page(), staff_context.new_page()
    _sign_in(user, live_server.url, "alice", "alice-pass-123")
    _start_chat(user, "Helper")
    _send(user, "Hello, my parcel never came")
    session = ChatSession.objects.get(user=alice)

    desk.goto(f"{live_server.url}/admin/login/?next=/admin/chat_sessions/chatsession/{session.pk}/live/")
    desk.fill("input[name=username]", "staff")
    desk.fill("input[name=password]", "staff-pass-123")
    desk.click("input[type=submit]")
    desk.wait_for_selector("#live-transcript")
    assert desk.locator(".live-msg.user", has_text="my parcel never came").is_visible()

    # The user writes again: it shows on the staff's page by itself, with the agent's reply.
    _send(user, "It was order 4417, sent two weeks ago")
    newest = desk.locator(".live-msg.user", has_text="order 4417")
    newest.wait_for(state="visible", timeout=10_000)
    assert newest.bounding_box()["y"] < viewport["height"]  # in view, not below the fold

    # Staff take the chat: the user's page says a person has it, live.
    desk.fill("#id_reason", "parcel lost")
    desk.click("#hand-to-person")
    desk.wait_for_selector("#reply-form")
    notice = user.locator("#with-a-person")
    notice.wait_for(state="visible", timeout=15_000)
    desk.fill("#id_staff_reply", "Hello Alice, I'm Sam from the parcel desk. Let me look into 4417.")
    desk.click("#send-reply")
    desk.wait_for_selector(".live-msg.staff")
    mine = desk.locator(".live-msg.staff").last
    assert "Sam from the parcel desk" in mine.inner_text() and mine.is_visible()
    staff_bubble = user.locator("li.msg.staff").last
    staff_bubble.wait_for(state="visible", timeout=15_000)
    assert "Sam from the parcel desk" in staff_bubble.inner_text()
    assert desk.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    desk.screenshot(path=str(SCREENSHOTS / f"staff-live-chat-{viewport['width']}.png"))

    desk.click("#hand-back")
    desk.wait_for_selector("#hand-to-person")
    notice.wait_for(state="hidden", timeout=15_000)
    user_context.close()
    staff_context.close()


def test_the_memory_list_gives_the_text_room_and_try_retrieval_keeps_each_candidate_to_a_line(
    browser: Any, live_server: Any, staff: Any, alice: Any
) -> None:
    from memory.services import memory_create

    for i in range(30):
        memory_create(user=alice, kind="semantic", text=f"Fact {i}: the user likes long walks along the river. " * 3)
    itinerary = "Day 1: Lisbon, the castle and the old town. " * 200  # one pasted itinerary
    memory_create(user=alice, kind="episodic", text=f"User: here is my itinerary. {itinerary}")
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    _sign_in(page, live_server.url, "staff", "staff-pass-123")
    page.goto(f"{live_server.url}/admin/memory/memory/")
    text_cell = page.locator("#result_list td.field-short_text").first
    # The text is the widest column, with room to read (the admin's menu takes 300 px at 1280).
    widths = page.evaluate(
        "[...document.querySelectorAll('#result_list tbody tr:first-child td, #result_list tbody tr:first-child th')].map(c => c.getBoundingClientRect().width)"
    )
    assert text_cell.bounding_box()["width"] >= 240 and text_cell.bounding_box()["width"] == pytest.approx(
        max(widths), abs=1
    )
    # Nothing clipped: the table fits the window and its own box, no column pushed off to the right.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    box = page.evaluate(
        "(() => { const r = document.querySelector('#changelist .results'); return [r.scrollWidth, r.clientWidth]; })()"
    )
    assert box[0] <= box[1] + 1, box
    page.screenshot(path=str(SCREENSHOTS / "memory-list-1280.png"))

    page.goto(
        f"{live_server.url}/admin/memory/memory/try-retrieval/?user={alice.pk}&query=itinerary+Lisbon&budget_tokens=2000"
    )
    rows = page.locator("#candidates tbody tr")
    assert rows.count() > 0
    long_row = page.locator("#candidates tr", has_text="here is my itinerary").first
    assert long_row.bounding_box()["height"] < 120  # collapsed to a line, the whole text a click away
    assert not long_row.locator(".full-text").is_visible()
    long_row.locator("summary").click()
    assert long_row.locator(".full-text").is_visible()
    context.close()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_curation_desk_for_a_user_with_many_memories(
    browser: Any, live_server: Any, staff: Any, alice: Any, viewport: dict[str, int]
) -> None:
    from memory.services import memory_create

    for i in range(55):
        memory_create(
            user=alice, kind="episodic" if i % 3 else "semantic", text=f"Memory {i}: the user said thing {i}."
        )
    pinned_target = memory_create(user=alice, kind="semantic", text="The user is allergic to peanuts.")
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    _sign_in(page, live_server.url, "staff", "staff-pass-123")
    page.goto(f"{live_server.url}/admin/memory/memory/desk/")
    page.fill("#username", "alice")
    page.click("#desk-user input[type=submit]")
    page.wait_for_url(f"**/desk/{alice.pk}/")
    first = page.locator(f"#memory-{pinned_target.pk}")
    assert first.is_visible() and "allergic to peanuts" in first.inner_text()
    box = first.locator(".text").bounding_box()
    assert box is not None and box["width"] >= min(250, viewport["width"] * 0.6)  # the text has the room
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")  # nothing clipped
    page.screenshot(path=str(SCREENSHOTS / f"curation-desk-{viewport['width']}.png"))
    first.locator("button", has_text="Pin").click()
    page.wait_for_load_state("networkidle")
    assert "pinned" in page.locator(f"#memory-{pinned_target.pk}").inner_text()
    context.close()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_try_retrieval_shows_each_candidates_scores_at_desktop_and_phone_sizes(
    browser: Any, live_server: Any, staff: Any, alice: Any, viewport: dict[str, int]
) -> None:
    """The scores a fused score is made of (cosine, crowding, words) are columns of the candidates' table:
    the table scrolls inside its own box, the page itself never scrolls sideways, and the columns can be
    reached at a phone's width."""
    from memory.services import memory_create

    for text in ("User: I sail on Sundays", "User: my boat is called Wren", "User: I bake rye bread"):
        memory_create(user=alice, kind="episodic", text=text)
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    _sign_in(page, live_server.url, "staff", "staff-pass-123")
    page.goto(
        f"{live_server.url}/admin/memory/memory/try-retrieval/?user={alice.pk}&query=sailing+boat&budget_tokens=500"
    )
    headers = [h.strip() for h in page.locator("#candidates thead th").all_text_contents()]
    assert [h for h in headers if h in ("cosine", "crowding", "words")] == ["cosine", "crowding", "words"]
    first = page.locator("#candidates tbody tr").first
    if viewport is DESKTOP:
        # The text column is on screen with room to read, not cut off at the box's edge (issue 36).
        text = first.locator("td.candidate-text").bounding_box()
        assert text is not None and text["width"] >= 200 and text["x"] + text["width"] <= viewport["width"]
    cells = [c.strip() for c in first.locator("td").all_text_contents()]
    cosine = cells[headers.index("cosine")]
    assert cosine != "—" and 0.0 <= float(cosine) <= 1.0
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    crowding_header = page.locator("#candidates thead th", has_text="crowding")
    crowding_header.scroll_into_view_if_needed()
    box = crowding_header.bounding_box()
    assert box is not None and 0 <= box["x"] and box["x"] + box["width"] <= viewport["width"] + 1
    name = "desktop" if viewport is DESKTOP else "phone"
    page.screenshot(path=str(SCREENSHOTS / f"try-retrieval-{name}.png"))
    context.close()


# A normal booking that takes 15 turns (small talk and questions on the way): its prompts grow with the history,
# as every chat's do, and nothing else happens.
FIFTEEN_TURNS = [
    "Hi",
    "I'd like to book a flight",
    "From London to Paris",
    "hmm",
    "what do you need?",
    "March 10 to March 15",
    "ok",
    "tell me more",
    "2 passengers",
    "wait",
    "what do I have so far",
    "ok fine",
    "sure",
    "really",
    "yes",
]


SPILLED_CARDS = """[...document.querySelectorAll('.cards .card')].filter((card, i, cards) => {
  const box = card.getBoundingClientRect(), next = cards[i + 1] && cards[i + 1].getBoundingClientRect();
  const inside = [...card.querySelectorAll('*')].every(e => e.getBoundingClientRect().right <= box.right + 1);
  return card.scrollWidth > card.clientWidth + 1 || !inside
    || (next && Math.abs(next.top - box.top) < 1 && next.left < box.right - 1);
}).map(card => card.innerText.slice(0, 60))"""


def test_a_normal_15_turn_booking_is_healthy_on_both_ops_pages_and_its_admin_page_fits_1280(
    browser: Any, live_server: Any, staff: Any, alice: Any, booking_agent: Agent
) -> None:
    """Issue 36: /ops/ listed no session at risk while the session's own page called this one "at risk"
    (prompt tokens up 85 %); its cards spilled their text; and the session's admin page was 1,466 px wide at
    1280, the checkpoints' "Resume from #N" off the screen."""
    from orchestrator.runtime import turn_run
    from sessions.services import session_create

    session = session_create(user=alice, agent=booking_agent)
    for message in FIFTEEN_TURNS:
        assert turn_run(session=session, message=message).turn.status == "completed"
    session.refresh_from_db()
    assert session.state == "COMPLETED"
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    _sign_in(page, live_server.url, "staff", "staff-pass-123")

    page.goto(f"{live_server.url}/ops/")
    assert page.locator(f"#at-risk a[href*='{session.pk}']").count() == 0
    page.goto(f"{live_server.url}/ops/sessions/{session.pk}/")
    assert page.locator("#verdict").inner_text() == "Verdict: healthy"
    for url in ("/ops/", f"/ops/sessions/{session.pk}/"):
        page.goto(live_server.url + url)
        for viewport in (DESKTOP, PHONE):
            page.set_viewport_size(viewport)
            # No card's text runs past its card, and no card runs into the next one.
            spilled = page.evaluate(SPILLED_CARDS)
            assert spilled == [], (url, viewport, spilled)
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), (url, viewport)
        page.set_viewport_size(DESKTOP)

    page.goto(f"{live_server.url}/admin/chat_sessions/chatsession/{session.pk}/change/")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    resume = page.locator("#checkpoints-group button", has_text="Resume from #").last
    resume.scroll_into_view_if_needed()
    box = resume.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= DESKTOP["width"]
    page.screenshot(path=str(SCREENSHOTS / "session-admin-1280.png"))
    context.close()


def test_the_curation_desk_keeps_its_place_after_an_action(
    browser: Any, live_server: Any, staff: Any, alice: Any
) -> None:
    """Issue 36: after a pin, an archive or an edit the desk came back at its top; it comes back at the memory
    acted on."""
    from memory.services import memory_create

    made = [
        memory_create(user=alice, kind="semantic", text=f"Fact {i}: the user collects stamp {i}.") for i in range(40)
    ]
    # Newest first: the 10th oldest is far down the page.
    target = made[9]
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    _sign_in(page, live_server.url, "staff", "staff-pass-123")
    page.goto(f"{live_server.url}/admin/memory/memory/desk/{alice.pk}/")
    row = page.locator(f"#memory-{target.pk}")
    row.scroll_into_view_if_needed()
    assert page.evaluate("window.scrollY") > 0
    for button, badge in (("Pin", "pinned"), ("Archive", "archived")):
        with page.expect_navigation():
            row.locator("button", has_text=button).click()
        page.wait_for_load_state("load")
        assert badge in row.inner_text()
        box = row.bounding_box()
        assert page.evaluate("window.scrollY") > 0, f"after {button} the desk went back to its top"
        assert box is not None and 0 <= box["y"] and box["y"] + box["height"] <= DESKTOP["height"]
    # An edit in place too.
    row.locator("summary", has_text="Edit").click()
    row.locator("textarea").fill("The user collects stamps from Portugal.")
    with page.expect_navigation():
        row.locator("button", has_text="Save the new text").click()
    page.wait_for_load_state("load")
    assert "stamps from Portugal" in row.inner_text()
    box = row.bounding_box()
    assert box is not None and 0 <= box["y"] and box["y"] + box["height"] <= DESKTOP["height"]
    context.close()


def test_a_20000_character_message_is_clamped_with_show_all_and_the_side_panels_stay_in_view(
    browser: Any, live_server: Any, alice: Any
) -> None:
    """Issue 36: a pasted 20,000-character message was drawn at full height, and the side panels (workflow,
    memory) scrolled away with a long chat."""
    from sessions.models import ChatSession, Turn

    agent = make_agent(name="Chatter", slug="chatter", system_prompt="Chat.", workflow="free_chat")
    session = ChatSession.objects.create(user=alice, agent=agent, workflow="free_chat", state="CHATTING", title="Long")
    pasted = ("A pasted log line with words in it, again and again. " * 380)[:20_000]
    for seq in range(1, 21):
        Turn.objects.create(
            session=session,
            seq=seq,
            user_message=pasted if seq == 10 else f"Question {seq}: tell me about the weather.",
            assistant_message=f"Answer {seq}. " + "It was sunny and mild all day. " * 6,
            status=Turn.Status.COMPLETED,
        )
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    page.goto(f"{live_server.url}/chats/{session.pk}/")
    page.wait_for_load_state("networkidle")

    # At the newest message, the bottom of a long page: the panels are still in the window.
    assert page.evaluate("window.scrollY") > 0
    panel = page.locator("#workflow-panel").bounding_box()
    assert panel is not None and 0 <= panel["y"] < DESKTOP["height"], panel

    long_message = page.locator("li.msg.user", has_text="A pasted log line").first
    long_message.scroll_into_view_if_needed()
    bubble = long_message.locator(".bubble")
    assert bubble.bounding_box()["height"] < 400
    toggle = long_message.locator("button.expand")
    assert toggle.inner_text() == "Show all"
    toggle.click()
    assert bubble.bounding_box()["height"] > 2000
    assert toggle.inner_text() == "Show less"
    # A short message has no button.
    assert page.locator("li.msg.user", has_text="Question 11").locator("button.expand").count() == 0
    context.close()


def test_every_open_tab_shows_every_turn_from_every_door(
    browser: Any,
    live_server: Any,
    alice: Any,
    mcp_url: str,  # noqa: F811
) -> None:
    """One chat open in two tabs: a message sent from either, from the API and from MCP appears in both, with its
    reply, within 2 s of its end; a page loaded while a turn runs shows that turn's reply when it ends, without
    a reload (issue 55: the second tab showed nothing, not live and not later)."""
    from concurrent.futures import ThreadPoolExecutor

    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from orchestrator.runtime import turn_stream
    from sessions.models import ChatSession
    from tests.web.test_mcp import _run

    make_agent("chat")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    first = context.new_page()
    _sign_in(first, live_server.url, "alice", "alice-pass-123")
    _start_chat(first, "Chat")
    session = ChatSession.objects.get(user=alice)
    second = context.new_page()
    second.goto(first.url)
    second.wait_for_selector("#composer")

    def shows(page: Any, message: str) -> None:
        # The message, and a finished reply under it, within 2 s.
        page.wait_for_function(
            """m => [...document.querySelectorAll("li.msg.user")].some(li => li.innerText.includes(m)
                 && li.nextElementSibling && li.nextElementSibling.dataset.done === "1"
                 && li.nextElementSibling.innerText.trim().length > 0)""",
            arg=message,
            timeout=2_000,
        )

    _send(first, "Hello from the first tab")
    shows(second, "Hello from the first tab")
    _send(second, "And hello from the second")
    shows(first, "And hello from the second")

    api = APIClient()
    api.force_authenticate(alice)
    assert (
        api.post(
            f"/api/sessions/{session.pk}/messages/", {"message": "Sent through the API"}, format="json"
        ).status_code
        == 201
    )
    shows(first, "Sent through the API")
    shows(second, "Sent through the API")

    token = Token.objects.create(user=alice).key
    with ThreadPoolExecutor(max_workers=1) as pool:  # its own event loop, beside Playwright's in this thread
        sent = pool.submit(
            _run,
            mcp_url,
            token,
            lambda client: client.call_tool(
                "send_message", {"message": "Sent over MCP", "session_id": str(session.pk)}
            ),
        ).result()
    assert not sent.is_error
    shows(first, "Sent over MCP")
    shows(second, "Sent over MCP")

    # A page loaded while a turn runs: the turn saved and answering, then the page, then the turn's end.
    running = turn_stream(session=session, message="A question asked while a page loads")
    next(running)  # the turn is saved and has begun
    third = context.new_page()
    third.goto(first.url)
    third.wait_for_selector("#composer")
    for _event in running:
        pass
    shows(third, "A question asked while a page loads")
    for page in (first, second):
        shows(page, "A question asked while a page loads")
    for page in (first, second, third):
        assert page.locator("li.msg.user", has_text="Hello from the first tab").count() == 1  # never drawn twice
    context.close()


def test_a_change_of_mind_in_the_booking_books_the_new_city(
    browser: Any, live_server: Any, alice: Any, booking_agent: Agent
) -> None:
    """Issue 55's walk, as a person does it in the page, at phone size: "Actually Paris instead of Berlin" shows
    a Paris summary, asks again, and "yes" books Paris (it used to book Berlin)."""
    from examples.booking.models import Booking

    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    _start_chat(page, "Flight booker")
    first = _send(page, "book a flight from London to Berlin on 2027-01-15 for 2 passengers").inner_text()
    assert "Berlin" in first and "Shall I book it?" in first
    changed = _send(page, "Actually Paris instead of Berlin")
    assert "Paris" in changed.inner_text() and "Shall I book it?" in changed.inner_text()
    assert changed.is_visible() and changed.bounding_box()["y"] < 844  # in the viewport, not below it
    booked = _send(page, "yes").inner_text()
    booking = Booking.objects.get(session__user=alice)
    assert booking.destination == "Paris" and booking.reference in booked
    context.close()
