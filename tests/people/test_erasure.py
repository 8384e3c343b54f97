"""Erasing a person: through the API (themselves), the admin (staff) and a command; everything kept about them
goes, an audit row stays without the content, other people's data is untouched, and a task queued before the
erasure that runs after it finds nothing and writes nothing (a real worker)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from agents.models import Agent, Erasure, LLMCall
from conftest import wait_for
from memory.models import Memory
from memory.services import memory_create
from orchestrator.runtime import turn_run
from people.erasure import person_erase
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import session_create


def _life(user: Any, agent: Agent) -> ChatSession:
    session = session_create(user=user, agent=agent)
    turn_run(session=session, message="My name is Ana and I live in Porto.")
    memory_create(user=user, kind="semantic", text=f"{user.get_username()} likes green tea.")
    return session


@pytest.mark.django_db
def test_a_person_erases_their_own_data_through_the_api(alice: Any, bob: Any, chat_agent: Agent) -> None:
    _life(alice, chat_agent)
    theirs = _life(bob, chat_agent)
    api = APIClient()
    api.force_authenticate(alice)
    refused = api.post("/api/me/erase/", {}, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid"  # must say so explicitly
    response = api.post("/api/me/erase/", {"confirm": "erase my data"}, format="json")
    assert response.status_code == 200, response.content
    counts = response.json()["erased"]
    assert counts["sessions"] == 1 and counts["turns"] == 1 and counts["memories"] >= 1
    assert not ChatSession.objects.filter(user=alice).exists()
    assert not Memory.objects.filter(user=alice).exists()
    assert not Turn.objects.filter(session__user=alice).exists()
    # Bob's data is untouched.
    assert ChatSession.objects.filter(pk=theirs.pk).exists() and Memory.objects.filter(user=bob).exists()
    assert LLMCall.objects.filter(session=theirs).exists()
    # The audit row: who, whom, when, how much; nothing of what was said.
    erasure = Erasure.objects.get()
    assert (erasure.subject_id, erasure.actor_id) == (alice.pk, alice.pk)
    assert "Porto" not in str(erasure.counts) and "tea" not in str(erasure.counts)
    # They can go on: the account stays, empty.
    assert api.get("/api/sessions/").json()["results"] == []


@pytest.mark.django_db
def test_staff_erase_a_person_from_the_admin_after_confirming(staff: Any, alice: Any, chat_agent: Agent) -> None:
    _life(alice, chat_agent)
    client = Client()
    client.force_login(staff)
    url = "/admin/auth/user/"
    ask = client.post(url, {"action": "erase_people", "_selected_action": [alice.pk]})
    assert ask.status_code == 200 and "Erase everything kept about" in ask.content.decode()
    assert ChatSession.objects.filter(user=alice).exists()  # not before the confirmation
    client.post(url, {"action": "erase_people", "_selected_action": [alice.pk], "confirmed": "yes"})
    assert not ChatSession.objects.filter(user=alice).exists() and not Memory.objects.filter(user=alice).exists()
    assert Erasure.objects.get().actor_id == staff.pk


@pytest.mark.django_db
def test_the_command_erases_a_person(alice: Any, chat_agent: Agent) -> None:
    _life(alice, chat_agent)
    call_command("erase_person", "--user", "alice", "--yes")
    assert not ChatSession.objects.filter(user=alice).exists()
    assert Erasure.objects.get().actor_id is None
    assert not Checkpoint.objects.filter(session__user=alice).exists()


@pytest.mark.django_db
def test_the_command_without_yes_and_without_a_terminal_erases_nothing_and_says_why(
    alice: Any, chat_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from django.core.management.base import CommandError

    _life(alice, chat_agent)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # a pipe that says nothing: input() meets EOF
    with pytest.raises(CommandError, match="Pass --yes"):
        call_command("erase_person", "--user", "alice")
    assert ChatSession.objects.filter(user=alice).exists()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_task_queued_before_the_erasure_writes_nothing_after_it(
    celery_worker: Any, alice: Any, chat_agent: Agent
) -> None:
    from config.celery import app
    from people.erasure import person_erase

    session = session_create(user=alice, agent=chat_agent)
    turn = Turn.objects.create(
        session=session, seq=1, user_message="My name is Ana.", assistant_message="Hello Ana.", status="completed"
    )
    # Queued now, to run in three seconds: after the erasure below.
    queued = app.send_task("web.tasks.memory.write_turn_memories", args=[turn.pk], countdown=3)
    person_erase(user=alice, actor=None)

    def finished() -> list[str]:
        return [
            line
            for line in celery_worker.log_text().splitlines()
            if f"write_turn_memories[{queued.id}]" in line and ("succeeded" in line or "raised" in line)
        ]

    [line] = wait_for(finished, timeout=60, message=f"the queued memory write\n{celery_worker.log_text()[-2000:]}")
    assert "succeeded" in line and "'written': False" in line, line
    assert not Memory.objects.filter(user=alice).exists()
    assert not ChatSession.objects.filter(user=alice).exists()


@pytest.mark.django_db
def test_exporting_or_erasing_a_person_needs_the_datas_own_permissions(
    viewer_staff: Any, alice: Any, chat_agent: Agent
) -> None:
    from django.contrib.auth.models import Permission

    _life(alice, chat_agent)
    viewer_staff.user_permissions.add(Permission.objects.get(codename="change_user"))
    client = Client()
    client.force_login(viewer_staff)  # may view everything, delete nothing
    page = client.post(
        "/admin/auth/user/", {"action": "erase_people", "_selected_action": [alice.pk], "confirmed": "yes"}, follow=True
    )
    assert "needs the delete permissions" in page.content.decode()
    assert ChatSession.objects.filter(user=alice).exists() and not Erasure.objects.exists()


def _store_the_worst_dates(user: Any) -> None:
    """The dates PostgreSQL's timestamptz takes and Python cannot hold, written as another program could."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE chat_sessions_chatsession SET created_at = '4713-01-01 00:00:00+00 BC', updated_at = 'infinity'"
            " WHERE user_id = %s",
            [user.pk],
        )
        cursor.execute(
            "UPDATE chat_sessions_turn SET created_at = '-infinity', completed_at = '294276-12-31 23:59:59+00'"
            " WHERE session_id IN (SELECT id FROM chat_sessions_chatsession WHERE user_id = %s)",
            [user.pk],
        )
        cursor.execute(
            "UPDATE memory_memory SET occurred_at = '0001-01-01 00:00:00+00 BC', valid_from = '-infinity',"
            " created_at = '294276-12-31 23:59:59+00', expires_at = 'infinity' WHERE user_id = %s",
            [user.pk],
        )


