"""Conversations whose client keeps the history (the OpenAI-compatible door: the SDKs, chat UIs): which session
a request continues, so that a conversation is one session and nothing in it is stored twice.

A client names its session (``session_id``), or only resends the history, as chat UIs do. Then it lands in the
session of this person and agent whose answered turns are that history; a retried request (the history and its
message are already the session's last turn) is that turn, answered once; a history found nowhere starts a new
session holding it (``sessions.services.session_create_with_history``). A named session whose turns contradict
the history sent is refused (``HistoryMismatch``), never merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agents.models import Agent
from core.errors import Refusal
from sessions.models import ChatSession, Turn
from sessions.selectors import own_session
from sessions.services import session_create, session_create_with_history, session_delete

# What a client is answered for a message kept for the person who has its session (the agent does not answer it).
KEPT_FOR_PERSON = "Your message is with a person on our team; they will reply here."
# How many sessions that begin like a resent history are compared with it, the latest first.
CANDIDATES = 20


@dataclass(frozen=True)
class Exchange:
    """One message of the person and the reply they were given, as the client holds them."""

    user: str
    assistant: str


@dataclass
class Continuation:
    """The session a request continues; ``replay``: its message was answered (or is being answered) already."""

    session: ChatSession
    replay: Turn | None = None
    created: bool = False


class SessionNotFound(Refusal):
    code = "session_not_found"
    status = 404
    default_message = "No such session."


class SessionOfAnotherAgent(Refusal):
    code = "session_agent_mismatch"
    status = 400
    default_message = "This session talks with another agent."


class HistoryMismatch(Refusal):
    code = "history_mismatch"
    status = 409
    default_message = (
        "The messages sent do not match this session's conversation. Send only the new message to continue it, "
        "or leave out the session id to start a new conversation. Nothing was saved."
    )


def reply_shown(reply: str, *, with_person: bool) -> str:
    """What a client is given as the reply of a turn: its text, or a note when a person has the session and the
    agent kept the message for them unanswered."""
    return reply if reply or not with_person else KEPT_FOR_PERSON


def conversation_continue(
    *, user: Any, agent: Agent, history: Sequence[Exchange], message: str, session_id: str | None = None
) -> Continuation:
    """The session that ``message`` (after ``history``) continues for ``user`` with ``agent``; a new one when the
    history is empty, or found nowhere and no session is named. Raises ``SessionNotFound`` (someone else's id
    too), ``SessionOfAnotherAgent`` and ``HistoryMismatch`` for a named session."""
    if session_id is not None:
        session = own_session(user, session_id)
        if session is None:
            raise SessionNotFound("No session with this id.")
        if session.agent_id != agent.pk:
            raise SessionOfAnotherAgent(
                f"This session talks with the agent {session.agent.slug!r}, not {agent.slug!r}."
            )
        if not history:
            return Continuation(session=session)
        found = _continues(session, history, message)
        if found is None:
            raise HistoryMismatch()
        return found
    if not history:
        return Continuation(session=session_create(user=user, agent=agent), created=True)
    for session in _sessions_beginning_with(user, agent, history[0].user):
        found = _continues(session, history, message)
        if found is not None:
            return found
    exchanges = [(exchange.user, exchange.assistant) for exchange in history]
    return Continuation(session=session_create_with_history(user=user, agent=agent, exchanges=exchanges), created=True)


def conversation_abandon(continuation: Continuation) -> None:
    """The message was refused before it was saved (a full turns queue, say): a session this request made for it
    goes again, so that the client's retry does not leave an empty one behind (it makes its own)."""
    if continuation.created:
        session_delete(session=continuation.session)


def _sessions_beginning_with(user: Any, agent: Agent, first: str) -> list[ChatSession]:
    """The person's open sessions with ``agent`` that hold a turn saying ``first``, the latest first."""
    return list(
        ChatSession.objects.filter(user=user, agent=agent, turns__user_message=first)
        .exclude(status=ChatSession.Status.CLOSED)
        .select_related("agent", "user")
        .distinct()
        .order_by("-updated_at")[:CANDIDATES]
    )


def _continues(session: ChatSession, history: Sequence[Exchange], message: str) -> Continuation | None:
    """``session`` as the one ``history`` continues: its turns are the history (a new turn follows), or the history
    and then ``message`` (a retry: that turn); None otherwise. Failed turns are left out (their clients got an error,
    not a reply, and send the message again)."""
    turns = list(Turn.objects.filter(session=session).exclude(status=Turn.Status.FAILED).order_by("seq"))
    if len(turns) not in (len(history), len(history) + 1):
        return None
    if not all(_same(exchange, turn) for exchange, turn in zip(history, turns, strict=False)):
        return None
    if len(turns) == len(history):
        return Continuation(session=session)
    last = turns[-1]
    return Continuation(session=session, replay=last) if last.user_message == message else None


def _same(exchange: Exchange, turn: Turn) -> bool:
    if exchange.user != turn.user_message:
        return False
    said = exchange.assistant.strip()
    # What the client was given: the reply, the agent's part of it (staff replies came later), or the note.
    given = {turn.assistant_message.strip(), turn.agent_message.strip()}
    if said in given or (not turn.agent_message.strip() and said == KEPT_FOR_PERSON):
        return True
    # A reply that took another shape than its streamed deltas was sent whole after them (``web.openai_api``).
    return bool(turn.assistant_message.strip()) and said.endswith("\n\n" + turn.assistant_message.strip())
