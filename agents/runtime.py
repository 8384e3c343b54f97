"""The turn loop: one user message in, one reply out, with nothing lost on the way.

The order, and why (the contracts are in docs/internals.md, "The turn"):

1. ``turn_begin``: validate the message, take the session's turn lock, honour ``Idempotency-Key``,
   save the message as a ``Turn`` (status running) and a ``before_call`` checkpoint, and commit —
   before any model call, so a crash never loses the message.
2. Retrieve memories (tiered, budgeted).
3. For workflows: one structured decision (slots + next state), validated, checked against the
   workflow and checkpointed. Routing for tool-using agents is structured too.
4. Build the prompt from budgeted sections; the pre-flight check guarantees it fits.
5. Stream the reply; run the tools it asks for (they never raise); a hard step limit.
6. Save the reply and the context composition; enqueue memory writes and summarization after commit.

**One turn at a time per session.** The lock is a PostgreSQL session-level advisory lock keyed by
the session id, held by the connection that runs the turn — not a transaction, so no transaction
stays open while a model answers. A second request waits up to ``TURN_LOCK_WAIT_SECONDS`` and then
gets ``SessionBusyError`` (HTTP 409). If the process running a turn dies, its connection closes and
PostgreSQL releases the lock: a turn found ``running`` while its lock is free was orphaned by a crash,
and the next request (or the sweep beat runs every minute) resumes it from its checkpoint, exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import (
    Case,
    Exists,
    F,
    OuterRef,
    PositiveIntegerField,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Concat
from django.utils import timezone

from agents.llm.base import CallContext, LLMError, Message, StructuredOutputError, TruncatedOutputError
from agents.llm.providers import get_provider
from agents.llm.tokens import counter_for
from agents.routing import RouteOutcome, route_message
from agents.tools import TOOL_ERROR_POLICY, ToolContext, run_tool_call, tool_specs
from agents.workflows import get_workflow
from config.db import refresh_from, update_returning
from config.errors import Refusal
from config.queue import enqueue
from config.services import requeue_each
from memory.selectors import RecentWindow, memories_for_prompt, retrieval_query
from memory.services import memory_writes_enqueue
from observability.logging import log_context
from observability.tracing import span
from sessions.context import (
    ContextBudget,
    ContextOverflowError,
    MemoryItem,
    PromptInputs,
    TurnText,
    build_prompt,
    turn_history,
)
from sessions.locks import SessionBusyError, SessionTurnLock, TurnLockLost
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import (
    checkpoint_before_call,
    checkpoint_record,
    stuck_turns_find,
    transition_apply,
    turn_failure_record,
)
from sessions.summaries import summary_request_if_due

if TYPE_CHECKING:
    from agents.models import Agent
    from sessions.context import TurnHistory, TurnText

logger = logging.getLogger(__name__)

HANDOFF_NOTICE = "I've passed this conversation to a person on our team; they will reply here."


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
class TurnResult:
    turn: Turn
    reply: str
    replayed: bool = False
    is_demo: bool = False
    recovered: list[Turn] = field(default_factory=list)


@dataclass
class TurnHandle:
    """A turn that has been accepted: its message is saved and the session lock is held."""

    session: ChatSession
    turn: Turn | None
    lock: SessionTurnLock | None
    replay: Turn | None = None
    orphans: list[Turn] = field(default_factory=list)
    resumed: bool = False  # the turn was saved by an earlier request that died mid-turn


# --------------------------------------------------------------------------------------------------
# Validation and locking
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------------


def turn_begin(
    *,
    session: ChatSession,
    message: str,
    idempotency_key: str | None = None,
    wait_seconds: float | None = None,
) -> TurnHandle:
    """Accept a message: validate, lock, save it with a checkpoint. Raises MessageRejected / SessionBusyError."""
    text = validate_message(message)
    key = (idempotency_key or "").strip()[:200] or None
    if key:
        # A key names one turn, whatever it came to: a finished one (answered or failed) is replayed. To try
        # a failed message again, send it with a new key. (Running it again under its old key answered the
        # model's calls and then threw the reply away: the turn was finished already.)
        done = Turn.objects.filter(session=session, idempotency_key=key, status__in=_FINISHED).first()
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
            if same is not None and same.status in _FINISHED:
                lock.release()
                return TurnHandle(session=session, turn=None, lock=None, replay=same)
            if same is not None:
                # The first request with this key crashed mid-turn: finish that turn instead of starting another.
                others = [t for t in orphans if t.pk != same.pk]
                return TurnHandle(session=session, turn=same, lock=lock, orphans=others, resumed=True)
        with transaction.atomic():
            turn = Turn.objects.create(
                session=session,
                seq=last + 1,
                user_message=text,
                idempotency_key=key,
                status=Turn.Status.RUNNING,
                started_at=timezone.now(),
                state_before=session.state,
            )
            checkpoint_before_call(session=session, turn=turn)
            # That checkpoint stands before the turn's first model call: nothing changes the state
            # in between (retrieval only reads), so the first call does not write another one.
            turn._checkpoint_fresh = True  # type: ignore[attr-defined]
            if not session.title:
                ChatSession.objects.filter(pk=session.pk).update(title=text.strip().splitlines()[0][:80])
        return TurnHandle(session=session, turn=turn, lock=lock, orphans=orphans)
    except IntegrityError as exc:
        lock.release()
        raise SessionBusyError("A message with this Idempotency-Key is already being answered.") from exc
    except BaseException:
        lock.release()
        raise


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


def turn_events(handle: TurnHandle) -> Generator[dict[str, Any], None, None]:
    """Run an accepted turn, yielding events; always releases the session lock at the end."""
    if handle.replay is not None:
        yield from _replay_events(handle.replay)
        return
    assert handle.turn is not None and handle.lock is not None
    try:
        for orphan in handle.orphans:
            recovered = _drain(_execute(handle.session, orphan, resumed=True))
            yield {"type": "recovered", "turn_id": orphan.pk, "seq": orphan.seq, "reply": recovered.get("reply", "")}
        # turn_begin read the session under the lock; orphans run before this turn change it.
        yield from _execute(handle.session, handle.turn, resumed=handle.resumed, fresh=not handle.orphans)
    finally:
        handle.lock.release()


class TurnStream:
    """A turn's events (``turn_events``) whose ``close()`` always lets the session's lock go.

    A plain generator closed before it started runs no ``finally``: a server that fails to send the
    first bytes (the client is gone) and closes the response would leave the lock held by this thread's
    connection, and the session busy until that connection closed. Closing this releases it whatever
    state the events are in; a turn cut short stays saved, for the next request or the sweep to finish.
    (The SSE response runs the remaining events before it closes this: ``sessions.streaming``.)
    """

    def __init__(self, handle: TurnHandle) -> None:
        self._handle = handle
        self._events = turn_events(handle)

    def __iter__(self) -> TurnStream:
        return self

    def __next__(self) -> dict[str, Any]:
        return next(self._events)

    def close(self) -> None:
        try:
            self._events.close()
        finally:
            if self._handle.lock is not None:
                self._handle.lock.release()  # a no-op when turn_events released it already


def turn_stream(
    *, session: ChatSession, message: str, idempotency_key: str | None = None, wait_seconds: float | None = None
) -> TurnStream:
    """``turn_begin`` then ``turn_events``: validation and busy errors raise before the first event."""
    handle = turn_begin(session=session, message=message, idempotency_key=idempotency_key, wait_seconds=wait_seconds)
    return TurnStream(handle)


def turn_run(
    *, session: ChatSession, message: str, idempotency_key: str | None = None, wait_seconds: float | None = None
) -> TurnResult:
    """Run one turn to the end and return its saved result."""
    handle = turn_begin(session=session, message=message, idempotency_key=idempotency_key, wait_seconds=wait_seconds)
    if handle.replay is not None:
        return TurnResult(
            turn=handle.replay, reply=handle.replay.assistant_message, replayed=True, is_demo=handle.replay.is_demo
        )
    recovered = [Turn.objects.get(pk=event["turn_id"]) for event in turn_events(handle) if event["type"] == "recovered"]
    turn = handle.turn
    assert turn is not None
    # The saved row is the outcome (completed or failed); the events only mirror it. Every ending of
    # the turn re-reads it; one that did not (the lock was lost to another process) is read here.
    if turn.status not in _FINISHED:
        turn = Turn.objects.get(pk=turn.pk)
    return TurnResult(turn=turn, reply=turn.assistant_message, is_demo=turn.is_demo, recovered=recovered)


def turn_recover(*, turn_id: int) -> bool:
    """Finish a turn whose process died mid-call. Returns False when it is running elsewhere or already done."""
    turn = Turn.objects.select_related("session").filter(pk=turn_id).first()
    if turn is None or turn.status not in (Turn.Status.RUNNING, Turn.Status.PENDING):
        return False
    lock = SessionTurnLock(turn.session_id)
    if not lock.try_acquire():
        return False  # alive: its owner still holds the lock
    try:
        turn.refresh_from_db()
        if turn.status not in (Turn.Status.RUNNING, Turn.Status.PENDING):
            return False
        _drain(_execute(turn.session, turn, resumed=True))
        return True
    finally:
        lock.release()


def stuck_turns_recover(*, older_than: timedelta | None = None) -> int:
    """Resume every orphaned turn older than ``older_than`` here, one after another. Returns how many.
    (The periodic sweep sends each to its own task instead: ``stuck_turns_enqueue``.)"""
    count = 0
    for turn in _stuck(older_than):
        try:
            if turn_recover(turn_id=turn.pk):
                count += 1
        except Exception:  # one broken session must not stop the sweep
            logger.exception("could not recover turn %s", turn.pk)
    return count


# A recovery task's own time limit is sized for one turn (``agents.tasks.recover_turn``); a sweep does not
# send the same turn again within this window, while its task may still be queued or running.
RECOVERY_RESEND_AFTER = timedelta(minutes=20)


def stuck_turns_enqueue(*, older_than: timedelta | None = None, limit: int = 200) -> int:
    """The periodic sweep: send each orphaned turn older than ``older_than`` to a recovery task of its own
    (at most ``limit``, not one sent within ``RECOVERY_RESEND_AFTER``). Returns how many were sent.

    One task for all of them had one time limit for all: after a crash with many turns to finish, it cut
    the turn it was answering short, and that turn failed; the ones after it waited for the next sweep."""
    turn_ids = list(_stuck(older_than).values_list("pk", flat=True)[: limit * 4])
    sent = requeue_each(
        "turn-recovery",
        ((turn_id, partial(enqueue, "agents.tasks.recover_turn", turn_id)) for turn_id in turn_ids),
        within=RECOVERY_RESEND_AFTER,
        limit=limit,
    )
    if sent:
        logger.info("sent %s stuck turn(s) to recovery", sent)
    return sent


def _stuck(older_than: timedelta | None) -> QuerySet[Turn]:
    age = older_than if older_than is not None else timedelta(seconds=int(getattr(settings, "STUCK_TURN_SECONDS", 120)))
    return stuck_turns_find(older_than=age)


def handoff_reply(*, session: ChatSession, text: str, author: Any) -> Turn:
    """A person answers a session that was handed to a human; the reply is added to the latest turn."""
    text = validate_message(text)
    turn = session.turns.order_by("-seq").first()
    if turn is None:
        raise MessageRejected("no_turn", "This session has no message to answer yet.")
    signed = f"[{author.get_username()} (staff)] {text}"
    # Appended in the database, in one statement: two staff replying at once both land (a read-modify-write
    # of the text kept only the last one).
    Turn.objects.filter(pk=turn.pk).update(
        assistant_message=Case(
            When(assistant_message="", then=Value(signed)),
            default=Concat(F("assistant_message"), Value("\n\n" + signed)),
            output_field=TextField(),
        )
    )
    turn.refresh_from_db(fields=["assistant_message"])
    return turn


def handoff_resume(*, session: ChatSession, actor: Any = None) -> ChatSession:
    """Give a handed-off session back to the agent."""
    ChatSession.objects.filter(pk=session.pk).update(
        status=ChatSession.Status.ACTIVE, retry_count=0, version=F("version") + 1, updated_at=timezone.now()
    )
    _reload(session)
    checkpoint_record(session=session, reason=Checkpoint.Reason.RESUME, detail=f"handoff resumed by {actor or 'staff'}")
    return session


# --------------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------------


def _orphaned_turns(session: ChatSession) -> list[Turn]:
    # We hold the session lock, so a turn still marked running/pending has no live owner.
    return list(session.turns.filter(status__in=[Turn.Status.RUNNING, Turn.Status.PENDING]).order_by("seq"))


def _reload_with_last_seq(session: ChatSession) -> tuple[int, list[Turn]]:
    """``_reload``, and the session's last turn number and orphaned turns, in one query (orphans are rare)."""
    turns = Turn.objects.filter(session=OuterRef("pk"))
    fresh = (
        ChatSession.objects.select_related("agent", "user")
        .annotate(
            last_seq=Subquery(turns.order_by("-seq").values("seq")[:1]),
            unfinished=Exists(turns.filter(status__in=[Turn.Status.RUNNING, Turn.Status.PENDING])),
        )
        .get(pk=session.pk)
    )
    refresh_from(session, fresh)
    return int(fresh.last_seq or 0), (_orphaned_turns(session) if fresh.unfinished else [])


