"""Server-sent events for a turn: the shared door of the web chat and the API's streaming endpoint.

``turn_event_response`` starts the turn *before* it returns, so the runtime's refusals (busy
session, rejected message) surface as ordinary HTTP errors rather than inside a 200 stream.
Each runtime event becomes one SSE message (``event: <type>`` + ``data: <json>``); the final
``done`` event also carries the reply as sanitized HTML for the page to swap in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from typing import Any

from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse

from core import events as run_channel
from core.db import release_connection
from core.incoming import Unstorable, idempotency_key
from orchestrator.context import TurnEvent
from orchestrator.runtime import RunStream, turn_stream
from sessions.models import ChatSession
from web.chat.rendering import markdown_to_safe_html

logger = logging.getLogger(__name__)

# How a door writes a turn's events as bytes: this app's SSE events by default (``_encoded``).
Encoder = Callable[[Iterator[TurnEvent]], Generator[bytes, None, None]]
AsyncEncoder = Callable[[RunStream], AsyncIterator[bytes]]


def idempotency_key_from(headers: Mapping[str, str]) -> str | None:
    """The request's ``Idempotency-Key`` (None when absent); ``ValueError`` when it cannot be stored (the rule
    every door shares: ``core.incoming.idempotency_key``)."""
    key = (headers.get("Idempotency-Key") or "").strip()
    if not key:
        return None
    try:
        # WSGI hands header bytes over as latin-1: a UTF-8 key ("clé-€") arrives as mojibake, with C1
        # control characters in it. Read back as UTF-8 when it is that; any other key stays as it came.
        key = key.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        pass
    try:
        return idempotency_key(key, field="Idempotency-Key")
    except Unstorable as exc:
        raise ValueError(f"The Idempotency-Key header {exc.reason}") from None


def sse_encode(event: Mapping[str, Any]) -> bytes:
    """One SSE message. JSON never contains a raw newline, so one ``data:`` line is enough. An event of the run
    channel has an ``id:`` too: a client that reconnects sends it back as ``Last-Event-ID``."""
    kind = str(event.get("type", "message")).replace("\n", " ")
    if kind == run_channel.KEEPALIVE:
        return b": keep-alive\n\n"  # a comment: clients skip it; proxies and clients see a live stream
    payload = json.dumps(event, default=str, ensure_ascii=False)
    event_id = str(event.get("event_id") or "").replace("\n", "")
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {kind}\ndata: {payload}\n\n".encode()


def _with_html(event: Mapping[str, Any]) -> Mapping[str, Any]:
    """A reply's event with its sanitized HTML; without it (the page shows the text) if rendering fails, so
    that one reply's markup cannot stop the stream, and the turn after it, on the way."""
    if event.get("type") in ("done", "recovered"):
        try:
            return {**event, "html": markdown_to_safe_html(str(event.get("reply") or ""))}
        except Exception:
            logger.exception("could not render reply of turn %s", event.get("turn_id"))
    return event


def _encoded(events: Iterator[TurnEvent]) -> Generator[bytes, None, None]:
    try:
        # A comment line first: some proxies hold a response back until the first bytes arrive.
        yield b": stream open\n\n"
        for event in events:
            yield sse_encode(_with_html(event))
    except GeneratorExit:
        # The client went away: _EventStream.close() finishes the turn and releases the session's lock.
        raise
    except Exception:  # headers are sent: the only way left to report is an error event
        logger.exception("turn stream failed")
        yield sse_encode({"type": "error", "code": "server_error", "message": "The reply failed on our side."})


class _EventStream:
    """The response body: the encoded events, whose ``close()`` (called by the server when it is done
    with the response, sent or not) finishes the turn and closes its events, even if no byte was ever read.

    A client that goes away mid-reply (a closed tab, a reload, a dropped connection) does not stop its
    turn: the message is saved, so it is answered, and the reply saved for the client to read when it comes
    back, as the endpoint that does not stream does. (Left running instead, the turn was finished by the
    next message or the sweep, which asked the model again from the checkpoint and paid for it twice.)"""

    def __init__(self, events: Iterator[TurnEvent], encode: Encoder | None = None) -> None:
        self._events = events
        self._bytes = (encode or _encoded)(events)

    def __iter__(self) -> Iterator[bytes]:
        return self._bytes

    def close(self) -> None:
        try:
            self._finish_unsent()
        finally:
            try:
                self._bytes.close()
            finally:
                close = getattr(self._events, "close", None)
                if close is not None:
                    close()

    def _finish_unsent(self) -> None:
        """Run the turn's remaining events, unsent (none are left when the client read them all). A turn run by
        a worker goes on there: nothing to run here."""
        if isinstance(self._events, RunStream):
            return
        try:
            for _ in self._events:
                pass
        except Exception:  # the turn records its own failures; this is what it could not
            logger.exception("could not finish a turn whose client went away")


async def _aencoded(events: RunStream) -> AsyncIterator[bytes]:
    """``_encoded`` for an ASGI server: the run's events read without a thread (the run goes on if the client
    goes away: it is a worker's)."""
    try:
        yield b": stream open\n\n"
        async for event in events:
            yield sse_encode(_with_html(event))
    except Exception:
        logger.exception("turn stream failed")
        yield sse_encode({"type": "error", "code": "server_error", "message": "The reply failed on our side."})


def is_asgi(request: Any) -> bool:
    """Is ``request`` served by an ASGI server (whose event loop can stream an async body)?"""
    return isinstance(getattr(request, "_request", request), ASGIRequest)


def event_response(
    events: Iterator[TurnEvent] | RunStream,
    *,
    asynchronous: bool = False,
    encode: Encoder | None = None,
    aencode: AsyncEncoder | None = None,
) -> StreamingHttpResponse:
    """``events`` as ``text/event-stream``: read in the event loop when ``asynchronous`` and they come from the run
    channel, else iterated by the server's thread. ``encode`` / ``aencode`` write the events as another protocol
    does (the OpenAI-compatible door's chunks); by default, as this app's events."""
    body: Any
    if isinstance(events, RunStream):
        # The request's work with the database is done: its connection goes back now, not when the stream ends.
        release_connection()
    if asynchronous and isinstance(events, RunStream):
        body = (aencode or _aencoded)(events)
    else:
        body = _EventStream(events, encode)
    response = StreamingHttpResponse(body, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    # nginx and similar proxies buffer responses unless told not to; a buffered stream is not a stream.
    response["X-Accel-Buffering"] = "no"
    return response


def turn_event_response(
    *, session: ChatSession, message: str, idempotency_key: str | None = None, asynchronous: bool = False
) -> StreamingHttpResponse:
    """Start a turn and answer with its events as ``text/event-stream``.

    Raises the runtime's ``MessageRejected`` / ``SessionBusyError`` / ``SessionClosedError`` before any
    byte is sent, for the caller to turn into an error response.
    """
    events = turn_stream(session=session, message=message, idempotency_key=idempotency_key)
    return event_response(events, asynchronous=asynchronous)
