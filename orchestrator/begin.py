"""Accepting a message: validate it, take the session's turn lock, honour ``Idempotency-Key``, and save it
as a ``Turn`` with a checkpoint, committed before any model call (a crash never loses the message)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from agents.workflows import workflow_available
from core.errors import Refusal
from core.incoming import Unstorable
from core.incoming import idempotency_key as valid_idempotency_key
from core.text import title_from
from orchestrator.context import AGENT_SWITCHED_OFF, AGENT_WORKFLOW_GONE, FINISHED
from sessions.locks import SessionBusyError, SessionTurnLock, session_is_locked
from sessions.models import ChatSession, Turn
from sessions.selectors import session_for_turn, unfinished_turns
from sessions.services import turn_insert

logger = logging.getLogger(__name__)


class MessageRejected(Refusal):
    """The message cannot be accepted as it is. ``status`` is the HTTP status the doors answer with."""

    def __init__(self, code: str, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class SessionClosedError(Refusal):
    code = "session_closed"
    status = 409
    default_message = "This session is closed."


@dataclass
class TurnHandle:
    """A turn that has been accepted: its message is saved and the session lock is held.

    ``checkpoint_fresh``: the turn was saved by this request with its before-call checkpoint, which still
    stands for its first model call (nothing changes the state before it: retrieval only reads)."""

    session: ChatSession
    turn: Turn | None
    lock: SessionTurnLock | None
    replay: Turn | None = None
    orphans: list[Turn] = field(default_factory=list)
    resumed: bool = False  # the turn was saved by an earlier request that died mid-turn
    checkpoint_fresh: bool = False


def validate_message(message: object) -> str:
    """Reject what cannot be a chat message; return the text to store (unchanged otherwise)."""
    if not isinstance(message, str):
        raise MessageRejected("invalid_message", "The message must be a string.")
    if "\x00" in message:
        raise MessageRejected("nul_bytes", "The message contains NUL (\\x00) characters, which cannot be stored.")
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (JSON "\ud800" without its pair): not text, and PostgreSQL cannot store it.
        raise MessageRejected(
            "invalid_characters", "The message contains characters that are not valid Unicode text."
        ) from None
    if not message.strip():
        raise MessageRejected("empty_message", "The message is empty.")
    limit = int(getattr(settings, "MAX_MESSAGE_CHARS", 32000))
    if len(message) > limit:
        raise MessageRejected(
            "message_too_long",
            f"The message has {len(message):,} characters; the limit is {limit:,}. Nothing was saved.",
            status=413,
        )
    return message


def turn_begin(
    *,
    session: ChatSession,
    message: str,
    idempotency_key: str | None = None,
    wait_seconds: float | None = None,
) -> TurnHandle:
    """Accept a message: validate, lock, save it with a checkpoint. Raises MessageRejected / SessionBusyError."""
    text = validate_message(message)
    key = _idempotency_key(idempotency_key)
    if key:
        # A key names one turn, whatever it came to: a finished one (answered or failed) is replayed. To try
        # a failed message again, send it with a new key. (Running it again under its old key answered the
        # model's calls and then threw the reply away: the turn was finished already.)
        done = Turn.objects.filter(session=session, idempotency_key=key, status__in=FINISHED).first()
        if done is not None:
            _same_message_or_refuse(done, text)
            return TurnHandle(session=session, turn=None, lock=None, replay=done)
    lock = SessionTurnLock(session.pk)
    wait = float(getattr(settings, "TURN_LOCK_WAIT_SECONDS", 30.0) if wait_seconds is None else wait_seconds)
    if not lock.acquire(wait_seconds=wait):
        raise SessionBusyError(
            "Another message on this session is still being answered; try again when it has finished."
        )
    try:
        return _begin_locked(session, text, key, lock)
    except IntegrityError as exc:
        lock.release()
        raise SessionBusyError("A message with this Idempotency-Key is already being answered.") from exc
    except BaseException:
        lock.release()
        raise


def turn_in_flight(*, session: ChatSession, message: str, idempotency_key: str | None) -> Turn | None:
    """The turn a retried message (the same ``Idempotency-Key``) already started, while a runner still holds it:
    the retry follows that turn rather than waiting for the session and being told it is busy. None when there is
    no key, no such turn, or nobody runs it (then ``turn_begin`` resumes it)."""
    key = _idempotency_key(idempotency_key)
    if not key:
        return None
    turn = Turn.objects.filter(session=session, idempotency_key=key).exclude(status__in=FINISHED).first()
    if turn is None or not session_is_locked(session.pk):
        return None
    _same_message_or_refuse(turn, validate_message(message))
    return turn


def _idempotency_key(key: str | None) -> str | None:
    try:
        return valid_idempotency_key(key)
    except Unstorable as exc:
        # Refused, not cut: two keys that share their first 200 characters would name one turn.
        raise MessageRejected("invalid_idempotency_key", str(exc)) from None


def session_unavailable(session: ChatSession) -> str | None:
    """Why ``session`` takes no new message, in words for its person (None: it takes them). Its agent switched
    off by an operator (a misbehaving agent, a retired one), or its workflow not available on this server (a
    plug-in whose setting is gone): its chats stay readable, and restoring the agent or the setting restores them."""
    if not session.agent.is_active:
        return AGENT_SWITCHED_OFF + " It takes no new messages."
    if not workflow_available(session.workflow, session.workflow_version):
        return AGENT_WORKFLOW_GONE.format(name=session.workflow)
    return None


def _begin_locked(session: ChatSession, text: str, key: str | None, lock: SessionTurnLock) -> TurnHandle:
    """``turn_begin`` once the session's lease is held: the session read again and checked, then the turn this
    message is (a replay or a resumed one under its key, else a new one saved with its checkpoint)."""
    try:
        last, orphans = _reload_with_last_seq(session)
    except ChatSession.DoesNotExist:
        # Deleted after the door read it and before the lock (the delete holds the lock to its commit).
        raise MessageRejected("not_found", "This session was deleted; the message was not saved.", status=404) from None
    if session.status == ChatSession.Status.CLOSED:
        raise SessionClosedError("This session is closed.")
    unavailable = session_unavailable(session)
    if unavailable is not None:
        logger.warning("session %s: message refused: %s", session.pk, unavailable)
        raise MessageRejected("agent_unavailable", unavailable + " Nothing was saved.", status=503)
    same = Turn.objects.filter(session=session, idempotency_key=key).first() if key else None
    if same is not None:
        _same_message_or_refuse(same, text)
        if same.status in FINISHED:
            lock.release()
            return TurnHandle(session=session, turn=None, lock=None, replay=same)
        # The first request with this key crashed mid-turn: finish that turn instead of starting another.
        others = [t for t in orphans if t.pk != same.pk]
        return TurnHandle(session=session, turn=same, lock=lock, orphans=others, resumed=True)
    turn = Turn(
        session=session,
        seq=last + 1,
        user_message=text,
        idempotency_key=key,
        status=Turn.Status.RUNNING,
        started_at=timezone.now(),
        state_before=session.state,
    )
    title = "" if session.title else title_from(text)
    turn_insert(turn=turn, title=title)  # the turn, its before-call checkpoint and the first title
    if title:
        session.title = title
    return TurnHandle(session=session, turn=turn, lock=lock, orphans=orphans, checkpoint_fresh=True)


def _same_message_or_refuse(turn: Turn, text: str) -> None:
    """An Idempotency-Key names one message: a retry must resend it. Another message under a used key would
    otherwise be answered with the first one's reply (or run as the first one) and never be saved."""
    if turn.user_message != text:
        raise MessageRejected(
            "idempotency_key_reused",
            f"This Idempotency-Key was used for another message on this session (turn {turn.seq}); "
            "send a new key with a new message. Nothing was saved.",
            status=422,
        )


def _reload_with_last_seq(session: ChatSession) -> tuple[int, list[Turn]]:
    """Read the session again (with its agent and user), its last turn number and its orphaned turns, in one
    query (orphans are rare: a second query only when there are some)."""
    last_seq, unfinished = session_for_turn(session=session)
    return last_seq, (unfinished_turns(session=session) if unfinished else [])
