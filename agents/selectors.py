"""Reads about agents that every door shows the same way."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from agents.models import Agent
from agents.workflows import available_workflow_names
from llm.base import LLMConfigurationError
from llm.providers import DEMO_LABEL, get_provider


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


def active_agents() -> QuerySet[Agent]:
    """The agents people can talk to, by name: what the API's agent list, the chat's "New chat" and MCP's
    ``list_agents`` list. Not an agent switched off, nor one whose workflow is not available on this server (a
    plug-in whose ``AGENT_EXTRA_*`` setting is gone: restoring it offers the agent again)."""
    workflows = available_workflow_names() | {""}  # "": the free chat
    return Agent.objects.filter(is_active=True, workflow__in=workflows).order_by("name", "pk")


def active_agent(slug: str) -> Agent | None:
    """The active agent called ``slug``, or None (none, or an empty slug)."""
    return active_agents().filter(slug=slug).first() if slug else None
