"""Typed failures a tool raises internally; the registry turns each into a ``TOOL_ERROR: …`` string.

A tool implementation may raise anything. These classes say *what kind* of failure it was, which
decides two things: whether the registry retries (``retryable``) and the ``error_kind`` recorded on
the ``ToolInvocation`` row and shown on the dashboard.
"""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal[
    "",
    "invalid_arguments",
    "timeout",
    "http_4xx",
    "http_5xx",
    "connection",
    "malformed_payload",
    "unknown_tool",
    "not_enabled",
    "error",
]


class ToolError(Exception):
    """Base of the typed tool failures. ``str(exc)`` is shown to the model, so keep it useful and short."""

    kind: ErrorKind = "error"
    retryable: bool = False


class ToolInputError(ToolError):
    """The arguments are well-formed but wrong for the data (no such flight, host not allowed): not retried."""

    kind = "invalid_arguments"


class ToolTimeout(ToolError):
    """The tool or its upstream did not answer in time. Retried."""

    kind = "timeout"
    retryable = True

    def __init__(self, message: str = "timed out", *, timeout_s: float | None = None) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s


class ToolConnectionError(ToolError):
    """The upstream could not be reached (refused, reset, DNS). Retried."""

    kind = "connection"
    retryable = True


class ToolHttpError(ToolError):
    """The upstream answered with an HTTP error status. 5xx is retried; 4xx never is (the request is wrong)."""

    def __init__(self, status: int, detail: str = "") -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"HTTP {status}" + (f": {detail}" if detail else ""))

    @property
    def kind(self) -> ErrorKind:  # type: ignore[override]
        return "http_5xx" if self.status >= 500 else "http_4xx"

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        return self.status >= 500


class ToolPayloadError(ToolError):
    """The upstream answered, but not with the shape the tool expects (a missing field, broken JSON)."""

    kind = "malformed_payload"
