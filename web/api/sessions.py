"""Sessions API: create, list, retrieve and delete one's own sessions; post messages (plain or streamed);
read a session's state and checkpoints, and a turn's context composition.

Another user's session or turn answers 404, exactly like one that does not exist, so ids leak nothing.
Staff see only their own sessions here too; the one exception is a turn's context composition, which
staff may read for any turn (it is what the context inspector shows them).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import QuerySet
from django.http import HttpResponseBase
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.events import EVENT_ID_PATTERN, is_event_id
from llm.providers import DEMO_LABEL
from orchestrator.runtime import turn_follow, turn_run
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.selectors import chat_branches, own_sessions, session_turns
from sessions.services import session_create, session_delete, session_fork
from web.api.sessions_serializers import (
    CheckpointOutputSerializer,
    MessageInputSerializer,
    MessageOutputSerializer,
    SessionForkInputSerializer,
    SessionInputSerializer,
    SessionOutputSerializer,
    SessionStateSerializer,
    TurnCompositionSerializer,
    TurnOutputSerializer,
)
from web.chat.rendering import markdown_to_safe_html
from web.chat.streaming import event_response, idempotency_key_from, is_asgi, turn_event_response

IDEMPOTENCY_HEADER = OpenApiParameter(
    name="Idempotency-Key",
    type=str,
    location=OpenApiParameter.HEADER,
    required=False,
    description="Any unique string (e.g. a UUID). A retried request with the same key returns the first reply "
    "instead of running the turn again.",
)


# The refusals of a message, before anything is saved (the two message endpoints).
MESSAGE_REFUSALS = {
    409: OpenApiResponse(description="Another message on this session is still being answered."),
    413: OpenApiResponse(description="The message is longer than MAX_MESSAGE_CHARS."),
}


def _own_session(request: Request, session_id: UUID) -> ChatSession:
    return get_object_or_404(own_sessions(request.user), pk=session_id)


def _idempotency_key(request: Request) -> str | None:
    try:
        return idempotency_key_from(request.headers)
    except ValueError as exc:
        raise ValidationError({"Idempotency-Key": [str(exc)]}) from exc


class SessionListApi(generics.GenericAPIView[ChatSession]):
    serializer_class = SessionOutputSerializer

    def get_queryset(self) -> QuerySet[ChatSession]:
        return own_sessions(self.request.user).order_by("-updated_at", "pk")

    @extend_schema(tags=["sessions"], summary="List my sessions", responses=SessionOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(SessionOutputSerializer(page, many=True).data)

    @extend_schema(
        tags=["sessions"],
        summary="Start a session with an agent",
        request=SessionInputSerializer,
        responses={201: SessionOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        serializer = SessionInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        session = session_create(user=request.user, **serializer.validated_data)
        return Response(SessionOutputSerializer(session).data, status=status.HTTP_201_CREATED)


class SessionDetailApi(APIView):
    @extend_schema(tags=["sessions"], summary="One of my sessions", responses=SessionOutputSerializer)
    def get(self, request: Request, session_id: UUID) -> Response:
        return Response(SessionOutputSerializer(_own_session(request, session_id)).data)

    @extend_schema(
        tags=["sessions"],
        summary="Delete one of my sessions (its turns and checkpoints go with it)",
        responses={204: None, 409: OpenApiResponse(description="A turn is running on this session.")},
    )
    def delete(self, request: Request, session_id: UUID) -> Response:
        session_delete(session=_own_session(request, session_id))  # 409 session_busy while a turn runs
        return Response(status=status.HTTP_204_NO_CONTENT)


class SessionForkApi(APIView):
    @extend_schema(
        tags=["sessions"],
        summary="Branch one of my sessions at a turn",
        description=(
            "A new session (a branch of the same chat) that replaces turn `turn`: it starts from the checkpoint "
            "taken before that turn (workflow state, slots, and the summary when it ends before it) with copies of "
            "the turns before it; nothing is run again (a tool that acted, a booking, is not called). Send the "
            "branch its message (an edited one, or the same one to regenerate the reply) as to any session. The "
            "original stays as it was."
        ),
        request=SessionForkInputSerializer,
        responses={
            201: SessionOutputSerializer,
            404: OpenApiResponse(description="No such session of mine, or no such turn in it."),
            409: OpenApiResponse(description="A turn is running on this session (or it is closed)."),
        },
    )
    def post(self, request: Request, session_id: UUID) -> Response:
        session = _own_session(request, session_id)
        serializer = SessionForkInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        branch = session_fork(session=session, at_turn=serializer.validated_data["turn"], actor=request.user)
        return Response(SessionOutputSerializer(branch).data, status=status.HTTP_201_CREATED)


class SessionBranchListApi(APIView):
    @extend_schema(
        tags=["sessions"],
        summary="The branches of one of my sessions' chat, oldest first (itself included)",
        responses=SessionOutputSerializer(many=True),
    )
    def get(self, request: Request, session_id: UUID) -> Response:
        session = _own_session(request, session_id)
        branches = chat_branches(session=session).select_related("agent")
        return Response(SessionOutputSerializer(branches, many=True).data)


class SessionStateApi(APIView):
    @extend_schema(tags=["sessions"], summary="A session's workflow state", responses=SessionStateSerializer)
    def get(self, request: Request, session_id: UUID) -> Response:
        return Response(SessionStateSerializer(_own_session(request, session_id)).data)


class SessionCheckpointListApi(generics.ListAPIView[Checkpoint]):
    serializer_class = CheckpointOutputSerializer

    @extend_schema(tags=["sessions"], summary="A session's checkpoints, oldest first")
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Checkpoint]:
        session = _own_session(self.request, self.kwargs["session_id"])
        return Checkpoint.objects.filter(session=session).order_by("seq")


class SessionMessageApi(generics.GenericAPIView[Turn]):
    serializer_class = TurnOutputSerializer
    throttle_scope = "messages"

    def get_throttles(self) -> list[Any]:
        # Reading the history is cheap; only posting a message (a model call) uses the "messages" rate.
        if self.request.method != "POST":
            self.throttle_scope = ""
        return super().get_throttles()

    def get_queryset(self) -> QuerySet[Turn]:
        return session_turns(session=_own_session(self.request, self.kwargs["session_id"]))

    @extend_schema(
        tags=["messages"], summary="A session's turns, oldest first", responses=TurnOutputSerializer(many=True)
    )
    def get(self, request: Request, session_id: UUID) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(TurnOutputSerializer(page, many=True).data)

    @extend_schema(
        tags=["messages"],
        summary="Post a message and wait for the reply",
        parameters=[IDEMPOTENCY_HEADER],
        request=MessageInputSerializer,
        responses={
            201: MessageOutputSerializer,
            200: OpenApiResponse(MessageOutputSerializer, description="Replayed: the key was seen before."),
            **MESSAGE_REFUSALS,
        },
    )
    def post(self, request: Request, session_id: UUID) -> Response:
        session = _own_session(request, session_id)
        serializer = MessageInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        result = turn_run(
            session=session, message=serializer.validated_data["message"], idempotency_key=_idempotency_key(request)
        )
        session.refresh_from_db()
        body = {
            "turn": result.turn,
            "reply": result.reply,
            "reply_html": markdown_to_safe_html(result.reply),
            "replayed": result.replayed,
            "truncated": result.turn.truncated,
            "is_demo": result.is_demo,
            "model_label": DEMO_LABEL if result.is_demo else session.agent.model,
            "session": session,
        }
        return Response(
            MessageOutputSerializer(body).data,
            status=status.HTTP_200_OK if result.replayed else status.HTTP_201_CREATED,
        )


class _JSONErrorsNegotiation(BaseContentNegotiation):
    """Whatever the Accept header says (``text/event-stream``), errors before the stream are JSON."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        return (renderers[0], renderers[0].media_type)


