"""Branches in the web chat through Django's test client: edit and regenerate fork the chat at a turn (the page
then sends the message on the new branch), the versions of a turn (‹ 1/2 ›) link the branches, moving between
them moves the chat, and every open page learns of the move (the "branch" event); the home page lists a branched
chat once. Another person's chat is a 404 here as everywhere."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import Agent
from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Turn
from sessions.services import session_create
from web.chat.events import _news


def _signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _fork(client: Client, session: ChatSession, turn: Turn) -> Any:
    return client.post(
        f"/chats/{session.pk}/fork/", data=json.dumps({"turn_id": turn.pk}), content_type="application/json"
    )


@pytest.mark.django_db
def test_edit_forks_at_the_turn_and_the_versions_link_both_branches(alice: Any, chat_agent: Agent) -> None:
    source = session_create(user=alice, agent=chat_agent)
    first = turn_run(session=source, message="I live in Berlin").turn
    turn_run(session=source, message="What should I visit?")
    client = _signed_in(alice)
    page = client.get(f"/chats/{source.pk}/").content.decode()
    assert 'data-fork-url="/chats/' in page and 'nav class="versions"' not in page  # one version: no ‹ 1/1 ›

    response = _fork(client, source, first)
    assert response.status_code == 201, response.content
    branch = ChatSession.objects.get(pk=response.json()["session_id"])
    assert response.json()["url"] == f"/chats/{branch.pk}/"
    assert (branch.parent_id, branch.fork_seq, branch.turns.count()) == (source.pk, 1, 0)
    turn_run(session=branch, message="I live in Paris")  # what the page sends once it is there

    edited = client.get(f"/chats/{branch.pk}/").content.decode()
    assert '<span class="version-count">2/2</span>' in edited
    assert f'href="/chats/{source.pk}/" data-switch-url="/chats/{source.pk}/switch/"' in edited
    original = client.get(f"/chats/{source.pk}/").content.decode()
    assert '<span class="version-count">1/2</span>' in original and f'href="/chats/{branch.pk}/"' in original
    assert original.count('class="versions"') == 1  # turn 2 has one version: no nav under it
    # The home page lists the chat once: as the branch it is on.
    home = client.get("/").content.decode()
    assert f"/chats/{branch.pk}/" in home and f"/chats/{source.pk}/" not in home
    # A branch made and left empty (its message refused) hides nothing.
    empty = ChatSession.objects.get(pk=_fork(client, branch, branch.turns.get(seq=1)).json()["session_id"])
    home = client.get("/").content.decode()
    assert f"/chats/{branch.pk}/" in home and f"/chats/{empty.pk}/" not in home


@pytest.mark.django_db
def test_regenerate_is_a_fork_at_the_reply_with_the_same_message(alice: Any, chat_agent: Agent) -> None:
    source = session_create(user=alice, agent=chat_agent)
    turn_run(session=source, message="Hello")
    last = turn_run(session=source, message="Tell me a joke").turn
    client = _signed_in(alice)
    branch = ChatSession.objects.get(pk=_fork(client, source, last).json()["session_id"])
    turn_run(session=branch, message=last.user_message)
    page = client.get(f"/chats/{branch.pk}/").content.decode()
    assert page.count('class="versions"') == 1 and '<span class="version-count">2/2</span>' in page
    assert list(branch.turns.order_by("seq").values_list("user_message", flat=True)) == ["Hello", "Tell me a joke"]


@pytest.mark.django_db
def test_other_pages_of_the_chat_follow_a_fork_and_a_version_chosen(alice: Any, chat_agent: Agent) -> None:
    source = session_create(user=alice, agent=chat_agent)
    first = turn_run(session=source, message="Hello").turn
    drawn = timezone.now()  # a second tab drawn now
    client = _signed_in(alice)
    assert not [e for e in _news(source.pk, drawn) if e["event"] == "branch"]
    branch_id = _fork(client, source, first).json()["session_id"]
    moved = [e for e in _news(source.pk, drawn) if e["event"] == "branch"]
    assert moved == [{"event": "branch", "session_id": branch_id, "url": f"/chats/{branch_id}/"}]
    # A page opened on the old branch on purpose, after the move, stays there.
    assert not [e for e in _news(source.pk, timezone.now() + timedelta(seconds=1)) if e["event"] == "branch"]

    # Back to version 1 (‹): the chat moves there, and the branch's pages follow.
    on_branch = timezone.now()
    response = client.post(f"/chats/{source.pk}/switch/")
    assert response.status_code == 200 and response.json()["url"] == f"/chats/{source.pk}/"
    back = [e for e in _news(ChatSession.objects.get(pk=branch_id).pk, on_branch) if e["event"] == "branch"]
    assert back and back[0]["session_id"] == str(source.pk)


@pytest.mark.django_db
def test_someone_elses_chat_cannot_be_forked_or_switched_from_the_web(
    alice: Any, bob: Any, staff: Any, chat_agent: Agent
) -> None:
    source = session_create(user=alice, agent=chat_agent)
    first = turn_run(session=source, message="Hello").turn
    for person in (bob, staff):
        client = _signed_in(person)
        assert _fork(client, source, first).status_code == 404
        assert client.post(f"/chats/{source.pk}/switch/").status_code == 404
    # Alice's own chat, with a turn id of another chat: not found either.
    other = session_create(user=bob, agent=chat_agent)
    bobs = turn_run(session=other, message="Bob's").turn
    assert _fork(_signed_in(alice), source, bobs).status_code == 404
    assert ChatSession.objects.count() == 2
    # Signed out: the JSON 401 the page's script acts on.
    assert Client().post(f"/chats/{source.pk}/fork/", data="{}", content_type="application/json").status_code == 401
