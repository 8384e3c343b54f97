"""Agents API: list and retrieve the active agents (read-only; operators configure agents in the admin)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents.erasure import person_erase
from agents.models import Agent
from agents.serializers import AgentOutputSerializer


def _active_agents() -> QuerySet[Agent]:
    return Agent.objects.filter(is_active=True).order_by("name", "pk")


@extend_schema(tags=["agents"], summary="List the active agents")
class AgentListApi(generics.ListAPIView[Agent]):
    serializer_class = AgentOutputSerializer

    def get_queryset(self) -> QuerySet[Agent]:
        return _active_agents()


@extend_schema(tags=["agents"], summary="One active agent")
class AgentDetailApi(generics.RetrieveAPIView[Agent]):
    serializer_class = AgentOutputSerializer

    def get_queryset(self) -> QuerySet[Agent]:
        return _active_agents()


ERASE_CONFIRMATION = "erase my data"


class EraseMeInputSerializer(serializers.Serializer[Any]):
    confirm = serializers.CharField(
        help_text=f'Exactly "{ERASE_CONFIRMATION}": erasing cannot be undone.', max_length=50
    )

    def validate_confirm(self, value: str) -> str:
        if value.strip().lower() != ERASE_CONFIRMATION:
            raise serializers.ValidationError(f'Send "confirm": "{ERASE_CONFIRMATION}" to erase your data.')
        return value


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
