"""A person's part in a session: handing it to a person (the agent stops answering it) and back, and the
replies staff write to the user while they have it."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone

from core import events as run_channel
from orchestrator.begin import MessageRejected, validate_message
from orchestrator.recovery import turn_recover
from sessions.models import ChatSession, Turn, staff_signed
from sessions.services import session_hand_back, session_hand_off, turn_reopen_kept, turn_staff_reply_append


def staff_display_name(user: Any) -> str:
    """How a staff member signs a reply to a user: their full name, else ``STAFF_REPLY_NAME`` ("Support")."""
    full = getattr(user, "get_full_name", lambda: "")() or ""
    return " ".join(full.split())[:80] or str(getattr(settings, "STAFF_REPLY_NAME", "Support"))


def handoff_reply(*, session: ChatSession, text: str, author: Any) -> Turn:
    """A person answers a session that was handed to a human; the reply is added to the latest turn (its text,
    and its list of staff replies, which the chat shows apart and live)."""
    text = validate_message(text)
    turn = session.turns.order_by("-seq").first()
    if turn is None:
        raise MessageRejected("no_turn", "This session has no message to answer yet.")
    # The user sees a name to address, not a login: the staff member's full name, else STAFF_REPLY_NAME. The
    # username stays in the reply for staff pages (the live chat) and is never sent to the user.
    reply = {
        "author": staff_display_name(author),
        "staff": author.get_username(),
        "text": text,
        "at": timezone.now().isoformat(),
    }
    turn_staff_reply_append(session=session, turn=turn, reply=reply, signed=staff_signed(reply))
    run_channel.session_changed(session.pk)
    turn.refresh_from_db(fields=["assistant_message", "staff_replies"])
    return turn


def handoff_request(*, session: ChatSession, actor: Any = None, reason: str = "") -> bool:
    """Staff hand a session to a person: the agent stops answering it until it is handed back. False when it
    was with a person already."""
    detail = f"handed to a person by {actor or 'staff'}" + (f": {reason}" if reason else "")
    changed = session_hand_off(session=session, detail=detail)
    if changed:
        run_channel.session_changed(session.pk)
    return changed


def handoff_resume(*, session: ChatSession, actor: Any = None) -> ChatSession:
    """Give a handed-off session back to the agent. A question the user asked while a person had the chat and
    nobody answered (its latest turn, kept with no reply) is answered now by the agent: on a turn worker, or
    here where turns run in their request (``orchestrator.recovery.turn_recover``)."""
    session_hand_back(session=session, actor=actor)
    run_channel.session_changed(session.pk)
    latest = session.turns.order_by("-seq").first()
    if latest is not None and turn_reopen_kept(turn_id=latest.pk):
        turn_recover(turn_id=latest.pk)
        session.refresh_from_db()
    return session
