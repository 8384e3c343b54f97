"""Branches through the API: a session forked at its first turn, its last one, and inside a half-finished
booking (the slots as they were, the booking never made twice); another user's session (or branch) is not found;
a fork under a running turn is refused and changes neither branch; idempotency holds on a branch."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from agents.models import Agent
from examples.booking.models import Booking
from sessions.locks import SessionTurnLock
from sessions.models import ChatSession, Checkpoint, Turn
from tests.api.conftest import assert_error

DEPART = date.today() + timedelta(days=90)
BOOKING_TALK = [
    "I need a flight",
    "From Madrid",
    "to Vienna",
    f"On {DEPART.strftime('%B %d %Y')}, one way",
    "2 passengers",
]


def _new_session(client: APIClient, agent: str = "flight-booker") -> str:
    response = client.post("/api/sessions/", {"agent": agent}, format="json")
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def _post(client: APIClient, session_id: str, message: str, key: str | None = None) -> Any:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(f"/api/sessions/{session_id}/messages/", {"message": message}, format="json", **headers)


def _say(client: APIClient, session_id: str, *messages: str) -> None:
    for message in messages:
        response = _post(client, session_id, message)
        assert response.status_code == 201, response.content


def _fork(client: APIClient, session_id: str, turn: int) -> Any:
    return client.post(f"/api/sessions/{session_id}/fork/", {"turn": turn}, format="json")


def _snapshot(session_id: str) -> tuple[Any, ...]:
    session = ChatSession.objects.get(pk=session_id)
    turns = list(Turn.objects.filter(session=session).order_by("seq").values_list("seq", "user_message", "status"))
    checkpoints = Checkpoint.objects.filter(session=session).count()
    return session.state, session.data, session.version, turns, checkpoints


@pytest.mark.django_db
def test_fork_at_the_first_turn_starts_the_chat_over_and_leaves_the_original(
    alice_client: APIClient, booking_agent: Agent
) -> None:
    source = _new_session(alice_client)
    _say(alice_client, source, *BOOKING_TALK[:3])
    before = _snapshot(source)

    response = _fork(alice_client, source, 1)
    assert response.status_code == 201, response.content
    branch = response.json()
    assert (branch["parent_session"], branch["fork_turn"], branch["chat_id"]) == (source, 1, source)
    assert (branch["state"], branch["data"]) == ("IDLE", {})
    assert Turn.objects.filter(session_id=branch["id"]).count() == 0
    assert _snapshot(source)[:4] == before[:4]  # the original as it was (a fork adds no turn, moves no state)

    # The branch takes its own first message, numbered 1.
    reply = _post(alice_client, branch["id"], "I need a flight from Rome")
    assert reply.status_code == 201 and reply.json()["turn"]["seq"] == 1
    # Its title is its own first message's, not the one it replaced.
    assert ChatSession.objects.get(pk=branch["id"]).title.startswith("I need a flight from Rome")
    listed = alice_client.get(f"/api/sessions/{source}/branches/").json()
    assert [b["id"] for b in listed] == [source, branch["id"]]
    assert alice_client.get(f"/api/sessions/{branch['id']}/branches/").json() == listed


@pytest.mark.django_db
def test_fork_at_the_last_turn_keeps_the_state_and_turns_before_it(
    alice_client: APIClient, booking_agent: Agent
) -> None:
    source = _new_session(alice_client)
    _say(alice_client, source, *BOOKING_TALK[:3])
    original = ChatSession.objects.get(pk=source)
    assert (original.state, original.data.get("destination")) == ("GATHERING_DATES", "Vienna")

    branch = _fork(alice_client, source, 3).json()
    copy = ChatSession.objects.get(pk=branch["id"])
    assert copy.data == {"origin": "Madrid"} and copy.state == "GATHERING_DESTINATION"
    turns = list(Turn.objects.filter(session=copy).order_by("seq"))
    assert [(t.seq, t.user_message) for t in turns] == [(1, "I need a flight"), (2, "From Madrid")]
    originals = list(Turn.objects.filter(session=original, seq__lt=3).order_by("seq"))
    assert [t.assistant_message for t in turns] == [t.assistant_message for t in originals]
    assert [t.created_at for t in turns] == [t.created_at for t in originals]
    # Copies are history: their memories are the originals', never extracted again.
    assert all(t.memories_written_at is not None and t.status == Turn.Status.COMPLETED for t in turns)
    # Its checkpoint log: the copies of those before turn 3 (pointing at the copied turns), then the fork.
    log = list(Checkpoint.objects.filter(session=copy).order_by("seq"))
    assert log[-1].reason == Checkpoint.Reason.FORK and log[-1].state == "GATHERING_DESTINATION"
    assert {c.turn_id for c in log[:-1] if c.turn_id} <= {t.pk for t in turns}
    assert copy.forked_from is not None and copy.forked_from.session_id == original.pk

    # The branch goes another way; the original keeps Vienna.
    _say(alice_client, branch["id"], "to Lisbon")
    copy.refresh_from_db()
    original.refresh_from_db()
    assert (copy.data["destination"], original.data["destination"]) == ("Lisbon", "Vienna")


@pytest.mark.django_db
def test_fork_inside_a_booking_keeps_the_slots_and_never_books_again(
    alice_client: APIClient, booking_agent: Agent, staff: Any
) -> None:
    source = _new_session(alice_client)
    _say(alice_client, source, *BOOKING_TALK, "yes, book it", "thanks!")
    original = ChatSession.objects.get(pk=source)
    assert original.state == "COMPLETED"
    booked = Booking.objects.get(session=original)

    # Half-way: the branch made at the passengers turn has the route and the date, not the passengers.
    mid = ChatSession.objects.get(pk=_fork(alice_client, source, 5).json()["id"])
    assert mid.data == {"origin": "Madrid", "destination": "Vienna", "depart_date": DEPART.isoformat()}
    # At the confirmation: every slot, no reference, and nothing was booked by the fork.
    confirming = ChatSession.objects.get(pk=_fork(alice_client, source, 6).json()["id"])
    assert confirming.state == "CONFIRMING" and confirming.data["passengers"] == 2
    assert "booking_reference" not in confirming.data or not confirming.data["booking_reference"]
    # After the booking: the branch carries its reference; the tool was not called again.
    after = ChatSession.objects.get(pk=_fork(alice_client, source, 7).json()["id"])
    assert (after.state, after.data["booking_reference"]) == ("COMPLETED", booked.reference)
    assert list(Booking.objects.values_list("pk", flat=True)) == [booked.pk]

    # Booking again on a branch made before the booking takes a new decision there: a second booking, of that
    # branch, which the desk lists beside the first.
    _say(alice_client, str(confirming.pk), "yes, book it")
    confirming.refresh_from_db()
    assert confirming.state == "COMPLETED"
    assert Booking.objects.count() == 2 and Booking.objects.filter(session=confirming).count() == 1
    assert Booking.objects.get(session=original).pk == booked.pk

    # The desk (the admin) shows both bookings, each with its branch, and each session where it stands.
    desk = Client()
    desk.force_login(staff)
    bookings = desk.get("/admin/booking_example/booking/").content.decode()
    second = Booking.objects.get(session=confirming)
    assert booked.reference in bookings and second.reference in bookings
    assert "the chat&#x27;s first branch" in bookings or "the chat's first branch" in bookings
    assert "branched at turn #6" in bookings
    page = desk.get(f"/admin/chat_sessions/chatsession/{confirming.pk}/change/").content.decode()
    assert "branch 3 of 4 of its chat" in page and "at turn #6" in page


@pytest.mark.django_db
def test_another_users_session_or_branch_cannot_be_forked_or_listed(
    alice_client: APIClient, bob_client: APIClient, booking_agent: Agent
) -> None:
    source = _new_session(alice_client)
    _say(alice_client, source, "I need a flight")
    branch = _fork(alice_client, source, 1).json()["id"]
    sessions_before = ChatSession.objects.count()
    for session_id in (source, branch):
        assert_error(_fork(bob_client, session_id, 1), 404, "not_found")
        assert_error(bob_client.get(f"/api/sessions/{session_id}/branches/"), 404, "not_found")
        assert_error(bob_client.get(f"/api/sessions/{session_id}/"), 404, "not_found")
    assert ChatSession.objects.count() == sessions_before
    # Bob's own list does not show Alice's branches.
    assert bob_client.get("/api/sessions/").json()["count"] == 0


@pytest.mark.django_db
def test_a_fork_under_a_running_turn_is_refused_and_changes_nothing(
    alice_client: APIClient, booking_agent: Agent
) -> None:
    source = _new_session(alice_client)
    _say(alice_client, source, *BOOKING_TALK[:2])
    before = _snapshot(source)
    lock = SessionTurnLock(source)
    assert lock.try_acquire()  # a turn's runner holds the session
    try:
        error = assert_error(_fork(alice_client, source, 2), 409, "session_busy")
        assert "still being answered" in error["message"]
    finally:
        lock.release()
    assert ChatSession.objects.filter(user__username="alice").count() == 1
    assert _snapshot(source) == before

    # A turn left unfinished (its runner died; the sweep will finish it) refuses a fork too.
    Turn.objects.filter(session_id=source, seq=2).update(status=Turn.Status.RUNNING)
    assert_error(_fork(alice_client, source, 1), 409, "session_busy")
    Turn.objects.filter(session_id=source, seq=2).update(status=Turn.Status.COMPLETED)

    # Once free, a fork goes through, and the session takes messages again (the fork let its lease go).
    assert _fork(alice_client, source, 2).status_code == 201
    assert _post(alice_client, source, "to Vienna").status_code == 201


@pytest.mark.django_db
def test_a_fork_at_a_turn_the_session_does_not_have_is_refused(alice_client: APIClient, booking_agent: Agent) -> None:
    source = _new_session(alice_client)
    _say(alice_client, source, "I need a flight")
    assert_error(_fork(alice_client, source, 2), 404, "no_such_turn")
    assert_error(_fork(alice_client, source, 0), 400)
    assert ChatSession.objects.count() == 1


@pytest.mark.django_db
def test_an_idempotency_key_replays_on_a_branch_that_shares_the_turn(
    alice_client: APIClient, chat_agent: Agent
) -> None:
    source = _new_session(alice_client, "chatty")
    first = _post(alice_client, source, "Hello", key="key-1")
    _say(alice_client, source, "How are you?")
    branch = _fork(alice_client, source, 2).json()["id"]
    again = _post(alice_client, branch, "Hello", key="key-1")
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert again.json()["reply"] == first.json()["reply"]
    assert Turn.objects.filter(session_id=branch).count() == 1


@pytest.mark.django_db
def test_a_turn_cut_off_on_a_branch_is_resumed_on_that_branch_once(
    alice_client: APIClient, booking_agent: Agent
) -> None:
    from orchestrator.runtime import turn_begin

    source = _new_session(alice_client)
    _say(alice_client, source, *BOOKING_TALK[:3])
    branch_id = _fork(alice_client, source, 3).json()["id"]
    branch = ChatSession.objects.get(pk=branch_id)
    # The branch's message saved with its checkpoint, then its process dies before any reply.
    crashed = turn_begin(session=branch, message="to Lisbon")
    assert crashed.turn is not None and crashed.lock is not None and crashed.turn.seq == 3
    crashed.lock.release()

    # The next message finishes the cut-off turn first, from the branch's own checkpoint, then its own.
    body = _post(alice_client, branch_id, BOOKING_TALK[3])
    assert body.status_code == 201 and body.json()["turn"]["seq"] == 4
    orphan = Turn.objects.get(pk=crashed.turn.pk)
    assert orphan.status == Turn.Status.COMPLETED and orphan.assistant_message
    branch.refresh_from_db()
    assert branch.data["destination"] == "Lisbon" and branch.data["depart_date"] == DEPART.isoformat()
    assert list(Turn.objects.filter(session=branch).order_by("seq").values_list("seq", flat=True)) == [1, 2, 3, 4]
    # The original never saw any of it.
    original = ChatSession.objects.get(pk=source)
    assert original.data["destination"] == "Vienna" and "depart_date" not in original.data
    assert Turn.objects.filter(session=original).count() == 3