def _reload(session: ChatSession) -> None:
    """Read the session again, with its agent and user (one query; a plain refresh drops them)."""
    session.refresh_from_db(from_queryset=ChatSession.objects.select_related("agent", "user"))


def _before_call(session: ChatSession, turn: Turn) -> None:
    """Checkpoint the state before a model call (unless the turn's opening checkpoint still stands)."""
    if getattr(turn, "_checkpoint_fresh", False):
        turn._checkpoint_fresh = False  # type: ignore[attr-defined]
        return
    checkpoint_before_call(session=session, turn=turn)


def _drain(events: Iterator[dict[str, Any]]) -> dict[str, Any]:
    final: dict[str, Any] = {}
    for event in events:
        if event["type"] in ("done", "error"):
            final = event
    return final


def _replay_events(turn: Turn) -> Iterator[dict[str, Any]]:
    yield {"type": "turn", "turn_id": turn.pk, "seq": turn.seq, "replayed": True}
    if turn.assistant_message:
        yield {"type": "delta", "text": turn.assistant_message}
    session = turn.session
    yield {"type": "state", "state": session.state, "data": session.data, "status": session.status}
    yield _done_event(turn, session, replayed=True)


def _done_event(turn: Turn, session: ChatSession, *, replayed: bool = False) -> dict[str, Any]:
    return {
        "type": "done",
        "turn_id": turn.pk,
        "seq": turn.seq,
        "reply": turn.assistant_message,
        "state": session.state,
        "data": session.data,
        "status": session.status,
        "turn_status": turn.status,
        "is_demo": turn.is_demo,
        "replayed": replayed,
    }


