"""A whole flight booking through the API on the demo model, with a crash in the middle."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.models import Agent
from examples.booking.models import Booking
from orchestrator.runtime import turn_begin
from sessions.models import ChatSession, Checkpoint, Turn


def _post(client: APIClient, session_id: str, message: str) -> dict[str, Any]:
    response = client.post(f"/api/sessions/{session_id}/messages/", {"message": message}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


@pytest.mark.django_db
def test_booking_from_idle_to_completed_resumed_after_a_crash(alice_client: APIClient, booking_agent: Agent) -> None:
    session_id = alice_client.post("/api/sessions/", {"agent": "flight-booker"}, format="json").json()["id"]
    depart = date.today() + timedelta(days=90)
    for message in ["I need a flight", "From Madrid", "to Vienna"]:
        _post(alice_client, session_id, message)

    # A crash mid-turn: the message and its checkpoint are saved, the process dies before any reply
    # (its lock goes with its connection), nothing else happens.
    session = ChatSession.objects.get(pk=session_id)
    crashed = turn_begin(session=session, message=f"On {depart.strftime('%B %d %Y')}, one way")
    assert crashed.turn is not None and crashed.lock is not None
    crashed.lock.release()
    assert Turn.objects.get(pk=crashed.turn.pk).status == Turn.Status.RUNNING

    # The next request finishes the orphaned turn first (its dates are not lost), then answers its own.
    body = _post(alice_client, session_id, "2 passengers")
    orphan = Turn.objects.get(pk=crashed.turn.pk)
    assert orphan.status == Turn.Status.COMPLETED and orphan.assistant_message
    session.refresh_from_db()
    assert session.data["depart_date"] == depart.isoformat()
    assert session.state == "CONFIRMING"
    assert body["turn"]["state_after"] == "CONFIRMING"

    _post(alice_client, session_id, "yes, book it")
    session.refresh_from_db()
    assert (session.state, session.status) == ("COMPLETED", ChatSession.Status.COMPLETED)
    booking = Booking.objects.get(session=session)
    assert (booking.origin, booking.destination, booking.passengers, booking.depart_date) == (
        "Madrid",
        "Vienna",
        2,
        depart,
    )
    # One reply per turn, in order, and a checkpoint before each turn's first model call.
    turns = list(Turn.objects.filter(session=session).order_by("seq"))
    assert [t.seq for t in turns] == list(range(1, 7))
    assert all(t.status == Turn.Status.COMPLETED and t.assistant_message for t in turns)
    for turn in turns:
        assert Checkpoint.objects.filter(turn=turn, reason=Checkpoint.Reason.BEFORE_CALL).exists()
