"""Running a tool call: validation, deadlines, retries, and results that never raise.

``run_tool_call`` is the only way the runtime runs a tool. Whatever happens — an unknown tool, broken
JSON, arguments out of range, a hung upstream, a 503, a bug inside the tool — it returns a
``ToolResult`` whose ``content`` is the string the model sees: the tool's output, or a
``TOOL_ERROR: …`` message saying what went wrong and what to do about it. Each call leaves one
``agents.models.ToolInvocation`` row when it belongs to a session (``set_invocation_recorder``).

Tools run in a worker thread so that a deadline can be enforced. Called outside a transaction (as
the runtime does: no transaction is held open around model or tool calls), the thread uses its own
database connection, closed when it ends. Called inside ``transaction.atomic`` (tests, mostly), it
borrows the caller's connection so it sees the caller's uncommitted rows. A timed-out attempt is
abandoned, not killed (Python threads cannot be); tools that write must therefore be idempotent, as
``book_flight`` is.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from pydantic import BaseModel, ValidationError
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from agents.tools.errors import (
    ErrorKind,
    ToolConnectionError,
    ToolError,
    ToolHttpError,
    ToolPayloadError,
    ToolTimeout,
)
from agents.tools.faults import apply_fault
from agents.tools.registry import Tool, ToolContext, ToolOutput, ToolRegistry, default_registry
from core.text import storable_json, storable_text
from llm.base import Message, ToolCallRequest

logger = logging.getLogger(__name__)

TOOL_ERROR_PREFIX = "TOOL_ERROR"
# A tool's output goes into the prompt; past this it is cut (and marked) so one tool cannot flood the context.
RESULT_MAX_CHARS = 16_000
_DETAIL_MAX_CHARS = 300


@dataclass
class ToolResult:
    """The outcome of one tool call. ``content`` is exactly what the model sees (output or TOOL_ERROR text)."""

    name: str
    content: str
    ok: bool
    error_kind: ErrorKind = ""
    attempts: int = 0
    latency_ms: float = 0.0
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str = ""
    # Structured output of a successful run (``ToolOutput.data``); empty for errors and plain-text tools.
    data: dict[str, Any] = field(default_factory=dict)

    def as_message(self) -> Message:
        """The ``role: tool`` message that answers the model's tool call."""
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.content}


def run_tool_call(
    *,
    call: ToolCallRequest,
    context: ToolContext,
    enabled: list[str] | None = None,
    registry: ToolRegistry | None = None,
    record: bool = True,
) -> ToolResult:
    """Validate and run one tool call the model asked for; never raises.

    ``enabled`` limits which tools may run; None means the context agent's ``tools`` (or every
    registered tool when there is no agent). Retryable failures (timeouts, connection errors, 5xx)
    are retried with exponential backoff and jitter; 4xx and invalid arguments never are. The result
    is recorded as a ``ToolInvocation`` when the context has a session (``record=False``: the caller records
    it, with what the call led to, as the turn does an action's call with its outcome).
    """
    started = time.monotonic()
    try:
        result = _run(call=call, context=context, enabled=enabled, registry=registry or default_registry())
    except Exception as exc:  # the contract: nothing escapes to the agent loop
        logger.exception("tool registry failed on %r", call.name)
        result = ToolResult(
            name=str(call.name)[:80],
            content=f"{TOOL_ERROR_PREFIX}: the tool {str(call.name)[:80]!r} could not be run ({type(exc).__name__}: {_short(exc)}).",
            ok=False,
            error_kind="error",
        )
    result.call_id = call.id
    result.latency_ms = (time.monotonic() - started) * 1000.0
    if record:
        record_invocation(result, context)
    return result


def _run(
    *, call: ToolCallRequest, context: ToolContext, enabled: list[str] | None, registry: ToolRegistry
) -> ToolResult:
    name = str(call.name)
    tool = registry.get(name)
    allowed = enabled if enabled is not None else _agent_tools(context)
    offered = [n for n in (allowed if allowed is not None else registry.names()) if registry.get(n) is not None]
    if tool is None:
        return _failure(
            name,
            "unknown_tool",
            f"there is no tool named {name[:80]!r}. Available tools: {', '.join(offered) or 'none'}.",
        )
    if allowed is not None and name not in allowed:
        return _failure(
            name,
            "not_enabled",
            f"the tool {name!r} is not enabled for this agent. Available tools: {', '.join(offered) or 'none'}.",
        )

    raw = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
    try:
        data = storable_json(json.loads(raw)) if raw.strip() else {}  # arguments are recorded (jsonb)
    except (ValueError, RecursionError) as exc:
        return _failure(
            name,
            "invalid_arguments",
            f"invalid arguments for {name}: they are not valid JSON ({exc}). Send a JSON object.",
            arguments={"_raw": raw[:1000]},
        )
    if not isinstance(data, dict):
        return _failure(
            name,
            "invalid_arguments",
            f"invalid arguments for {name}: expected a JSON object, got {type(data).__name__}.",
            arguments={"_raw": raw[:1000]},
        )
    try:
        args = tool.args_model.model_validate(data)
    except ValidationError as exc:
        return _failure(
            name,
            "invalid_arguments",
            f"invalid arguments for {name}: {describe_validation_error(exc)}. Fix the arguments and call {name} again.",
            arguments=data,
        )
    return _execute(tool, args, context, arguments=args.model_dump(mode="json"))