@pytest.mark.django_db
def test_dates_python_cannot_hold_break_no_list_no_export_and_no_erasure(
    alice: Any, bob: Any, staff: Any, chat_agent: Agent
) -> None:
    _life(alice, chat_agent)
    _life(bob, chat_agent)
    _store_the_worst_dates(alice)
    _store_the_worst_dates(bob)
    api = APIClient()
    api.force_authenticate(alice)
    for path in ("/api/sessions/", "/api/memories/", f"/api/sessions/{ChatSession.objects.get(user=alice).pk}/"):
        assert api.get(path).status_code == 200, path
    assert api.get("/api/memories/search/", {"q": "green tea"}).status_code == 200
    exported = b"".join(api.get("/api/me/export/").streaming_content).decode()
    assert "green tea" in exported and '"created_at": "0001-01-02T00:00:00+00:00"' in exported
    admin = Client()
    admin.force_login(staff)
    session = ChatSession.objects.get(user=alice)
    for path in (
        "/admin/chat_sessions/chatsession/",
        "/admin/memory/memory/",
        "/admin/chat_sessions/turn/",
        f"/admin/chat_sessions/chatsession/{session.pk}/change/",
        f"/admin/memory/memory/{Memory.objects.filter(user=alice).values_list('pk', flat=True)[0]}/change/",
        "/ops/",
    ):
        assert admin.get(path).status_code == 200, path
    web = Client()
    web.force_login(alice)
    for path in ("/", f"/chats/{session.pk}/", f"/chats/{session.pk}/panels/"):
        assert web.get(path).status_code == 200, path
    events = web.get(f"/chats/{session.pk}/events/", {"since": "2026-01-01T00:00:00Z"})
    assert events.status_code == 200 and b"".join(events.streaming_content)
    # Erased through the service and through the API.
    assert person_erase(user=bob).counts["sessions"] == 1
    response = api.post("/api/me/erase/", {"confirm": "erase my data"}, format="json")
    assert response.status_code == 200, response.content
    assert not ChatSession.objects.filter(user__in=[alice, bob]).exists()
    assert not Memory.objects.filter(user__in=[alice, bob]).exists()