def _execute(session: ChatSession, turn: Turn, *, resumed: bool, fresh: bool = False) -> Iterator[dict[str, Any]]:
    """Run a saved turn to completion. Every failure is caught, recorded on the turn, and reported as an event."""
    with (
        log_context(session_id=str(session.pk), turn_id=turn.pk),
        span("turn", session_id=str(session.pk), turn_id=turn.pk),
    ):
        yield {"type": "turn", "turn_id": turn.pk, "seq": turn.seq, "resumed": resumed}
        try:
            yield from _execute_inner(session, turn, resumed=resumed, fresh=fresh)
        except TurnLockLost as exc:
            # Another process owns this turn now; writing anything would duplicate its reply.
            logger.warning("turn %s: %s", turn.pk, exc)
            yield {"type": "error", "code": exc.code, "message": str(exc), "turn_id": turn.pk}
        except Exception as exc:  # the turn fails cleanly; the message stays saved
            logger.exception("turn %s failed", turn.pk)
            message = _user_facing_error(exc)
            recorded = _fail_turn(
                session,
                turn,
                reason=f"{type(exc).__name__}: {exc}",
                reply=message,
                summary=f"{getattr(exc, 'code', None) or _error_code(exc)} ({type(exc).__name__})",
            )
            if not recorded and Turn.objects.filter(pk=turn.pk).exists():
                # Another request finished this turn while this one failed: its reply stands.
                lost = TurnLockLost("This turn was finished by another request; its reply stands.")
                yield {"type": "error", "code": lost.code, "message": str(lost), "turn_id": turn.pk}
                return
            try:
                _reload(session)
            except ChatSession.DoesNotExist:
                pass  # deleted while its turn ran: the error event below is all there is left to say
            yield {
                "type": "error",
                "code": getattr(exc, "code", None) or _error_code(exc),
                "message": message,
                "turn_id": turn.pk,
            }


