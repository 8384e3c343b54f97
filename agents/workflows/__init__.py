"""Workflows declared in code, and the registry agents use to refer to them by name.

``get_workflow("flight_booking")`` returns the shipped booking machine; ``free_chat`` is the default.
Other modules may ``register`` more at import time (``AgentsConfig.ready`` imports this package).
"""

from __future__ import annotations

from agents.workflows.base import (
    MAX_RETRIES,
    StateSpec,
    StepResult,
    UnknownWorkflowError,
    Workflow,
    WorkflowDecision,
)
from agents.workflows.flight_booking import FLIGHT_BOOKING
from agents.workflows.free_chat import FREE_CHAT

_REGISTRY: dict[str, Workflow] = {}


def register(workflow: Workflow) -> Workflow:
    """Add ``workflow`` to the registry under its name (registering the same name twice is an error)."""
    existing = _REGISTRY.get(workflow.name)
    if existing is not None and existing is not workflow:
        raise ValueError(f"a different workflow is already registered as {workflow.name!r}")
    _REGISTRY[workflow.name] = workflow
    return workflow


def get_workflow(name: str) -> Workflow:
    """The workflow registered as ``name``; ``UnknownWorkflowError`` names the known ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownWorkflowError(f"unknown workflow {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def registered_workflows() -> list[Workflow]:
    """Every registered workflow."""
    return list(_REGISTRY.values())


def workflow_choices() -> list[tuple[str, str]]:
    """(name, title) pairs for form fields, sorted by title."""
    return sorted(((w.name, w.title) for w in _REGISTRY.values()), key=lambda pair: pair[1])


register(FREE_CHAT)
register(FLIGHT_BOOKING)

__all__ = [
    "FLIGHT_BOOKING",
    "FREE_CHAT",
    "MAX_RETRIES",
    "StateSpec",
    "StepResult",
    "UnknownWorkflowError",
    "Workflow",
    "WorkflowDecision",
    "get_workflow",
    "register",
    "registered_workflows",
    "workflow_choices",
]