@pytest.mark.django_db
def test_the_erasure_deletes_the_event_streams_that_carry_the_persons_words(alice: Any, chat_agent: Agent) -> None:
    """A turn's events (its deltas, and a done event with the title and the reply) stay on the broker for
    RUN_EVENTS_KEEP_SECONDS: an erasure deletes them with the rows, and the session's change signals too."""
    import uuid

    from django.test import override_settings

    from core import events
    from tests.reliability.conftest import redis_queue_url

    with override_settings(RUN_EVENTS_URL=redis_queue_url(), RUN_EVENTS_PREFIX=f"erase-{uuid.uuid4().hex[:8]}"):
        session = _life(alice, chat_agent)
        turn = Turn.objects.filter(session=session).first()
        assert turn is not None
        events.publish(turn.pk, {"type": "done", "text": "ERASEMARK48 the reply"})
        events.session_changed(session.pk)
        assert events.flush() and events.exists(turn.pk)
        result = person_erase(user=alice)
        assert not events.exists(turn.pk)
        assert events.read(turn.pk, block_seconds=0.2) == []
        assert result.counts["event_streams"] == 2
        assert Erasure.objects.get().counts["event_streams"] == 2


@pytest.mark.django_db
def test_a_person_deletes_their_account_through_the_api(alice: Any, bob: Any, chat_agent: Agent) -> None:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    _life(alice, chat_agent)
    _life(bob, chat_agent)
    token = Token.objects.create(user=alice)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    refused = api.post("/api/me/delete/", {"confirm": "erase my data"}, format="json")
    assert refused.status_code == 400 and get_user_model().objects.filter(pk=alice.pk).exists()
    response = api.post("/api/me/delete/", {"confirm": "delete my account"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["deleted"] is True and response.json()["erased"]["sessions"] == 1
    assert not get_user_model().objects.filter(pk=alice.pk).exists()
    assert not Token.objects.filter(key=token.key).exists()
    assert api.get("/api/me/").status_code == 401  # the token went with the account
    erasure = Erasure.objects.get(subject_id=alice.pk)
    assert erasure.actor_id is None and erasure.counts["sessions"] == 1  # the record stays, without the account
    assert ChatSession.objects.filter(user=bob).count() == 1  # nobody else's


@pytest.mark.django_db
def test_a_person_deletes_their_account_from_its_page(alice: Any, chat_agent: Agent) -> None:
    from django.contrib.auth import get_user_model

    _life(alice, chat_agent)
    client = Client()
    client.force_login(alice)
    page = client.get("/account/")
    assert page.status_code == 200 and "Delete my account" in page.content.decode()
    wrong = client.post("/account/", {"confirm": "yes"}, follow=True)
    assert "Nothing was deleted" in wrong.content.decode() and get_user_model().objects.filter(pk=alice.pk).exists()
    done = client.post("/account/", {"confirm": "delete my account"}, follow=True)
    assert done.redirect_chain[-1][0].startswith("/accounts/login/")
    assert "were deleted" in done.content.decode()
    assert not get_user_model().objects.filter(pk=alice.pk).exists()
    assert client.get("/").status_code == 302  # signed out
    anonymous = Client().get("/account/")
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]