def _error_code(exc: Exception) -> str:
    if isinstance(exc, LLMError):
        return f"llm_{exc.outcome}"
    return "context_overflow" if isinstance(exc, ContextOverflowError) else "turn_failed"


def _user_facing_error(exc: Exception) -> str:
    if isinstance(exc, TruncatedOutputError):
        return "The model's reply was cut off before it finished, so it was not used. Your message is saved; please try again."
    if isinstance(exc, LLMError):
        return f"The model could not answer ({exc.outcome.replace('_', ' ')}). Your message is saved; please try again."
    if isinstance(exc, ContextOverflowError):
        return "This message does not fit in the model's context window even after trimming. Please shorten it."
    return "Something went wrong while answering. Your message is saved; please try again."


AGENT_SWITCHED_OFF = "This chat's agent has been switched off by an operator."
_UNFINISHED = (Turn.Status.RUNNING, Turn.Status.PENDING)
_FINISHED = (Turn.Status.COMPLETED, Turn.Status.FAILED)


def _write_unfinished(turn: Turn, **fields: Any) -> bool:
    """Write ``fields`` to the turn only while it is unfinished: the fence against a second runner. False when
    it is finished (or gone) already, and nothing was written.

    A runner whose connection was cut during the model call lost its lock with it; the next message or
    the sweep may have finished the turn meanwhile. The lock check before the write cannot see that (the
    lock is free again), the turn's status can: a finished turn is never written twice."""
    return bool(Turn.objects.filter(pk=turn.pk, status__in=_UNFINISHED).update(**fields))


def _finish_turn_row(turn: Turn, **fields: Any) -> None:
    """Write a turn's outcome through the fence (``_write_unfinished``); ``TurnLockLost`` when it was shut."""
    if not _write_unfinished(turn, **fields):
        raise TurnLockLost("This turn was finished by another request while this one waited; nothing was written.")


