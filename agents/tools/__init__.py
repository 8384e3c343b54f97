"""Tools the model can call, which never raise: every failure comes back as a ``TOOL_ERROR: …`` string.

Define one with ``@tool`` (``agents.tools.decorator``) and list it in ``settings.AGENT_TOOLS``. Use
``run_tool_call`` to run one, ``tool_specs`` to offer them to the model, and put
``TOOL_ERROR_POLICY`` in the system prompt so the model knows what a TOOL_ERROR means.
"""

from __future__ import annotations

from agents.tools.decorator import tool
from agents.tools.errors import (
    ErrorKind,
    ToolConnectionError,
    ToolError,
    ToolHttpError,
    ToolInputError,
    ToolPayloadError,
    ToolTimeout,
)
from agents.tools.execution import TOOL_ERROR_PREFIX, ToolResult, run_tool_call
from agents.tools.registry import (
    Tool,
    ToolContext,
    ToolOutput,
    ToolRegistry,
    default_registry,
    tool_names,
    tool_specs,
)
from agents.tools.schemas import parameters_schema

# Seed pattern 1: the model must recognise a failed tool call and not loop on it forever.
TOOL_ERROR_POLICY = (
    "When a tool returns a message beginning with TOOL_ERROR:, do not treat it as a result: the tool failed, "
    "and the message says why. Never invent the missing result. If the arguments were wrong, correct them "
    "and try again; if the service was unavailable or timed out, you may try again or take another approach. "
    "After three failed attempts on the same subtask, report the failure clearly to the user and stop."
)

__all__ = [
    "TOOL_ERROR_POLICY",
    "TOOL_ERROR_PREFIX",
    "ErrorKind",
    "Tool",
    "ToolConnectionError",
    "ToolContext",
    "ToolError",
    "ToolHttpError",
    "ToolInputError",
    "ToolOutput",
    "ToolPayloadError",
    "ToolRegistry",
    "ToolResult",
    "ToolTimeout",
    "default_registry",
    "parameters_schema",
    "run_tool_call",
    "tool_names",
    "tool",
    "tool_specs",
]