def _execute(tool: Tool, args: BaseModel, context: ToolContext, *, arguments: dict[str, Any]) -> ToolResult:
    timeout = tool.effective_timeout()
    max_attempts = tool.max_attempts or settings.TOOLS_MAX_ATTEMPTS
    base_delay = float(settings.TOOLS_RETRY_BASE_DELAY)
    attempts = 0

    def attempt() -> ToolOutput:
        nonlocal attempts
        attempts += 1
        return _run_with_deadline(tool, args, context, timeout)

    retrying = Retrying(
        stop=stop_after_attempt(max_attempts),
        wait=wait_exponential_jitter(
            multiplier=base_delay, max=float(settings.TOOLS_RETRY_MAX_DELAY), jitter=base_delay
        ),
        retry=retry_if_exception(lambda exc: isinstance(exc, ToolError) and exc.retryable),
        before_sleep=lambda state: logger.info(
            "tool %s attempt %s failed (%s); retrying",
            tool.name,
            state.attempt_number,
            state.outcome.exception() if state.outcome else "",
        ),
        reraise=True,
    )
    try:
        output = retrying(attempt)
    except ToolError as exc:
        return ToolResult(
            name=tool.name,
            content=_error_text(tool, exc, attempts=attempts, timeout=timeout),
            ok=False,
            error_kind=exc.kind,
            attempts=attempts,
            arguments=arguments,
        )
    content = output.text
    ok = not content.startswith(TOOL_ERROR_PREFIX)
    return ToolResult(
        name=tool.name,
        content=content,
        ok=ok,
        error_kind="" if ok else "error",
        attempts=attempts,
        arguments=arguments,
        data=dict(output.data) if ok else {},
    )


def _run_with_deadline(tool: Tool, args: BaseModel, context: ToolContext, timeout: float) -> ToolOutput:
    """One attempt in a daemon thread; past ``timeout`` it is abandoned and ``ToolTimeout`` raised."""
    box: dict[str, Any] = {}
    done = threading.Event()
    # Outside a transaction (the runtime's case) the thread opens its own connection. Inside one (a test,
    # or a caller that holds a transaction) a new connection could not see the caller's uncommitted rows,
    # so the thread borrows the caller's connection instead.
    caller = connections[DEFAULT_DB_ALIAS]
    shared = caller if caller.in_atomic_block else None
    if shared is not None:
        shared.inc_thread_sharing()

    def target() -> None:
        try:
            if shared is not None:
                connections[DEFAULT_DB_ALIAS] = shared
            apply_fault(tool.name, timeout_s=timeout)
            box["value"] = tool.run(args, context)
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which classifies it
            box["error"] = exc
        finally:
            try:
                if shared is not None:
                    shared.dec_thread_sharing()
                else:
                    # This thread's own database connection (if the tool used one) must not leak.
                    connections.close_all()
            except Exception:
                logger.warning("releasing a tool thread's database connection failed", exc_info=True)
            done.set()

    # Daemon: a hung tool must not keep the process alive at shutdown.
    threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True).start()
    if not done.wait(timeout):
        raise ToolTimeout(f"timed out after {timeout:g} s", timeout_s=timeout)
    if "error" in box:
        raise as_tool_error(box["error"]) from box["error"]
    value = box.get("value")
    if isinstance(value, ToolOutput):
        return ToolOutput(text=_as_text(value.text), data=value.data)
    return ToolOutput(text=_as_text(value))


def as_tool_error(exc: BaseException) -> ToolError:
    """Map what a tool raised to a typed ``ToolError`` (which decides retry and error kind)."""
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, httpx.TimeoutException):
        return ToolTimeout(f"the upstream did not answer in time ({type(exc).__name__})")
    if isinstance(exc, httpx.HTTPStatusError):
        return ToolHttpError(exc.response.status_code, exc.response.reason_phrase)
    if isinstance(exc, httpx.TransportError):
        return ToolConnectionError(_short(exc) or type(exc).__name__)
    if isinstance(exc, TimeoutError):
        return ToolTimeout(f"the upstream did not answer in time ({_short(exc)})")
    if isinstance(exc, ConnectionError):
        return ToolConnectionError(_short(exc) or type(exc).__name__)
    if isinstance(exc, KeyError):
        return ToolPayloadError(f"missing field {exc}")
    if isinstance(exc, json.JSONDecodeError | ValidationError | IndexError):
        return ToolPayloadError(f"{type(exc).__name__}: {_short(exc)}")
    logger.error("tool raised an unexpected exception", exc_info=exc)
    return ToolError(f"{type(exc).__name__}: {_short(exc)}")


