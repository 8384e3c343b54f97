"""The OpenAI-compatible door: ``POST /v1/chat/completions`` and ``GET /v1/models`` on the web port.

Any OpenAI client talks to an agent here: the key is the person's API token (``Authorization: Bearer ...``), the
``model`` an agent's slug. A message goes through the same services as the REST API's (``turn_run``,
``turn_stream``: one validation, the same limits, throttles, ``Idempotency-Key``, metrics and isolation); which
session it continues is ``orchestrator.conversations``'s to say. The contract: docs/openai-compatible.md (these
endpoints follow OpenAI's, not this API's OpenAPI schema).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Generator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents.selectors import active_agent, active_agents
from core.api_errors import api_exception_handler, openai_error_body
from core.db import release_connection
from core.errors import Refusal
from core.parsers import SizeLimitedJSONParser
from orchestrator.channel import RunStream, turn_end_event
from orchestrator.context import FINISHED, TurnEvent
from orchestrator.conversations import conversation_abandon, conversation_continue, reply_shown
from orchestrator.runtime import turn_run, turn_stream
from sessions.locks import SessionBusyError
from sessions.models import ChatSession, Turn
from web.chat.streaming import event_response, idempotency_key_from, is_asgi
from web.openai_api.shapes import (
    SESSION_HEADER,
    ChunkWriter,
    CompletionRequest,
    OpenAIError,
    completion_body,
    completion_request,
    error_type,
    model_entry,
    usage_of,
)

logger = logging.getLogger(__name__)


class BearerTokenAuthentication(TokenAuthentication):
    """The API token as every OpenAI client sends its key: ``Authorization: Bearer <token>``."""

    keyword = "Bearer"


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Every error of this door in OpenAI's shape: the API's own handler decides status and message (401, 404,
    429 with Retry-After, a refusal's status, 500 logged), then its body is written as OpenAI's SDKs read it."""
    if isinstance(exc, OpenAIError):
        body = openai_error_body(exc.message, kind=error_type(exc.status), code=exc.code, param=exc.param)
        return Response(body, status=exc.status)
    response = api_exception_handler(exc, context)
    if response is None:
        return None
    error = response.data["error"]
    fields = (error.get("details") or {}).get("fields")
    param = next(iter(fields), None) if isinstance(fields, dict) else None
    code = "rate_limit_exceeded" if response.status_code == 429 else error.get("code")
    response.data = openai_error_body(
        str(error.get("message") or ""), kind=error_type(response.status_code), code=code, param=param
    )
    return response


