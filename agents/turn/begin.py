"""Accepting a message: validate it, take the session's turn lock, honour ``Idempotency-Key``, and save it
as a ``Turn`` with a checkpoint, committed before any model call (a crash never loses the message)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models.sql import InsertQuery
from django.utils import timezone

from agents.turn.context import AGENT_SWITCHED_OFF, FINISHED, UNFINISHED
from config.db import instances_from_rows, refresh_from, select_columns
from config.errors import Refusal
from config.incoming import Unstorable
from config.incoming import idempotency_key as valid_idempotency_key
from sessions.locks import SessionBusyError, SessionTurnLock
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import checkpoint_before_call, checkpoint_insert_sql, checkpoint_number_taken


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
    try:
        key = valid_idempotency_key(idempotency_key)
    except Unstorable as exc:
        # Refused, not cut: two keys that share their first 200 characters would name one turn.
        raise MessageRejected("invalid_idempotency_key", str(exc)) from None
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
        try:
            last, orphans = _reload_with_last_seq(session)
        except ChatSession.DoesNotExist:
            # Deleted after the door read it and before the lock (the delete holds the lock to its commit).
            raise MessageRejected(
                "not_found", "This session was deleted; the message was not saved.", status=404
            ) from None
        if session.status == ChatSession.Status.CLOSED:
            raise SessionClosedError("This session is closed.")
        if not session.agent.is_active:
            # Switched off by an operator (a misbehaving agent, a retired one): its chats stay readable and
            # take no new message.
            raise MessageRejected("agent_unavailable", AGENT_SWITCHED_OFF + " It takes no new messages.", status=503)
        if key:
            same = Turn.objects.filter(session=session, idempotency_key=key).first()
            if same is not None:
                _same_message_or_refuse(same, text)
            if same is not None and same.status in FINISHED:
                lock.release()
                return TurnHandle(session=session, turn=None, lock=None, replay=same)
            if same is not None:
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
        title = "" if session.title else text.strip().splitlines()[0][:80]
        if not _save_with_checkpoint(turn, title=title):
            # Another writer took the checkpoint's number meanwhile (a staff action), and nothing was written:
            # again, in a transaction, the number read after the session's row lock.
            with transaction.atomic():
                turn.save(force_insert=True)
                checkpoint_before_call(session=session, turn=turn)
                if title:
                    ChatSession.objects.filter(pk=session.pk, title="").update(title=title)
        if title:
            session.title = title
        return TurnHandle(session=session, turn=turn, lock=lock, orphans=orphans, checkpoint_fresh=True)
    except IntegrityError as exc:
        lock.release()
        raise SessionBusyError("A message with this Idempotency-Key is already being answered.") from exc
    except BaseException:
        lock.release()
        raise


# After the turn's INSERT (``t``): the session row locked and read (``s``), its first title, the checkpoint.
_CHECKPOINT_AND_TITLE = (
    ", s AS (SELECT id, state, data, retry_count FROM chat_sessions_chatsession WHERE id = %s FOR UPDATE)"
    ", titled AS (UPDATE chat_sessions_chatsession SET title = %s WHERE id = %s AND title = '' AND %s <> ''"
    " RETURNING id)"
    f", c AS ({checkpoint_insert_sql('s', turn='t.id', tables='s, t')} RETURNING seq)"
    " SELECT t.id FROM t"
)


def _save_with_checkpoint(turn: Turn, *, title: str) -> bool:
    """Insert the turn, its before-call checkpoint and the session's first title in one statement (one round
    trip where a transaction took six). False, and nothing written, when the checkpoint could not take its number
    (another writer took it while this statement waited for the session's row lock)."""
    query = InsertQuery(Turn)
    query.insert_values([f for f in Turn._meta.local_concrete_fields if not f.primary_key], [turn])
    compiler: Any = query.get_compiler(using="default")
    compiler.returning_fields = [Turn._meta.pk]
    [(insert, insert_params)] = compiler.as_sql()
    sql = "WITH t AS (" + insert + ")" + _CHECKPOINT_AND_TITLE
    params = [
        *insert_params,
        turn.session_id,
        title,
        turn.session_id,
        title,
        "",
        Checkpoint.Reason.BEFORE_CALL.value,
        f"before a model call, turn #{turn.seq}",
        timezone.now(),
    ]
    # A statement alone is atomic; inside a caller's transaction (a test's), a savepoint keeps a refusal from
    # spoiling it.
    guard = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    try:
        with guard, connection.cursor() as cursor:
            cursor.execute(sql, params)
            (turn_id,) = cursor.fetchone()
    except IntegrityError as exc:
        if checkpoint_number_taken(exc):
            return False
        raise  # the Idempotency-Key's turn, saved by a request racing this one: the caller says so
    turn.pk = turn_id
    turn._state.adding = False
    turn._state.db = "default"
    return True


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


_AGENT_MODEL: Any = ChatSession._meta.get_field("agent").related_model
_USER_MODEL: Any = ChatSession._meta.get_field("user").related_model
_WIDTHS = (len(ChatSession._meta.concrete_fields), len(_AGENT_MODEL._meta.concrete_fields))
_UNFINISHED = [str(status) for status in UNFINISHED]
# The session with its agent and user, its last turn number and whether a turn of it is unfinished: what
# ``ChatSession.objects.select_related("agent", "user").annotate(...)`` reads, written once here because
# building and compiling that queryset cost more than running it, on every turn.
_RELOAD_SQL = f"""
    SELECT {select_columns(ChatSession, "s")}, {select_columns(_AGENT_MODEL, "a")}, {select_columns(_USER_MODEL, "u")},
           (SELECT t.seq FROM {Turn._meta.db_table} t WHERE t.session_id = s.id ORDER BY t.seq DESC LIMIT 1),
           EXISTS (SELECT 1 FROM {Turn._meta.db_table} t WHERE t.session_id = s.id AND t.status = ANY(%(unfinished)s))
    FROM {ChatSession._meta.db_table} s
    JOIN {_AGENT_MODEL._meta.db_table} a ON a.id = s.agent_id
    JOIN {_USER_MODEL._meta.db_table} u ON u.id = s.user_id
    WHERE s.id = %(session)s
"""


def _reload_with_last_seq(session: ChatSession) -> tuple[int, list[Turn]]:
    """Read the session again (with its agent and user), its last turn number and its orphaned turns, in
    one query (orphans are rare)."""
    with connection.cursor() as cursor:
        cursor.execute(_RELOAD_SQL, {"session": session.pk, "unfinished": _UNFINISHED})
        row = cursor.fetchone()
    if row is None:
        raise ChatSession.DoesNotExist("the session was deleted")
    n_session, n_agent = _WIDTHS
    (fresh,) = instances_from_rows(ChatSession, [row[:n_session]])
    (agent,) = instances_from_rows(_AGENT_MODEL, [row[n_session : n_session + n_agent]])
    (user,) = instances_from_rows(_USER_MODEL, [row[n_session + n_agent : -2]])
    ChatSession._meta.get_field("agent").set_cached_value(fresh, agent)
    ChatSession._meta.get_field("user").set_cached_value(fresh, user)
    refresh_from(session, fresh)
    last_seq, unfinished = row[-2], row[-1]
    return int(last_seq or 0), (orphaned_turns(session) if unfinished else [])


def orphaned_turns(session: ChatSession) -> list[Turn]:
    # We hold the session lock, so a turn still marked running/pending has no live owner.
    return list(session.turns.filter(status__in=UNFINISHED).order_by("seq"))