def _fail_turn(session: ChatSession, turn: Turn, *, reason: str, reply: str, summary: str | None = None) -> bool:
    """Mark the turn failed. ``reason`` (the exception's text) is for staff, in ``Turn.error`` and the log;
    ``summary`` goes into the checkpoint log, which the session's owner reads through the API. False when
    the turn was finished elsewhere meanwhile (or deleted): nothing is written."""
    failed = {"status": Turn.Status.FAILED, "error": reason[:4000], "assistant_message": reply}
    if not _write_unfinished(turn, completed_at=timezone.now(), **failed):
        # Finished elsewhere (see _finish_turn_row), or deleted with its session: nothing of ours to record.
        logger.warning("turn %s failed after it was finished elsewhere or deleted; not recorded", turn.pk)
        return False
    turn.refresh_from_db()
    try:
        turn_failure_record(session=session, turn=turn, reason=(summary or reason)[:500])
    except Exception:
        logger.exception("could not record the failure of turn %s", turn.pk)
    return True


def _execute_inner(session: ChatSession, turn: Turn, *, resumed: bool, fresh: bool) -> Iterator[dict[str, Any]]:
    if not fresh:
        _reload(session)
    agent: Agent = session.agent
    provider = get_provider(agent=agent)
    workflow = get_workflow(session.workflow)
    counter = counter_for(provider.model)
    message = turn.user_message
    composition_extra: dict[str, Any] = {}

    if not agent.is_active:
        # Switched off after this message was saved (a turn the sweep or a retry resumes): not answered.
        note = AGENT_SWITCHED_OFF + " This message was saved but will not be answered."
        _finish_turn_row(
            turn,
            status=Turn.Status.FAILED,
            error="agent switched off",
            assistant_message=note,
            completed_at=timezone.now(),
            state_after=session.state,
        )
        turn.refresh_from_db()
        yield {"type": "error", "code": "agent_unavailable", "message": note, "turn_id": turn.pk}
        return

    if session.status == ChatSession.Status.NEEDS_HUMAN:
        _finish_turn_row(turn, status=Turn.Status.COMPLETED, completed_at=timezone.now(), state_after=session.state)
        turn.refresh_from_db()
        yield {"type": "state", "state": session.state, "data": session.data, "status": session.status}
        yield _done_event(turn, session)
        return

    # 2. Memories. The turns the prompt will show are read once, here: retrieval searches with the user's
    # earlier messages and leaves out the episodes of turns the prompt shows anyway.

    history = turn_history(session=session, before_seq=turn.seq)
    with span("retrieval"):
        retrieved, retrieval_report = _retrieve(session, agent, workflow.name, message, history)

    # 3. Workflow decision (slots + next state) — structured output only.
    refused: list[str] = []  # what the message said that the workflow refused: the reply explains it
    if not workflow.is_free_chat and workflow.decides_in(session.state):
        already = session.checkpoints.filter(turn=turn, reason=Checkpoint.Reason.TRANSITION).exists()
        if not already:
            refused = yield from _decide(session, turn, agent, provider, workflow, message)
            _reload(session)

    # Routing for agents with tools (the booking workflow's action states call their tool directly).
    tool_names = [t for t in (agent.tools or []) if isinstance(t, str)]
    route: RouteOutcome | None = None
    if tool_names and workflow.is_free_chat:
        _before_call(session, turn)
        route = route_message(
            provider=provider,
            message=message,
            tool_names=tool_names,
            ctx=CallContext(purpose="route", agent_id=agent.pk, session_id=session.pk, turn_id=turn.pk),
            confidence_threshold=agent.routing_confidence_threshold,
        )
        composition_extra["route"] = route.as_dict()
        if route.action == "handoff":
            yield from _handoff(session, turn, reason=f"routing: {route.reasoning or 'handoff'}")
            return
        if route.action == "answer":
            tool_names = []

    # 4–5. Prompt and reply with tools, under the step limit.
    yield from _reply_loop(
        session,
        turn,
        agent,
        provider,
        workflow,
        counter,
        retrieved,
        retrieval_report,
        tool_names,
        composition_extra,
        refused=refused,
        history=history,
    )


def _retrieve(
    session: ChatSession, agent: Agent, workflow_name: str, message: str, history: TurnHistory
) -> tuple[Any, dict[str, Any]]:
    try:
        query = retrieval_query(message=message, earlier=[t.user for t in history.newest], agent=agent)
        retrieved = memories_for_prompt(
            user=session.user,
            query=query.text,
            agent=agent,
            workflow=workflow_name,
            budget_tokens=agent.memory_budget_tokens,
            relevance_threshold=agent.relevance_threshold,
            touch=False,  # counted by the turn's memory-write task, off the request path
            window=RecentWindow(session_id=session.pk, after_seq=history.floor),
        )
        retrieved.query_source = query.source
        return retrieved, retrieved.as_report()
    except Exception as exc:  # memory is an aid; its failure must not fail the turn
        logger.exception("memory retrieval failed; answering without memories")
        # Shown to the user (memory panel, composition API): the kind of failure, not its text (in the log).
        return None, {"error": f"retrieval failed ({type(exc).__name__})", "items": [], "candidates": []}


