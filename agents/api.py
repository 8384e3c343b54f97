"""Agents API: list and retrieve the active agents (read-only; operators configure agents in the admin)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import generics

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