def _error_text(tool: Tool, exc: ToolError, *, attempts: int, timeout: float) -> str:
    name = tool.name
    tries = f" (tried {attempts} times)" if attempts > 1 else ""
    detail = _short(exc)
    if isinstance(exc, ToolTimeout):
        return (
            f"{TOOL_ERROR_PREFIX}: {name} timed out after {exc.timeout_s or timeout:g} s{tries}; {detail}. "
            "The service is slow or down: try again later or tell the user."
        )
    if isinstance(exc, ToolHttpError) and exc.status >= 500:
        return (
            f"{TOOL_ERROR_PREFIX}: {name} failed{tries}: the upstream service answered HTTP {exc.status}"
            f"{f' ({_short(exc.detail)})' if exc.detail else ''}. It is temporarily unavailable: "
            "try again later or tell the user."
        )
    if isinstance(exc, ToolHttpError):
        return (
            f"{TOOL_ERROR_PREFIX}: {name} failed: the upstream service rejected the request with HTTP {exc.status}"
            f"{f' ({_short(exc.detail)})' if exc.detail else ''}. Not retried: repeating the same call will fail "
            "again; change the arguments or tell the user."
        )
    if exc.kind == "connection":
        return f"{TOOL_ERROR_PREFIX}: {name} could not reach its service{tries} ({detail}). Try again later or tell the user."
    if exc.kind == "malformed_payload":
        return (
            f"{TOOL_ERROR_PREFIX}: {name} received a malformed response from its data source ({detail}). "
            "The result is unusable: do not guess it."
        )
    if exc.kind == "invalid_arguments":
        return f"{TOOL_ERROR_PREFIX}: {name} could not use these arguments: {detail}"
    return f"{TOOL_ERROR_PREFIX}: {name} failed unexpectedly ({detail})."


def _failure(name: str, kind: ErrorKind, message: str, *, arguments: dict[str, Any] | None = None) -> ToolResult:
    return ToolResult(
        name=name[:80],
        content=f"{TOOL_ERROR_PREFIX}: {message}",
        ok=False,
        error_kind=kind,
        attempts=0,
        arguments=arguments or {},
    )


def describe_validation_error(exc: ValidationError) -> str:
    """Pydantic's errors as one line the model can act on: ``passengers: Input should be … (got 12)``."""
    problems = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error.get("loc", ())) or "arguments"
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "extra_forbidden":
            message = "unexpected field"
        got = error.get("input")
        shown = "" if error.get("type") == "missing" or isinstance(got, dict) else f" (got {_short(got, 60)})"
        problems.append(f"{where}: {message}{shown}")
    return "; ".join(problems)


def _agent_tools(context: ToolContext) -> list[str] | None:
    if context.agent is None:
        return None
    names = context.agent.tools
    return [str(n) for n in names] if isinstance(names, list) else []


def _as_text(value: object) -> str:
    if value is None:
        text = "(the tool returned no output)"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, dict | list):
        text = json.dumps(value, default=str, ensure_ascii=False)
    else:
        text = str(value)
    if len(text) > RESULT_MAX_CHARS:
        text = text[:RESULT_MAX_CHARS] + f"\n[truncated: the result exceeded {RESULT_MAX_CHARS} characters]"
    return storable_text(text)  # a page with a NUL byte must not lose the invocation's record


def _short(value: object, limit: int = _DETAIL_MAX_CHARS) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


InvocationRecorder = Callable[[ToolResult, ToolContext], object]
_invocation_recorder: InvocationRecorder | None = None


def set_invocation_recorder(recorder: InvocationRecorder | None) -> InvocationRecorder | None:
    """Install what records each tool call of a session (the agents app installs
    ``agents.call_records.tool_invocation_save``); returns the previous recorder."""
    global _invocation_recorder
    previous, _invocation_recorder = _invocation_recorder, recorder
    return previous


def record_invocation(result: ToolResult, context: ToolContext) -> None:
    """Record the call (a ``ToolInvocation`` row); a failure here is logged, never raised (the turn goes on)."""
    recorder = _invocation_recorder
    if context.session is None or recorder is None:
        return
    try:
        recorder(result, context)
    except Exception:
        logger.exception("could not record the invocation of tool %s", result.name)