class SessionMessageStreamApi(APIView):
    throttle_scope = "messages"
    content_negotiation_class = _JSONErrorsNegotiation

    @extend_schema(
        tags=["messages"],
        summary="Post a message and receive the reply as server-sent events",
        description=(
            "Answers `text/event-stream`. Events (each `event: <type>` with a JSON `data:` line): "
            "`turn` {turn_id, seq}, `delta` {text}, `tool` {name, ok}, `state` {state, data, status}, "
            "`done` {turn_id, reply, html, state, status, is_demo}, `error` {code, message}. "
            "Refusals (busy session, empty or too long message) are ordinary JSON errors before the stream starts."
        ),
        parameters=[IDEMPOTENCY_HEADER],
        request=MessageInputSerializer,
        responses={
            (200, "text/event-stream"): OpenApiResponse(OpenApiTypes.STR, description="The turn's events."),
            **MESSAGE_REFUSALS,
        },
    )
    def post(self, request: Request, session_id: UUID) -> HttpResponseBase:
        session = _own_session(request, session_id)
        serializer = MessageInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return turn_event_response(
            session=session,
            message=serializer.validated_data["message"],
            idempotency_key=_idempotency_key(request),
            asynchronous=is_asgi(request),
        )


class TurnEventsApi(APIView):
    content_negotiation_class = _JSONErrorsNegotiation

    @extend_schema(
        tags=["messages"],
        summary="A turn's events again, from where a dropped stream left off",
        description=(
            "Answers `text/event-stream` with the events of one of my turns, as the message's stream sent them: "
            "all of them, or those after the `Last-Event-ID` header (the `id:` of the last event received). The "
            "model is not asked again: a turn still running goes on where it runs, and this stream follows it. "
            "Once a finished turn's events are no longer kept (RUN_EVENTS_KEEP_SECONDS), its `done` (or `error`) "
            "event is sent from what is saved."
        ),
        parameters=[
            OpenApiParameter(
                name="Last-Event-ID",
                # Empty: from the start, as without it.
                type={"type": "string", "pattern": f"^({EVENT_ID_PATTERN.strip('^$')})?$"},
                location=OpenApiParameter.HEADER,
                required=False,
                description="The id of the last event received; the stream starts after it (empty: from the start).",
            )
        ],
        responses={(200, "text/event-stream"): OpenApiResponse(OpenApiTypes.STR, description="The turn's events.")},
    )
    def get(self, request: Request, turn_id: int) -> HttpResponseBase:
        owner: Any = request.user
        turn = get_object_or_404(Turn.objects.filter(session__user=owner), pk=turn_id)
        after = str(request.headers.get("Last-Event-ID") or "").strip()
        if after and not is_event_id(after):
            raise ValidationError(
                {"Last-Event-ID": ["Not an event id of this API (two numbers of at most 19 digits: digits-digits)."]}
            )
        return event_response(turn_follow(turn, after=after), asynchronous=is_asgi(request))


class TurnCompositionApi(APIView):
    @extend_schema(
        tags=["sessions"],
        summary="What went into a turn's prompt (sections, tokens, dropped items) and what memory retrieval kept",
        responses=TurnCompositionSerializer,
    )
    def get(self, request: Request, turn_id: int) -> Response:
        viewer: Any = request.user
        # Anyone's turn for staff the admin lets view turns (the context inspector); one's own for the rest.
        may_view_all = viewer.is_staff and (
            viewer.has_perm("chat_sessions.view_turn") or viewer.has_perm("chat_sessions.change_turn")
        )
        turns = Turn.objects.all() if may_view_all else Turn.objects.filter(session__user=viewer)
        return Response(TurnCompositionSerializer(get_object_or_404(turns, pk=turn_id)).data)
