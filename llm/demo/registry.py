"""The demo model's names and label, the reply it gives, and the registry through which other apps teach it their
domain: structured handlers (by schema) and reply handlers (in registration order, the fallbacks last).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel

from llm.base import Message, ToolCallRequest, ToolSpec

DEMO_LABEL = "demo model, not an LLM"
DEMO_MODEL_NAME = "demo"
# The first words of every default reply, so nobody mistakes it for a model's answer.
DEMO_REPLY_PREFIX = f"[{DEMO_LABEL}]"


@dataclass
class DemoReply:
    text: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)


StructuredHandler = Callable[[list[Message]], BaseModel | None]
ReplyHandler = Callable[[list[Message], list[ToolSpec] | None], DemoReply | None]
# For a structured reply (its decision first, then the reply: ``llm.provider_base.decided``): the messages of the reply
# a separate call would be asked for once ``decision`` is applied (None: not this handler's prompt).
ReplyPromptHandler = Callable[[list[Message], BaseModel], list[Message] | None]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_structured_handlers: dict[type[BaseModel], StructuredHandler] = {}
_reply_handlers: list[ReplyHandler] = []
_fallback_reply_handlers: list[ReplyHandler] = []
_reply_prompt_handlers: list[ReplyPromptHandler] = []
# The schema of the structured request being answered, for handlers registered for a base class of many.
_requested_schema: contextvars.ContextVar[type[BaseModel] | None] = contextvars.ContextVar(
    "demo_requested_schema", default=None
)


def requested_schema() -> type[BaseModel] | None:
    """The schema a structured handler is answering now (None outside one)."""
    return _requested_schema.get()


def register_structured_handler(schema: type[BaseModel], handler: StructuredHandler) -> None:
    """Answer structured requests for ``schema`` (and its subclasses) with ``handler``; replaces an earlier one."""
    with _lock:
        _structured_handlers[schema] = handler


def register_reply_handler(handler: ReplyHandler, *, fallback: bool = False) -> None:
    """Add a reply handler after the ones already registered; registering the same one twice is a no-op.
    ``fallback``: tried only after every other handler declined (a generic handler that a specific one, such
    as a workflow's own script, overrides whatever the order the apps register them in)."""
    with _lock:
        handlers = _fallback_reply_handlers if fallback else _reply_handlers
        if handler not in handlers:
            handlers.append(handler)


def register_reply_prompt_handler(handler: ReplyPromptHandler) -> None:
    """Teach the demo the reply that follows a decision (``ReplyPromptHandler``); registering twice is a no-op."""
    with _lock:
        if handler not in _reply_prompt_handlers:
            _reply_prompt_handlers.append(handler)


def reply_prompt_handlers() -> tuple[ReplyPromptHandler, ...]:
    with _lock:
        return tuple(_reply_prompt_handlers)


def unregister_structured_handler(schema: type[BaseModel]) -> None:
    with _lock:
        _structured_handlers.pop(schema, None)


def unregister_reply_handler(handler: ReplyHandler) -> None:
    with _lock:
        for handlers in (_reply_handlers, _fallback_reply_handlers):
            if handler in handlers:
                handlers.remove(handler)


def reply_handlers() -> tuple[ReplyHandler, ...]:
    """The reply handlers in the order they are tried: the registered ones, then the fallbacks."""
    with _lock:
        return (*_reply_handlers, *_fallback_reply_handlers)


def structured_handlers() -> dict[type[BaseModel], StructuredHandler]:
    """The structured handlers by the schema they were registered for (a copy)."""
    with _lock:
        return dict(_structured_handlers)


def answer_structured(handler: StructuredHandler, schema: type[BaseModel], messages: list[Message]) -> BaseModel | None:
    """``handler``'s answer to a request for ``schema``, which it reads with ``requested_schema()`` meanwhile."""
    token = _requested_schema.set(schema)
    try:
        return handler(messages)
    finally:
        _requested_schema.reset(token)


def reply_prompt_after(schema: type[BaseModel], messages: list[Message], decided: BaseModel) -> list[Message] | None:
    """The first registered ``ReplyPromptHandler``'s prompt after ``decided`` (None: none knows this prompt); the
    handlers read ``schema`` with ``requested_schema()`` meanwhile."""
    token = _requested_schema.set(schema)
    try:
        for handler in reply_prompt_handlers():
            try:
                prompt = handler(messages, decided)
            except Exception:
                logger.exception("demo reply prompt handler %r failed", handler)
                continue
            if prompt is not None:
                return prompt
        return None
    finally:
        _requested_schema.reset(token)
