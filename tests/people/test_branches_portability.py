"""Erasure, export and import carry a chat's branches: erasure takes every branch; an export lists each branch
with its parent, fork point and chat, and each memory with the turn it was said on; an import puts the branches
back together, and the memory's branch rule holds after it."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent
from memory.models import Memory
from memory.retrieval import memories_for_prompt
from memory.services import turn_memories_write
from orchestrator.runtime import turn_run
from people.erasure import person_erase
from people.portability import parse_export, person_export, person_import
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.selectors import chat_branches
from sessions.services import ForkRefused, session_create, session_delete, session_fork

pytestmark = pytest.mark.django_db


def _said(session: ChatSession, message: str) -> None:
    turn_memories_write(turn_id=turn_run(session=session, message=message).turn.pk)


def _branched_chat(user: Any, agent: Agent) -> tuple[ChatSession, ChatSession]:
    source = session_create(user=user, agent=agent)
    _said(source, "I live in Berlin")
    _said(source, "I like trains")
    branch = session_fork(session=source, at_turn=1)
    _said(branch, "I live in Paris")
    return source, branch


def _recalled_texts(user: Any, session: ChatSession | None, query: str) -> str:
    from memory.retrieval.sql import RecentWindow

    window = RecentWindow(session_id=session.pk, after_seq=99) if session is not None else None
    result = memories_for_prompt(user=user, query=query, budget_tokens=4000, touch=False, window=window)
    return "\n".join(Memory.objects.filter(pk__in=[c.id for c in result.candidates]).values_list("text", flat=True))


def test_erasure_takes_every_branch_of_every_chat(alice: Any, bob: Any, chat_agent: Agent) -> None:
    _branched_chat(alice, chat_agent)
    bobs = session_create(user=bob, agent=chat_agent)
    turn_run(session=bobs, message="Bob's")
    result = person_erase(user=alice)
    assert result.counts["sessions"] == 2
    assert not ChatSession.objects.filter(user=alice).exists() and not Memory.objects.filter(user=alice).exists()
    assert ChatSession.objects.filter(pk=bobs.pk).exists()


def test_deleting_the_branch_a_chat_was_branched_from_leaves_the_branch_whole(alice: Any, chat_agent: Agent) -> None:
    source, branch = _branched_chat(alice, chat_agent)
    session_delete(session=source)
    branch.refresh_from_db()
    assert (branch.parent_id, branch.forked_from_id, branch.fork_seq) == (None, None, 1)
    assert list(chat_branches(session=branch)) == [branch]
    turn_run(session=branch, message="Still here?")
    assert Turn.objects.filter(session=branch).count() == 2
    assert Checkpoint.objects.filter(session=branch).exists()


def test_export_and_import_carry_the_branches_and_the_branch_rule(alice: Any, chat_agent: Agent) -> None:
    source, branch = _branched_chat(alice, chat_agent)
    lines = list(person_export(user=alice))
    exported = [line for line in lines if '"type": "session"' in line]
    assert f'"parent": "{source.pk}"' in exported[1] and '"fork_turn": 1' in exported[1]
    assert all(f'"chat_root": "{source.pk}"' in line for line in exported)
    berlin_episode = Memory.objects.get(kind=Memory.Kind.EPISODIC, source_turn__session=source, source_turn__seq=1)
    assert any('"source_turn": 1' in line and "I live in Berlin" in line for line in lines)

    person_erase(user=alice)
    report = person_import(user=alice, parsed=parse_export(lines))
    assert report.created["sessions"] == 2
    back_source, back_branch = ChatSession.objects.get(pk=source.pk), ChatSession.objects.get(pk=branch.pk)
    assert (back_branch.parent_id, back_branch.fork_seq, back_branch.chat_root) == (source.pk, 1, source.pk)
    assert list(chat_branches(session=back_branch)) == [back_source, back_branch]
    episode = Memory.objects.get(kind=Memory.Kind.EPISODIC, text=berlin_episode.text)
    assert episode.source_turn is not None and (episode.source_turn.session_id, episode.source_turn.seq) == (
        source.pk,
        1,
    )
    # The rule holds after the import: on the branch, and outside the chat, Berlin's turn is not recalled.
    assert "I live in Berlin" not in _recalled_texts(alice, back_branch, "Where do I live? Berlin")
    assert "I live in Berlin" not in _recalled_texts(alice, None, "Where do I live? Berlin")
    assert "I live in Berlin" in _recalled_texts(alice, back_source, "Where do I live? Berlin")
    # Checkpoints are not in an export: an imported turn cannot be branched at, and says so.
    with pytest.raises(ForkRefused) as refused:
        session_fork(session=back_source, at_turn=1)
    assert refused.value.code == "checkpoint_gone" and refused.value.status == 409


def test_an_export_imported_by_someone_else_makes_branches_of_their_own(
    alice: Any, bob: Any, chat_agent: Agent
) -> None:
    source, branch = _branched_chat(alice, chat_agent)
    person_import(user=bob, parsed=parse_export(list(person_export(user=alice))))
    bobs = list(ChatSession.objects.filter(user=bob).order_by("created_at"))
    assert len(bobs) == 2 and not {s.pk for s in bobs} & {source.pk, branch.pk}
    assert bobs[1].parent_id == bobs[0].pk and bobs[1].chat_root == bobs[0].chat_root != source.chat_root
    # Neither sees the other's branches, by any id.
    assert list(chat_branches(session=bobs[1])) == bobs
    assert list(chat_branches(session=ChatSession.objects.get(pk=branch.pk))) == [
        ChatSession.objects.get(pk=source.pk),
        ChatSession.objects.get(pk=branch.pk),
    ]