def _decide(
    session: ChatSession, turn: Turn, agent: Agent, provider: Any, workflow: Any, message: str
) -> Generator[dict[str, Any], None, list[str]]:
    """The workflow's decision for this message, applied or refused; returns the refused slot values."""
    recent = [
        (t.user_message, t.assistant_message)
        for t in session.turns.filter(status=Turn.Status.COMPLETED).order_by("-seq")[:3]
    ][::-1]
    messages = workflow.decision_messages(
        state=session.state, data=session.data, user_message=message, recent_turns=recent
    )
    _before_call(session, turn)
    try:
        with span("llm.call", purpose="slots"):
            decision = provider.structured(
                messages,
                schema=workflow.decision_schema,
                ctx=CallContext(purpose="slots", agent_id=agent.pk, session_id=session.pk, turn_id=turn.pk),
            )
    except (StructuredOutputError, LLMError) as exc:
        # No valid decision: nothing changes, the failure is counted, and the reply asks again.
        logger.warning("turn %s: no valid workflow decision: %s", turn.pk, exc)
        turn_failure_record(session=session, turn=turn, reason=f"no valid workflow decision ({_error_code(exc)})")
        _reload(session)
        yield {
            "type": "state",
            "state": session.state,
            "data": session.data,
            "status": session.status,
            # The user sees this (and the checkpoint log, through the API): the exception's text
            # (addresses, upstream messages) is in the log only.
            "error": f"No valid decision from the model ({_error_code(exc)}); nothing was changed.",
        }
        return []
    if getattr(decision, "confidence", 1.0) < agent.routing_confidence_threshold:
        # Below the threshold the safe default is to stay where we are (and keep what we have).

        checkpoint_record(
            session=session,
            reason=Checkpoint.Reason.INVALID_TRANSITION,
            turn=turn,
            detail=f"decision confidence {decision.confidence:.2f} below {agent.routing_confidence_threshold:.2f}: not applied",
        )
        yield {"type": "state", "state": session.state, "data": session.data, "status": session.status}
        return []
    outcome = transition_apply(session=session, turn=turn, decision=decision)
    _reload(session)
    event: dict[str, Any] = {"type": "state", "state": session.state, "data": session.data, "status": session.status}
    if not outcome.applied:
        event["rejected"] = list(outcome.errors)
    yield event
    return list(outcome.slot_errors)


def _handoff(session: ChatSession, turn: Turn, *, reason: str) -> Iterator[dict[str, Any]]:
    with transaction.atomic():
        # The turn first: a runner that lost the turn to another changes nothing (_finish_turn_row).
        _finish_turn_row(
            turn, status=Turn.Status.COMPLETED, assistant_message=HANDOFF_NOTICE, completed_at=timezone.now()
        )
        ChatSession.objects.filter(pk=session.pk).update(
            status=ChatSession.Status.NEEDS_HUMAN, version=F("version") + 1, updated_at=timezone.now()
        )
        _reload(session)
        checkpoint_record(session=session, reason=Checkpoint.Reason.HANDOFF, turn=turn, detail=reason[:500])
        Turn.objects.filter(pk=turn.pk).update(state_after=session.state)
    turn.refresh_from_db()
    yield {"type": "delta", "text": HANDOFF_NOTICE}
    yield {"type": "state", "state": session.state, "data": session.data, "status": session.status}
    yield _done_event(turn, session)


def _prompt_inputs(
    session: ChatSession,
    turn: Turn,
    agent: Agent,
    workflow: Any,
    retrieved: Any,
    tool_specs: list[Any],
    tool_messages: list[Message],
    history: TurnHistory,
    refused: list[str],
) -> Any:
    # The window plus any turns that left it but are not in the summary yet: the builder keeps those
    # when they fit and degrades them (visibly) when they do not.
    recent = history.for_prompt
    memories = []
    procedural: list[str] = []
    if retrieved is not None:
        memories = [
            MemoryItem(id=item.memory.pk, text=item.text, score=float(item.score), kind=item.memory.kind)
            for item in retrieved.items
        ]
        procedural = [m.text for m in retrieved.procedural]
    return PromptInputs(
        system_prompt=agent.system_prompt,
        fixed_instructions=TOOL_ERROR_POLICY if tool_specs else "",
        workflow_text=workflow.resume_instruction(session.state, session.data, refused=refused),
        procedural=procedural,
        memories=memories,
        summary=session.summary,
        recent_turns=recent,
        summary_through_seq=session.summary_through_seq,
        message=turn.user_message,
        tool_messages=list(tool_messages),
        tools=[spec.as_openai() for spec in tool_specs],
    )


