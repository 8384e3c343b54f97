"""The chat page's live events (``/chats/<id>/events/``): what changes in a chat elsewhere, as it happens.

Every open page of a chat waits here for news: turns started and finished from any door (this tab, another tab,
the API, MCP), staff replies, hand-offs and hand-backs, the workflow's state. Under ASGI with a run channel a page
waits on the session's change signals with no thread; otherwise a thread reads the database each second.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from agents.workflows import state_label
from core import events as run_channel
from core.incoming import clamped_datetime
from sessions.models import ChatSession, Turn
from sessions.selectors import chat_current_branch, own_sessions
from web.chat.rendering import markdown_to_safe_html
from web.chat.signed_in import signed_in_or_401
from web.chat.streaming import is_asgi

# How long one events request waits for news, and how soon the page asks again (EventSource reconnects by
# itself). Anything can happen to an open chat at any time (a message from another tab, the API or MCP, a staff
# reply), so every open page waits for news: under ASGI with a run channel the wait holds no thread (a change
# signal wakes it); under WSGI it holds a thread and reads the database each second.
EVENTS_HOLD_SECONDS = 15.0
EVENTS_POLL_SECONDS = 1.0
EVENTS_RETRY_MS = 1000
# At most this many held events requests per user at once: more get an answer at once and ask again a second
# later, so no one can tie up the server by opening tabs. Under WSGI each holds a server thread.
EVENTS_HELD_PER_USER = 2
EVENTS_HELD_PER_USER_ASGI = 8
# News is looked for this far before the cursor: a staff reply's time is taken before its commit, and a look
# between the two must not skip it (the page ignores what it has shown already).
EVENTS_LOOKBACK = timedelta(seconds=5)


def _events_slot(user_pk: object, held: int = EVENTS_HELD_PER_USER) -> str | None:
    """Take one of the user's ``held`` slots for a held events request: its cache key, or None when all are
    taken. ``cache.add`` is atomic in every cache backend (a unique key in the database table,
    SET NX in Redis), so many requests at once cannot all count themselves under the limit. A slot that its
    request never gave back (a killed process) expires after four holds."""
    for number in range(held):
        key = f"chat-events-slot:{user_pk}:{number}"
        if cache.add(key, 1, timeout=int(EVENTS_HOLD_SECONDS * 4)):
            return key
    return None


def _since(request: HttpRequest) -> datetime:
    raw = request.headers.get("Last-Event-ID") or request.GET.get("since") or ""
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        return timezone.now()
    # Inside the dates the app takes (``0001-01-01T00:00:00`` less the look-back overflowed: a 500).
    return clamped_datetime(parsed)


def _news(session_id: UUID, since: datetime) -> list[dict[str, Any]]:
    """What changed in the session after ``since``: its status or state, staff replies, turns finished (the
    ones another request answered, or a recovery)."""
    row = (
        ChatSession.objects.filter(pk=session_id)
        .values("status", "state", "updated_at", "workflow", "workflow_version", "user_id", "chat_root")
        .first()
    )
    if row is None:
        return [{"event": "gone"}]
    events: list[dict[str, Any]] = []
    # The chat moved to another branch since the page was drawn (an edit, a regenerate, a version chosen, in
    # another tab): the page follows it there, as it follows new turns. A page opened on an older branch on
    # purpose stays (the move was before it).
    current = chat_current_branch(user_id=row["user_id"], chat_root=row["chat_root"])
    if current is not None and current[0] != session_id and current[1] > since:
        events.append({"event": "branch", "session_id": str(current[0]), "url": reverse("chat", args=[current[0]])})
    since = since - EVENTS_LOOKBACK
    recent = Turn.objects.filter(session_id=session_id)
    if (
        row["updated_at"] <= since
        and not recent.filter(completed_at__gt=since).exists()
        and not recent.filter(created_at__gt=since).exists()
    ):
        return events
    label = state_label(row["workflow"], row["workflow_version"], row["state"])
    events.append({"event": "status", "status": row["status"], "state": row["state"], "label": label})
    for turn in recent.order_by("-seq")[:5][::-1]:
        mine = {"turn_id": turn.pk, "seq": turn.seq, "message": turn.user_message}
        if turn.completed_at and turn.completed_at > since:
            # Sent from anywhere (this tab, another, the API, MCP) and finished: every open page shows it whole.
            answer = turn.agent_message
            events.append(
                {
                    "event": "turn_done",
                    **mine,
                    "reply": answer,
                    "html": markdown_to_safe_html(answer),
                    "status": turn.status,
                }
            )
        elif turn.created_at > since and turn.status in (Turn.Status.RUNNING, Turn.Status.PENDING):
            # Sent and being answered: the page draws it and follows its events (/api/turns/<id>/events/).
            events.append({"event": "turn_started", **mine})
        for reply in turn.staff_replies or []:
            at = datetime.fromisoformat(str(reply.get("at")))
            if at > since:
                events.append(
                    {
                        "event": "staff",
                        "turn_id": turn.pk,
                        "author": reply.get("author"),
                        "text": reply.get("text"),
                        "at": reply.get("at"),
                    }
                )
    return events


@signed_in_or_401
@require_GET
def chat_events(request: HttpRequest, session_id: UUID) -> HttpResponseBase:
    """Server-sent events for an open chat: staff replies, hand-offs and hand-backs, turns finished elsewhere.
    ``since`` (or the Last-Event-ID the browser sends on reconnecting) is where the page's knowledge ends."""
    session = get_object_or_404(own_sessions(request.user), pk=session_id)
    since = _since(request)
    if is_asgi(request) and run_channel.channel_url() is not None:
        # Under ASGI, with a run channel: the stream waits for the session's change signals in the event loop
        # (no thread, no polling) and reads the database only when one comes.
        return _event_stream_response(_signalled_events(request.user.pk, session.pk, since))

    def stream() -> Iterator[bytes]:
        nonlocal since
        slot = _events_slot(request.user.pk)
        may_hold = slot is not None
        try:
            deadline = time.monotonic() + (EVENTS_HOLD_SECONDS if may_hold else 0)
            while True:
                checked = timezone.now()
                events = _news(session.pk, since)
                since = checked
                lines, gone = _event_lines(events, since)
                yield from lines
                if gone:
                    return
                if time.monotonic() >= deadline:
                    break
                # A comment each second: a closed tab shows up as a failed write, not after the whole hold.
                yield b": waiting\n\n"
                time.sleep(EVENTS_POLL_SECONDS)
            yield _retry_line(since)
        finally:
            if slot is not None:
                cache.delete(slot)

    return _event_stream_response(stream())


