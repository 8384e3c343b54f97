"""Edit, regenerate and versions in a real browser (headless Chromium, Playwright), at desktop and phone sizes:
Alice edits a message she sent and regenerates a reply, moves between the versions (‹ 1/2 ›), and a second tab on
the same chat follows each move without a reload. Screenshots go to test-artifacts/screenshots/."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent
from sessions.models import ChatSession
from tests.browser.test_chat_browser import (  # noqa: F401 - the browser, a fixture of this module too
    DESKTOP,
    PHONE,
    SCREENSHOTS,
    _send,
    _sign_in,
    _start_chat,
    browser,
)
from tests.world import make_agent

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _fits(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"))


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_edit_regenerate_and_versions_with_a_second_tab_following(
    browser: Any,  # noqa: F811 - the fixture imported above
    live_server: Any,
    alice: Any,
    viewport: dict[str, int],
) -> None:
    agent: Agent = make_agent("chat", name="Chatty")
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    _sign_in(page, live_server.url, "alice", "alice-pass-123")
    _start_chat(page, agent.name)
    _send(page, "I live in Berlin")
    _send(page, "What should I visit?")
    original_url = page.url
    source = ChatSession.objects.get(user=alice)

    # A second tab on the same chat.
    other = context.new_page()
    other.goto(original_url)
    other.wait_for_selector("li.msg.user .edit-message")

    # Edit the first message: the chat branches there, and the edited message is sent on the new branch.
    first = page.locator("li.msg.user").first
    first.locator(".edit-message").click()
    area = first.locator("form.edit textarea")
    assert area.input_value() == "I live in Berlin"
    area.fill("I live in Paris")
    first.locator(".save-edit").click()
    page.wait_for_url(lambda url: url != original_url, timeout=15_000)
    page.wait_for_selector("li.msg.assistant[data-done='1']", timeout=30_000)
    branch = ChatSession.objects.get(parent=source)
    assert page.url.endswith(f"/chats/{branch.pk}/")
    assert page.locator("li.msg.user").all_inner_texts()[0].startswith("I live in Paris")
    assert page.locator("li.msg.user").count() == 1
    # The other tab follows the branch, as it follows new turns.
    other.wait_for_url(f"**/chats/{branch.pk}/", timeout=15_000)
    other.wait_for_selector("li.msg.user", timeout=15_000)
    assert "I live in Paris" in other.locator("li.msg.user").first.inner_text()

    # After a reload the reply shows its versions: 2/2, with ‹ back to the first.
    page.reload()
    assert page.locator("nav.versions .version-count").inner_text() == "2/2"
    assert _fits(page)
    page.screenshot(path=str(SCREENSHOTS / f"branch-edited-{viewport['width']}.png"), full_page=True)
    page.locator("nav.versions a.version-previous").click()
    page.wait_for_url(original_url, timeout=15_000)
    assert page.locator("nav.versions .version-count").first.inner_text() == "1/2"
    assert page.locator("li.msg.user").count() == 2  # the original, as it was
    other.wait_for_url(original_url, timeout=15_000)

    # Regenerate the last reply: a branch at that turn with the same message; its versions read 2/2.
    before = set(ChatSession.objects.values_list("pk", flat=True))
    page.locator("li.msg.assistant").last.locator(".regenerate").click()
    page.wait_for_url(lambda url: url != original_url, timeout=15_000)
    page.wait_for_selector("li.msg.assistant[data-done='1']", timeout=30_000)
    (regenerated,) = set(ChatSession.objects.values_list("pk", flat=True)) - before
    assert page.locator("li.msg.user").all_inner_texts()[-1].startswith("What should I visit?")
    page.reload()
    counts = page.locator("nav.versions .version-count").all_inner_texts()
    assert counts == ["1/2", "2/2"]  # the first message's versions, and the regenerated reply's
    other.wait_for_url(f"**/chats/{regenerated}/", timeout=15_000)
    # Every finished turn can be edited and regenerated again, on any branch.
    page.wait_for_function("document.querySelectorAll('li.msg.assistant .regenerate').length === 2", timeout=30_000)
    assert page.locator("li.msg.user .edit-message").count() == 2
    assert _fits(page)
    page.screenshot(path=str(SCREENSHOTS / f"branch-regenerated-{viewport['width']}.png"), full_page=True)
    context.close()