def _reply_loop(
    session: ChatSession,
    turn: Turn,
    agent: Agent,
    provider: Any,
    workflow: Any,
    counter: Any,
    retrieved: Any,
    retrieval_report: dict[str, Any],
    tool_names: list[str],
    composition_extra: dict[str, Any],
    *,
    refused: list[str],
    history: TurnHistory,
) -> Iterator[dict[str, Any]]:
    budget = ContextBudget.from_agent(agent)
    # ``history`` was read once for every step of the turn (a tool step adds tool messages, not turns),
    # and is handed to the summary check after it.
    action_tool = workflow.action_states.get(session.state) if hasattr(workflow, "action_states") else None
    names = list(dict.fromkeys([*tool_names, *([action_tool] if action_tool else [])]))
    specs = tool_specs(names) if names else []
    tool_messages: list[Message] = []
    context = ToolContext(user=session.user, session=session, turn=turn, agent=agent)
    reply_parts: list[str] = []
    built = None
    steps = 0
    limit_hit = False
    reply = ""
    while True:
        if steps >= agent.step_limit:
            limit_hit = True
            break
        steps += 1
        with span("context.build"):
            built = build_prompt(
                inputs=_prompt_inputs(
                    session, turn, agent, workflow, retrieved, specs, tool_messages, history, refused
                ),
                budget=budget,
                counter=counter,
            )
        _before_call(session, turn)
        step_text: list[str] = []
        with span("llm.call", purpose="reply", step=steps):
            stream = provider.stream(
                built.messages,
                ctx=CallContext(
                    purpose="reply",
                    agent_id=agent.pk,
                    session_id=session.pk,
                    turn_id=turn.pk,
                    prompt_sections=dict(built.sections),
                ),
                temperature=agent.temperature,
                max_tokens=agent.max_tokens,
                tools=specs or None,
            )
            for delta in stream:
                if delta:
                    step_text.append(delta)
                    yield {"type": "delta", "text": delta}
        completion = stream.completion
        text = "".join(step_text) if step_text else (completion.text if completion else "")
        calls = list(completion.tool_calls) if completion else []
        if not calls:
            reply = text
            break
        if text:
            reply_parts.append(text)
        tool_messages.append(
            {
                "role": "assistant",
                "content": text or None,
                "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ],
            }
        )
        for call in calls:
            with span("tool", name=call.name):
                result = run_tool_call(call=call, context=context, enabled=names)
            tool_messages.append({"role": "tool", "tool_call_id": call.id, "content": result.content})
            yield {"type": "tool", "name": call.name, "ok": result.ok, "error_kind": result.error_kind}
            if action_tool and call.name == action_tool and session.state in workflow.action_outcomes:
                success_state, failure_state = workflow.action_outcomes[session.state]
                decision = _action_decision(workflow, session, result, success_state, failure_state)
                if decision is not None:
                    transition_apply(session=session, turn=turn, decision=decision)
                    _reload(session)
                    yield {"type": "state", "state": session.state, "data": session.data, "status": session.status}

    if limit_hit:
        yield from _at_step_limit(session, turn, agent, reply_parts)
        return

    composition = dict(built.composition) if built is not None else {}
    composition.update(composition_extra)
    composition["steps"] = steps
    _complete_turn(
        session,
        turn,
        reply=reply if not reply_parts else "\n\n".join([*reply_parts, reply]).strip(),
        steps=steps,
        composition=composition,
        retrieval=retrieval_report,
        prompt_tokens=built.total_tokens if built is not None else 0,
        is_demo=provider.is_demo,
        history=history,
    )
    yield {"type": "state", "state": session.state, "data": session.data, "status": session.status}
    yield _done_event(turn, session)


def _action_decision(workflow: Any, session: ChatSession, result: Any, success: str, failure: str) -> Any:
    """The decision for an action state, built from the tool's structured outcome (ok / not ok)."""
    if result.ok:
        # The tool's structured output (ToolOutput.data), never its text, feeds the transition.
        return workflow.decision(
            next_state=success, slots=workflow.action_slots(result.data), reasoning=f"{result.name} succeeded"
        )
    # A failed action counts as a failed attempt; after the retry limit the session moves to FAILED.
    turn_failure_record(session=session, turn=None, reason=f"{result.name} failed ({result.error_kind or 'error'})")
    _reload(session)
    return None