def _event_lines(events: list[dict[str, Any]], since: datetime) -> tuple[list[bytes], bool]:
    """``_news``'s events as SSE messages (their id: where the page's knowledge now ends), and whether the session
    is gone (the stream ends there)."""
    lines: list[bytes] = []
    for event in events:
        name = event.pop("event")
        lines.append(f"id: {since.isoformat()}\nevent: {name}\ndata: {json.dumps(event)}\n\n".encode())
        if name == "gone":
            return lines, True
    return lines, False


def _retry_line(since: datetime) -> bytes:
    """A stream's end: where the page's knowledge ends, and ask again in a second."""
    return f"id: {since.isoformat()}\nretry: {EVENTS_RETRY_MS}\n\n".encode()


def _event_stream_response(body: Iterator[bytes] | AsyncIterator[bytes]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


# While it waits for a signal, a held stream sends a comment this often (proxies keep it open).
EVENTS_KEEPALIVE_SECONDS = 5.0


async def _signalled_events(user_pk: object, session_id: UUID, since: datetime) -> AsyncIterator[bytes]:
    """``chat_events`` under ASGI: the same events and holds, with no thread while it waits. The database is read
    once at the start and once per change signal (``core.events.session_changed``); a change whose signal is
    lost is found when the page asks again, as with the polled stream."""
    slot = await sync_to_async(_events_slot)(user_pk, EVENTS_HELD_PER_USER_ASGI)
    may_hold = slot is not None
    try:
        deadline = time.monotonic() + (EVENTS_HOLD_SECONDS if may_hold else 0)
        # Taken before the database is read: a change made after that read has a later signal.
        after = await run_channel.asession_last(session_id)
        while True:
            checked = timezone.now()
            events = await sync_to_async(_news)(session_id, since)
            since = checked
            lines, gone = _event_lines(events, since)
            for line in lines:
                yield line
            if gone:
                return
            signal = None
            while signal is None and (left := deadline - time.monotonic()) > 0:
                signal = await run_channel.session_wait(
                    session_id, after=after, timeout=min(left, EVENTS_KEEPALIVE_SECONDS)
                )
                if signal is None:
                    yield b": waiting\n\n"
            if signal is None:
                break
            after = signal
        yield _retry_line(since)
    finally:
        if slot is not None:
            await sync_to_async(cache.delete)(slot)
