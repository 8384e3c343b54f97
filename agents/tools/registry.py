"""The tool registry: what a tool is (``Tool``, who it runs for, what it returns) and the tools by name.

``default_registry`` holds the tools of ``settings.AGENT_TOOLS`` and of installed packages' entry points;
``tool_names`` and ``tool_specs`` read it (the admin's choices, what the model is offered). Running a tool
call is ``agents.tools.execution.run_tool_call``; a tool's argument schema as the model sees it,
``agents.tools.schemas.parameters_schema``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from pydantic import BaseModel

from agents.tools.schemas import parameters_schema
from core.plugins import load_plugins
from llm.base import ToolSpec

if TYPE_CHECKING:
    from agents.models import Agent
    from sessions.models import ChatSession, Turn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolContext:
    """Who a tool runs for: the signed-in user, and the session, turn and agent when there are any."""

    user: Any
    session: ChatSession | None = None
    turn: Turn | None = None
    agent: Agent | None = None


@dataclass(frozen=True)
class Tool:
    """A tool: its name and description for the model, its argument schema, its deadline, its body.

    ``run(args, context)`` receives a validated ``args_model`` instance and returns the result text.
    It may raise (preferably one of ``agents.tools.errors``); ``run_tool_call`` turns that into TOOL_ERROR.
    ``timeout_s`` None means ``settings.TOOLS_DEFAULT_TIMEOUT``; ``max_attempts`` None means
    ``settings.TOOLS_MAX_ATTEMPTS``.
    """

    name: str
    description: str
    args_model: type[BaseModel]
    run: Callable[[Any, ToolContext], object]
    timeout_s: float | None = None
    max_attempts: int | None = None

    def effective_timeout(self) -> float:
        return float(self.timeout_s if self.timeout_s is not None else settings.TOOLS_DEFAULT_TIMEOUT)

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=parameters_schema(self.args_model))


@dataclass(frozen=True)
class ToolOutput:
    """What a tool may return instead of a bare string: the text the model sees, plus structured
    ``data`` for the runtime (e.g. a booking reference), so control flow never parses the text."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)


class ToolRegistry:
    """A set of tools by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> Tool:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def specs(self, names: Iterable[str]) -> list[ToolSpec]:
        specs = []
        for name in names:
            tool = self._tools.get(name)
            if tool is None:
                # An agent may still list a tool that was removed; leaving it out beats failing the turn.
                logger.warning("tool %r is enabled but not registered; not offered to the model", name)
                continue
            specs.append(tool.spec())
        return specs


_default: ToolRegistry | None = None
_default_lock = threading.Lock()


# Installable packages offer tools under this entry-point group: each entry names a Tool or a sequence of them.
TOOLS_ENTRY_POINT_GROUP = "agents_runtime.tools"


def default_registry() -> ToolRegistry:
    """The process-wide registry: the tools of ``settings.AGENT_TOOLS``, then those of installed packages'
    entry points (group ``agents_runtime.tools``). Built on first use; ``ImproperlyConfigured`` names an
    entry that cannot be imported, is not a tool, or takes a name another tool has."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = ToolRegistry(configured_tools())
    return _default


def default_registry_reset() -> None:
    """Forget the process-wide registry: the next use builds it from the settings again (tests, reloads)."""
    global _default
    with _default_lock:
        _default = None


def configured_tools() -> list[Tool]:
    """Every tool the settings and the installed packages name, in that order (see ``default_registry``)."""
    found = load_plugins("AGENT_TOOLS", getattr(settings, "AGENT_TOOLS", []), TOOLS_ENTRY_POINT_GROUP, _as_tools)
    names = [tool.name for tool in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ImproperlyConfigured(
            f"more than one tool is named {', '.join(map(repr, twice))} (AGENT_TOOLS, entry points)"
        )
    return found


def _as_tools(value: object, source: str) -> list[Tool]:
    if isinstance(value, Tool):
        return [value]
    if isinstance(value, list | tuple) and value and all(isinstance(item, Tool) for item in value):
        return list(value)
    raise ImproperlyConfigured(
        f"{source} is {type(value).__name__}, not a Tool or a list of them (define one with @tool or Tool(...))"
    )


def tool_names(*, registry: ToolRegistry | None = None) -> list[str]:
    """Names of the registered tools (for the admin's choices and for validation of ``Agent.tools``)."""
    return (registry or default_registry()).names()


def tool_specs(names: list[str], *, registry: ToolRegistry | None = None) -> list[ToolSpec]:
    """The tools named, as the model sees them; names not registered are left out (and logged)."""
    return (registry or default_registry()).specs(names)