def _at_step_limit(session: ChatSession, turn: Turn, agent: Agent, reply_parts: list[str]) -> Iterator[dict[str, Any]]:
    behaviour = agent.step_limit_behaviour
    note = f"I stopped after {agent.step_limit} steps without finishing."
    _write_unfinished(turn, step_limit_hit=True, steps=agent.step_limit)
    if behaviour == "handoff":
        yield from _handoff(session, turn, reason=f"step limit {agent.step_limit} reached")
        return
    if behaviour == "partial":
        partial = "\n\n".join(reply_parts).strip()
        reply = (
            f"{partial}\n\n({note} This is a partial answer.)"
            if partial
            else f"{note} Here is what I have: nothing conclusive yet."
        )
        _complete_turn(
            session,
            turn,
            reply=reply,
            steps=agent.step_limit,
            composition={"step_limit_hit": True},
            retrieval={},
            prompt_tokens=0,
            is_demo=False,
        )
        yield {"type": "delta", "text": f"\n\n({note})"}
        yield _done_event(turn, session)
        return
    _fail_turn(
        session, turn, reason=f"step limit {agent.step_limit} reached", reply=f"{note} Please rephrase or try again."
    )
    _reload(session)
    yield {
        "type": "error",
        "code": "step_limit",
        "message": f"{note} Please rephrase or try again.",
        "turn_id": turn.pk,
    }


def _complete_turn(
    session: ChatSession,
    turn: Turn,
    *,
    reply: str,
    steps: int,
    composition: dict[str, Any],
    retrieval: dict[str, Any],
    prompt_tokens: int,
    is_demo: bool,
    history: TurnHistory | None = None,
) -> None:
    """Save the reply and reset the failure count in one transaction; after the commit, enqueue the
    turn's background work. ``history`` is what the turn's prompt was built from, if it was."""
    if not SessionTurnLock(session.pk).holds_or_retakes():
        raise TurnLockLost("The database connection was lost mid-turn and another request is finishing this turn.")
    now = timezone.now()
    with transaction.atomic():
        session_fields: dict[str, Any] = {"updated_at": now}
        if session.workflow == "free_chat":
            # No transitions in free chat: a turn that succeeds is what resets the failure count
            # (a change of state, so the version moves when there was a count to reset).
            session_fields["retry_count"] = 0
            session_fields["version"] = Case(
                When(retry_count__gt=0, then=F("version") + 1),
                default=F("version"),
                output_field=PositiveIntegerField(),
            )
        # The session row is locked from here to the commit; the turn records the state it returned.
        stored = update_returning(ChatSession.objects.filter(pk=session.pk), **session_fields)
        if not stored:
            raise ChatSession.DoesNotExist("The session was deleted while its turn ran.")
        fields: dict[str, Any] = {
            "status": Turn.Status.COMPLETED,
            "assistant_message": reply,
            "steps": steps,
            "retrieval": retrieval,
            "prompt_tokens": prompt_tokens,
            "completed_at": now,
            "state_after": stored[0].state,
            "error": "",
        }
        if composition:
            fields["composition"] = composition
        if is_demo:
            fields["is_demo"] = True
        saved = update_returning(Turn.objects.filter(pk=turn.pk, status__in=_UNFINISHED), **fields)
        if not saved:
            # Rolls the session's write back with it (see _finish_turn_row).
            if Turn.objects.filter(pk=turn.pk).exists():
                raise TurnLockLost(
                    "This turn was finished by another request while this one waited; nothing was written."
                )
            raise Turn.DoesNotExist("The turn was deleted while it ran.")
        finished = TurnText(seq=turn.seq, user=turn.user_message, assistant=reply)
        transaction.on_commit(lambda: _after_turn(turn, session, history=history, finished=finished))
    # Committed: both rows as written, with no re-read (the session keeps its agent and user). Not before
    # the commit, so a commit that fails leaves the caller's copies as the database has them.
    refresh_from(session, stored[0])
    refresh_from(turn, saved[0])


def _after_turn(
    turn: Turn, session: ChatSession, *, history: TurnHistory | None = None, finished: TurnText | None = None
) -> None:
    """Enqueue the background work of a finished turn. A broker outage is logged; the turn is already saved.

    Runs right after the completing transaction commits, with the caller's objects: the session (and
    its agent) as the runtime holds them; ``summary_request_if_due`` compares-and-sets in the database.
    With the history the turn read and the turn as finished, the summary check reads no turns again.
    """
    try:
        memory_writes_enqueue(turn=turn)
    except Exception:
        logger.exception("could not enqueue memory writes for turn %s", turn.pk)
    try:
        summary_request_if_due(session=session, history=history, finished=finished)
    except Exception:
        logger.exception("could not request a summary for session %s", session.pk)
