"""Memory kept straight across branches: "I live in Berlin" edited to "I live in Paris". On the new branch the
assistant recalls Paris and not Berlin; in the user's other chats too; on the original branch what was said there
(and not Paris). The rule is docs/memory.md's "Branches"."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from agents.models import Agent
from memory.models import Memory
from memory.retrieval import memories_for_prompt
from memory.services import turn_memories_write
from orchestrator.runtime import turn_run
from sessions.models import ChatSession
from sessions.services import session_create, session_fork


def _said(session: ChatSession, message: str) -> Any:
    result = turn_run(session=session, message=message)
    turn_memories_write(turn_id=result.turn.pk)  # the Celery task, here at once
    return result


def _recalled(turn: Any) -> str:
    """The text of every memory a turn's prompt was given."""
    items = (turn.retrieval or {}).get("items", [])
    texts = Memory.objects.filter(pk__in=[i["id"] for i in items]).values_list("text", flat=True)
    return "\n".join(texts)


@pytest.mark.django_db
def test_berlin_edited_to_paris_is_recalled_as_paris_and_never_both(
    alice: Any, agent: Agent, staff_client: Client
) -> None:
    source = session_create(user=alice, agent=agent)
    berlin_turn = _said(source, "I live in Berlin").turn
    _said(source, "I like trains and long walks")
    berlin = Memory.objects.get(source_turn=berlin_turn, kind=Memory.Kind.SEMANTIC)
    assert berlin.text == "The user lives in Berlin." and berlin.fact_key == "home_city"

    # The user edits their first message: a branch at turn 1, with the corrected message.
    branch = session_fork(session=source, at_turn=1)
    paris_turn = _said(branch, "I live in Paris").turn
    paris = Memory.objects.get(source_turn=paris_turn, kind=Memory.Kind.SEMANTIC)
    berlin.refresh_from_db()
    assert berlin.valid_to is not None  # the correction superseded it

    asked = _said(branch, "Where do I live?")
    recalled = _recalled(asked.turn)
    assert "Paris" in recalled and "Berlin" not in recalled, recalled
    assert "Paris" in asked.reply and "lives in Berlin" not in asked.reply

    # Back on the original branch: what was said there (Berlin, the episode), never what was said on the branch.
    back = _said(source, "Where do I live?")
    there = _recalled(back.turn)
    assert "Paris" not in there, there
    assert "Berlin" in back.reply and "Paris" not in back.reply, back.reply
    assert paris.pk not in [i["id"] for i in back.turn.retrieval.get("items", [])]

    # In another chat of hers: Paris, the fact in force; nothing said on the turn she edited away.
    elsewhere = session_create(user=alice, agent=agent)
    other = _said(elsewhere, "Where do I live?")
    assert "Paris" in _recalled(other.turn) and "Berlin" not in _recalled(other.turn), _recalled(other.turn)

    # A search outside any chat (the API's, MCP's) finds what is in force, not what was edited away.
    found = memories_for_prompt(user=alice, query="Where do I live? Berlin", budget_tokens=4000, touch=False)
    assert berlin_turn.pk not in {c.id for c in found.candidates if c.kept}
    texts = Memory.objects.filter(pk__in=[c.id for c in found.candidates]).values_list("text", flat=True)
    assert not [t for t in texts if "Berlin" in t], list(texts)

    # The desk: each memory of the branched chat says which branch it was said on; Berlin's fact is an earlier
    # value of the Paris one (superseded by the edit), and what was said on the edited turn is left behind.
    page = staff_client.get(f"/admin/memory/memory/desk/{alice.pk}/").content.decode()
    paris_row = page[page.index(f'id="memory-{paris.pk}"') :]
    paris_row = paris_row[: paris_row.index("</li>\n", paris_row.index("Earlier values:"))]
    assert "branch 2 of 2 of its chat, turn #1" in paris_row
    assert "“The user lives in Berlin.” until" in paris_row
    assert 'branch 1 of 2 of its chat, turn #1</span> · <span class="badge left-behind"' in paris_row
    episode = Memory.objects.get(source_turn=berlin_turn, kind=Memory.Kind.EPISODIC)
    episode_row = page[page.index(f'id="memory-{episode.pk}"') :]
    assert "left behind by an edit" in episode_row[: episode_row.index("</li>")]
