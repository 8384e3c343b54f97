"""API shapes of agents: what a client needs to pick one and know whether it is the demo model."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agents.models import Agent
from agents.selectors import agent_model_label


class AgentOutputSerializer(serializers.ModelSerializer[Agent]):
    is_demo = serializers.SerializerMethodField()
    model_label = serializers.SerializerMethodField()

    class Meta:
        model = Agent
        fields = ["id", "slug", "name", "description", "workflow", "tools", "is_demo", "model_label"]
        read_only_fields = fields

    def _label(self, agent: Agent) -> dict[str, Any]:
        # One provider lookup per agent and response, not one per field.
        cache: dict[int, dict[str, Any]] = self.context.setdefault("_model_labels", {})
        if agent.pk not in cache:
            cache[agent.pk] = agent_model_label(agent)
        return cache[agent.pk]

    @extend_schema_field(serializers.BooleanField())
    def get_is_demo(self, agent: Agent) -> bool:
        return bool(self._label(agent)["is_demo"])

    @extend_schema_field(serializers.CharField())
    def get_model_label(self, agent: Agent) -> str:
        return str(self._label(agent)["model_label"])