class _JSONAlways(BaseContentNegotiation):
    """Whatever the Accept header says (``text/event-stream``), answers and errors before a stream are JSON."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        return (renderers[0], renderers[0].media_type)


class OpenAIApiView(APIView):
    authentication_classes = [BearerTokenAuthentication, TokenAuthentication]
    renderer_classes = [JSONRenderer]
    parser_classes = [SizeLimitedJSONParser]
    content_negotiation_class = _JSONAlways

    def get_exception_handler(self) -> Any:
        return openai_exception_handler


@extend_schema(exclude=True)  # OpenAI's contract, not this API's: docs/openai-compatible.md
class ModelListApi(OpenAIApiView):
    def get(self, request: Request) -> Response:
        return Response({"object": "list", "data": [model_entry(agent) for agent in active_agents()]})


@extend_schema(exclude=True)
class ModelDetailApi(OpenAIApiView):
    def get(self, request: Request, model: str) -> Response:
        agent = active_agent(model) if "\x00" not in model else None
        if agent is None:
            raise OpenAIError(f"The model {model[:200]!r} does not exist.", status=404, code="model_not_found")
        return Response(model_entry(agent))


@extend_schema(exclude=True)
class ChatCompletionsApi(OpenAIApiView):
    throttle_scope = "messages"

    def post(self, request: Request) -> HttpResponseBase:
        asked = completion_request(request.data, headers=request.headers)
        found = conversation_continue(
            user=request.user,
            agent=asked.agent,
            history=asked.history,
            message=asked.message,
            session_id=asked.session_id,
        )
        session = found.session
        if found.replay is not None:
            # A retry of a message this session holds (the SDKs retry): the turn it started, never a second one.
            turn = found.replay
            if turn.status not in FINISHED:
                raise SessionBusyError("This message is still being answered; try again when it has finished.")
            if asked.stream:
                return self._streamed(request, asked, session, iter([turn_end_event(turn)]))
            return self._whole(asked, session, turn)
        try:
            key = _idempotency_key(request)
            if asked.stream:
                events = turn_stream(session=session, message=asked.message, idempotency_key=key)
                return self._streamed(request, asked, session, events)
            turn = turn_run(session=session, message=asked.message, idempotency_key=key).turn
        except (Refusal, ValidationError):
            conversation_abandon(found)  # refused before anything was saved: no empty session left behind
            raise
        return self._whole(asked, session, turn)

    def _whole(self, asked: CompletionRequest, session: ChatSession, turn: Turn) -> Response:
        session.refresh_from_db(fields=["status"])
        if turn.status == Turn.Status.FAILED:
            raise OpenAIError(turn.assistant_message or "The reply failed.", status=502, code="turn_failed", param=None)
        reply = reply_shown(turn.assistant_message, with_person=session.status == ChatSession.Status.NEEDS_HUMAN)
        body = completion_body(
            turn_id=turn.pk,
            model=asked.agent.slug,
            reply=reply,
            truncated=turn.truncated,
            usage=usage_of(turn.composition, turn.prompt_tokens),
            session_id=str(session.pk),
        )
        return Response(body, headers={SESSION_HEADER: str(session.pk)})

    def _streamed(
        self,
        request: Request,
        asked: CompletionRequest,
        session: ChatSession,
        events: Iterator[TurnEvent] | RunStream,
    ) -> HttpResponseBase:
        writer = ChunkWriter(
            model=asked.agent.slug, session_id=str(session.pk), include_usage=asked.include_usage, usage_for=turn_usage
        )
        response = event_response(
            events,
            asynchronous=is_asgi(request),
            encode=lambda run: _chunks(writer, run),
            aencode=lambda run: _achunks(writer, run),
        )
        response[SESSION_HEADER] = str(session.pk)
        return response


def turn_usage(turn_id: int) -> dict[str, int]:
    """A finished turn's tokens (``usage``), read from its record."""
    try:
        row = Turn.objects.filter(pk=turn_id).values_list("composition", "prompt_tokens").first()
    finally:
        release_connection()
    return usage_of(row[0], row[1]) if row else usage_of(None, 0)


def _chunks(writer: ChunkWriter, events: Iterator[TurnEvent]) -> Generator[bytes, None, None]:
    try:
        yield b": stream open\n\n"  # a comment: some proxies hold a response back until its first bytes
        for event in events:
            yield from writer.feed(event)
    except GeneratorExit:
        raise
    except Exception:
        # Headers are sent: the error goes in the stream, where the SDKs raise it.
        logger.exception("chat completion stream failed")
    yield from writer.closing()


async def _achunks(writer: ChunkWriter, events: RunStream) -> AsyncIterator[bytes]:
    usage = sync_to_async(turn_usage, thread_sensitive=False)
    try:
        yield b": stream open\n\n"
        async for event in events:
            ready = await usage(int(event["turn_id"])) if event["type"] == "done" and writer.include_usage else None
            for chunk in writer.feed(event, usage=ready):
                yield chunk
    except Exception:
        logger.exception("chat completion stream failed")
    for chunk in writer.closing():
        yield chunk


def _idempotency_key(request: Request) -> str | None:
    try:
        return idempotency_key_from(request.headers)
    except ValueError as exc:
        raise ValidationError({"Idempotency-Key": [str(exc)]}) from exc


@csrf_exempt  # a POST to an unknown path is a 404 in OpenAI's shape (nothing changes here)
def openai_not_found(request: HttpRequest, unmatched: str = "") -> JsonResponse:
    """Unknown /v1/ paths, in OpenAI's error shape."""
    body = openai_error_body(f"No endpoint at {request.path} here.", kind="invalid_request_error", code="not_found")
    return JsonResponse(body, status=404)
