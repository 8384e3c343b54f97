"""A session with a person: handed off (by its turn or by staff), the staff's replies, handed back to the agent."""

from __future__ import annotations

import json
from typing import Any

from django.db.models import Case, F, Func, JSONField, TextField, Value, When
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services.checkpoints import checkpoint_record


def turn_staff_reply_append(*, session: ChatSession, turn: Turn, reply: dict[str, Any], signed: str) -> None:
    """A person's reply added to ``turn``: ``signed`` appended to its text and ``reply`` to its staff replies,
    in one statement, so two staff replying at once both land (a read-modify-write kept only the last one);
    the session's ``updated_at`` moves on."""
    Turn.objects.filter(pk=turn.pk).update(
        assistant_message=Case(
            When(assistant_message="", then=Value(signed)),
            default=Concat(F("assistant_message"), Value("\n\n" + signed)),
            output_field=TextField(),
        ),
        staff_replies=Func(
            F("staff_replies"),
            Cast(Value(json.dumps([reply])), JSONField()),
            template="%(expressions)s",
            arg_joiner=" || ",
        ),
    )
    ChatSession.objects.filter(pk=session.pk).update(updated_at=timezone.now())


def session_hand_off(*, session: ChatSession, detail: str, turn: Turn | None = None) -> bool:
    """Hand the session to a person (``NEEDS_HUMAN``: the agent stops answering it) and checkpoint it, with the
    turn that did it if one did; the instance is read again. False, and nothing written, when it was with a
    person already. The one place a session is handed off: by its turn (the workflow, the routing, the model,
    the step limit) or by staff. A ``turn`` that did it records the state it left the session in."""
    changed = (
        ChatSession.objects.filter(pk=session.pk)
        .exclude(status=ChatSession.Status.NEEDS_HUMAN)
        .update(status=ChatSession.Status.NEEDS_HUMAN, version=F("version") + 1, updated_at=timezone.now())
    )
    session.refresh_from_db(from_queryset=ChatSession.objects.select_related("agent", "user"))
    if changed:
        checkpoint_record(session=session, reason=Checkpoint.Reason.HANDOFF, turn=turn, detail=detail[:500])
    if turn is not None:
        Turn.objects.filter(pk=turn.pk).update(state_after=session.state)
        turn.state_after = session.state
    return bool(changed)


def session_hand_back(*, session: ChatSession, actor: Any = None) -> ChatSession:
    """Give a handed-off session back to the agent (its failure count reset), and checkpoint it."""
    ChatSession.objects.filter(pk=session.pk).update(
        status=ChatSession.Status.ACTIVE, retry_count=0, version=F("version") + 1, updated_at=timezone.now()
    )
    session.refresh_from_db(from_queryset=ChatSession.objects.select_related("agent", "user"))
    checkpoint_record(session=session, reason=Checkpoint.Reason.RESUME, detail=f"handoff resumed by {actor or 'staff'}")
    return session
