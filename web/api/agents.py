"""Agents API: list and retrieve the active agents (read-only; operators configure agents in the admin)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import logout
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents.models import Agent
from agents.selectors import active_agents
from core.api_errors import error_body
from core.parsers import RawTextParser
from people.erasure import ACCOUNT_DELETE_CONFIRMATION, account_delete, person_erase
from people.portability import ImportRejected, mem0_records, parse_export, person_export, person_import
from web.api.agents_serializers import AgentOutputSerializer


@extend_schema(tags=["agents"], summary="List the active agents")
class AgentListApi(generics.ListAPIView[Agent]):
    serializer_class = AgentOutputSerializer

    def get_queryset(self) -> QuerySet[Agent]:
        return active_agents()


@extend_schema(tags=["agents"], summary="One active agent")
class AgentDetailApi(generics.RetrieveAPIView[Agent]):
    serializer_class = AgentOutputSerializer

    def get_queryset(self) -> QuerySet[Agent]:
        return active_agents()


ERASE_CONFIRMATION = "erase my data"
DELETE_CONFIRMATION = ACCOUNT_DELETE_CONFIRMATION


def _confirmation(name: str, phrase: str, doing: str) -> type[serializers.Serializer[Any]]:
    """A body whose ``confirm`` must be ``phrase`` exactly, in the schema as the one value it may be (it took any
    spacing and case once)."""

    def validate_confirm(self: Any, value: str) -> str:
        if value != phrase:
            raise serializers.ValidationError(f'Send "confirm": "{phrase}" to {doing}.')
        return value

    field = extend_schema_field({"type": "string", "enum": [phrase]})(
        type(f"{name}Phrase", (serializers.CharField,), {})
    )
    confirm = field(help_text=f'Exactly "{phrase}": it cannot be undone.', max_length=50)
    return type(name, (serializers.Serializer,), {"confirm": confirm, "validate_confirm": validate_confirm})


EraseMeInputSerializer = _confirmation("EraseMeInputSerializer", ERASE_CONFIRMATION, "erase your data")
DeleteMeInputSerializer = _confirmation("DeleteMeInputSerializer", DELETE_CONFIRMATION, "delete your account")


@extend_schema(
    tags=["me"],
    summary="Erase everything kept about me (sessions, turns, memories, records); my account stays",
    request=EraseMeInputSerializer,
    responses=inline_serializer(
        "Erased",
        {"erased": serializers.DictField(child=serializers.IntegerField()), "erasure_id": serializers.IntegerField()},
    ),
)
class EraseMeApi(APIView):
    def post(self, request: Request) -> Response:
        EraseMeInputSerializer(data=request.data).is_valid(raise_exception=True)
        result = person_erase(user=request.user, actor=request.user)
        return Response({"erased": result.counts, "erasure_id": result.erasure_id})


@extend_schema(
    tags=["me"],
    summary="Delete my account: everything kept about me is erased, then the account and its tokens",
    request=DeleteMeInputSerializer,
    responses=inline_serializer(
        "Deleted",
        {
            "deleted": serializers.BooleanField(),
            "erased": serializers.DictField(child=serializers.IntegerField()),
            "erasure_id": serializers.IntegerField(),
        },
    ),
)
class DeleteMeApi(APIView):
    def post(self, request: Request) -> Response:
        DeleteMeInputSerializer(data=request.data).is_valid(raise_exception=True)
        result = account_delete(user=request.user)
        logout(request)
        return Response({"deleted": True, "erased": result.counts, "erasure_id": result.erasure_id})


@extend_schema(
    tags=["me"],
    summary="Export everything kept about me, as JSON Lines (a header line, then sessions, turns, memories)",
    responses={(200, "application/x-ndjson"): OpenApiResponse(description="One JSON object a line.")},
)
class ExportMeApi(APIView):
    def get(self, request: Request) -> StreamingHttpResponse:
        return export_download(request.user)


def export_download(user: Any) -> StreamingHttpResponse:
    """``user``'s export as a JSON Lines download, streamed (the API's and the admin's)."""
    response = StreamingHttpResponse(
        (line.encode() for line in person_export(user=user)), content_type="application/x-ndjson"
    )
    response["Content-Disposition"] = f'attachment; filename="{user.get_username()}-export.jsonl"'
    return response


@extend_schema(
    tags=["me"],
    summary="Import an export (ours, or Mem0's with ?source=mem0); idempotent; nothing is written if a line is bad",
    parameters=[OpenApiParameter("source", str, enum=["agents", "mem0"], required=False)],
    request={"application/x-ndjson": OpenApiTypes.STR},
    examples=[
        OpenApiExample(
            "An export with nothing in it",
            value='{"format": "agents-runtime-export", "version": 1}\n',
            media_type="application/x-ndjson",
            request_only=True,
        )
    ],
    responses=inline_serializer(
        "ImportReport",
        {"created": serializers.DictField(child=serializers.IntegerField()), "skipped": serializers.ListField()},
    ),
)
class ImportMeApi(APIView):
    parser_classes = [RawTextParser]

    def post(self, request: Request) -> Response:
        text = request.data if isinstance(request.data, str) else ""
        try:
            parsed = (
                mem0_records(text) if request.query_params.get("source") == "mem0" else parse_export(text.splitlines())
            )
        except ImportRejected as exc:
            return Response(error_body("invalid_import", str(exc), {"line": exc.line}), status=400)
        return Response(person_import(user=request.user, parsed=parsed).as_dict())
