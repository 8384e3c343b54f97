"""The workflows agents refer to by name: those of ``settings.AGENT_WORKFLOWS`` and of installed packages.

``get_workflow("free_chat")`` returns the default one-state chat. The registry is built on first use from
``settings.AGENT_WORKFLOWS`` (dotted paths to a ``Workflow``; ``AGENT_EXTRA_WORKFLOWS`` adds more) and
the entry-point group ``agents_runtime.workflows``; ``register`` adds one from code (docs/extending.md).
A name none of those has is asked of the installed source: the agents app installs the workflows
operators declare in the admin, by version (``agents.workflow_store``).
"""

from __future__ import annotations

import threading
from typing import Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agents.workflows.base import (
    MAX_RETRIES,
    ActionContext,
    ActionFailed,
    StateSpec,
    StepResult,
    UnknownWorkflowError,
    Workflow,
    WorkflowDecision,
)
from agents.workflows.free_chat import FREE_CHAT
from core.plugins import load_plugins
from core.text import state_words

# Installable packages offer workflows under this entry-point group: each entry names a Workflow.
WORKFLOWS_ENTRY_POINT_GROUP = "agents_runtime.workflows"

_REGISTRY: dict[str, Workflow] = {}
_loaded = False
_lock = threading.RLock()


class WorkflowSource(Protocol):
    """Where workflows that are data come from (``agents.workflow_store.StoredWorkflows``)."""

    def workflow(self, name: str, version: int | None) -> Workflow | None: ...

    def choices(self) -> list[tuple[str, str]]: ...


_source: WorkflowSource | None = None


def set_workflow_source(source: WorkflowSource | None) -> WorkflowSource | None:
    """Install where names the code does not register are looked up; returns the previous source."""
    global _source
    previous, _source = _source, source
    return previous


def register(workflow: Workflow) -> Workflow:
    """Add ``workflow`` to the registry under its name (registering the same name twice is an error)."""
    with _lock:
        existing = _REGISTRY.get(workflow.name)
        if existing is not None and existing is not workflow:
            raise ValueError(f"a different workflow is already registered as {workflow.name!r}")
        _REGISTRY[workflow.name] = workflow
    return workflow


def _registry() -> dict[str, Workflow]:
    """The registry, loaded from the settings and the entry points on first use."""
    global _loaded
    if not _loaded:
        with _lock:
            if not _loaded:
                for workflow in configured_workflows():
                    register(workflow)
                _loaded = True
    return _REGISTRY


def configured_workflows() -> list[Workflow]:
    """The free chat, then every workflow the settings and the installed packages name, in that order.
    ``ImproperlyConfigured`` names an entry that cannot be imported or is not a ``Workflow``."""
    paths = getattr(settings, "AGENT_WORKFLOWS", [])
    return [FREE_CHAT, *load_plugins("AGENT_WORKFLOWS", paths, WORKFLOWS_ENTRY_POINT_GROUP, _as_workflow)]


def _as_workflow(value: object, source: str) -> list[Workflow]:
    if not isinstance(value, Workflow):
        raise ImproperlyConfigured(f"{source} is {type(value).__name__}, not a Workflow")
    return [value]


def registry_reset() -> None:
    """Forget every workflow: the next use loads the settings again (tests, reloads)."""
    global _loaded
    with _lock:
        _REGISTRY.clear()
        _loaded = False


def get_workflow(name: str, version: int | None = None) -> Workflow:
    """The workflow registered as ``name``, else version ``version`` (None: the latest) of the one declared
    as data; ``UnknownWorkflowError`` names the known ones otherwise."""
    registry = _registry()
    # A session on a version of a workflow declared as data stays on it, whatever the code registers later.
    found = _source.workflow(name, version) if version is not None and _source is not None else None
    if found is None:
        found = registry.get(name)
    if found is None and _source is not None and version is None:
        found = _source.workflow(name, None)
    if found is None:
        known = sorted({*registry, *(n for n, _title in _stored_choices())})
        raise UnknownWorkflowError(f"unknown workflow {name!r}; known: {', '.join(known)}")
    return found


def workflow_available(name: str, version: int | None = None) -> bool:
    """Whether ``get_workflow(name, version)`` finds it on this server (a plug-in whose setting is gone: not)."""
    try:
        get_workflow(name, version)
    except UnknownWorkflowError:
        return False
    return True


def available_workflow_names() -> set[str]:
    """The names of every workflow an agent may follow here: the code's, the settings' and the packages', and the
    active ones declared as data."""
    return {*_registry(), *(name for name, _title in _stored_choices())}


def state_label(name: str, version: int | None, state: str) -> str:
    """``state`` as people read it in workflow ``name`` (its label; the name in words when the workflow cannot
    be read any more, or has no label for it)."""
    try:
        return get_workflow(name, version).state_label(state)
    except (ImportError, LookupError, KeyError, ValueError):
        return state_words(state)


def code_workflow_names() -> list[str]:
    """The names of the workflows of the code, the settings and the installed packages (not the data)."""
    return sorted(_registry())


def registered_workflows() -> list[Workflow]:
    """Every workflow of the code, the settings and the installed packages (not those declared as data)."""
    return list(_registry().values())


def workflow_choices() -> list[tuple[str, str]]:
    """(name, title) pairs for form fields, sorted by title: the registered workflows and the active ones
    declared as data."""
    pairs = [(w.name, w.title) for w in _registry().values()]
    pairs += [pair for pair in _stored_choices() if pair[0] not in _REGISTRY]
    return sorted(pairs, key=lambda pair: pair[1])


def _stored_choices() -> list[tuple[str, str]]:
    return _source.choices() if _source is not None else []


__all__ = [
    "state_label",
    "FREE_CHAT",
    "ActionContext",
    "ActionFailed",
    "MAX_RETRIES",
    "StateSpec",
    "StepResult",
    "UnknownWorkflowError",
    "Workflow",
    "WorkflowDecision",
    "WorkflowSource",
    "available_workflow_names",
    "code_workflow_names",
    "workflow_available",
    "configured_workflows",
    "get_workflow",
    "register",
    "registered_workflows",
    "registry_reset",
    "set_workflow_source",
    "workflow_choices",
]
