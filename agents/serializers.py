"""API shapes of agents: what a client needs to pick one and know whether it is the demo model."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agents.llm.base import LLMConfigurationError
from agents.llm.providers import DEMO_LABEL, get_provider
from agents.models import Agent


def agent_model_label(agent: Agent) -> dict[str, Any]:
    """Which model answers for ``agent`` (``is_demo`` true for the offline demo model), without any secret."""
    try:
        provider = get_provider(agent=agent)
    except LLMConfigurationError:
        # Its endpoint profile is gone from the settings: its turns will say so; a listing must not fail.
        return {"is_demo": False, "model_label": "not configured"}
    is_demo = bool(getattr(provider, "is_demo", False))
    return {
        "is_demo": is_demo,
        "model_label": DEMO_LABEL if is_demo else (agent.model or str(getattr(provider, "model", "")) or ""),
    }


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
