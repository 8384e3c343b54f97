"""How each endpoint takes a request for structured output, learned by trying and remembered.

Servers differ in what ``response_format`` they accept:

- ``json_schema``: ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` (OpenAI, vLLM,
  Ollama ≥ 0.5, LM Studio);
- ``json_object_schema``: ``{"type": "json_object", "schema": {...}}`` (llama.cpp's servers: the schema
  becomes a grammar that constrains the output);
- ``json_object``: plain JSON mode, the schema only in the prompt (older servers and gateways).

A structured call tries them in that order and moves on only when the endpoint refuses the request with a
client error that names ``response_format`` (or the format); what worked is remembered per endpoint
(profile, base URL and model) in this process and, through a store the agents app installs, in the
database, where the admin and ``/ops/`` show it. A profile can pin a mode (``structured_output``) instead.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger(__name__)

StructuredMode = Literal["json_schema", "json_object_schema", "json_object"]
MODES: tuple[StructuredMode, ...] = ("json_schema", "json_object_schema", "json_object")
AUTO = "auto"

MODE_LABELS: dict[str, str] = {
    "json_schema": "JSON schema (response_format json_schema)",
    "json_object_schema": "JSON object constrained by a schema (llama.cpp)",
    "json_object": "JSON mode, schema in the prompt",
}

# A client error that is about the response format, not about the rest of the request.
# (Not any mention of a schema: one schema a server cannot compile must not downgrade every later call.)
_FORMAT_REFUSAL = re.compile(r"response_format|json_schema|json_object", re.IGNORECASE)


@dataclass(frozen=True)
class EndpointKey:
    profile: str
    base_url: str
    model: str


@dataclass(frozen=True)
class LearnedMode:
    mode: StructuredMode
    # Why the modes before it were given up (the endpoint's refusals, scrubbed of secrets by the caller).
    detail: str = ""


Loader = Callable[[EndpointKey], LearnedMode | None]
Saver = Callable[[EndpointKey, LearnedMode], object]

_known: dict[EndpointKey, LearnedMode] = {}
_lock = threading.Lock()
_loader: Loader | None = None
_saver: Saver | None = None


def install_store(*, load: Loader | None, save: Saver | None) -> None:
    """Where learned modes persist (the agents app installs a table); ``None`` keeps them in this process."""
    global _loader, _saver
    _loader, _saver = load, save


def forget_all() -> None:
    """Forget what this process learned (tests; a changed endpoint is re-learned on its first refusal anyway)."""
    with _lock:
        _known.clear()
        _no_tools.clear()
        _no_streamed_decisions.clear()


def known_mode(key: EndpointKey) -> LearnedMode | None:
    with _lock:
        learned = _known.get(key)
    if learned is not None or _loader is None:
        return learned
    try:
        learned = _loader(key)
    except Exception:
        logger.exception("could not read the learned structured-output mode of %s", key)
        return None
    if learned is not None:
        with _lock:
            _known[key] = learned
    return learned


def remember(key: EndpointKey, learned: LearnedMode) -> None:
    with _lock:
        if _known.get(key) == learned:
            return
        _known[key] = learned
    logger.info("endpoint %s (%s) takes structured output as %s", key.profile, key.model, learned.mode)
    if _saver is not None:
        try:
            _saver(key, learned)
        except Exception:  # remembering is an optimisation: the call it came from has its answer
            logger.exception("could not store the structured-output mode of %s", key)


def modes_to_try(*, pinned: str, supports_json_schema: bool, learned: LearnedMode | None) -> tuple[StructuredMode, ...]:
    """The formats to try, in order: the pinned one alone; else from the learned one (or the first) onwards."""
    if pinned in MODES:
        return (pinned,)
    start = MODES.index(learned.mode) if learned is not None else (0 if supports_json_schema else 1)
    return MODES[start:]


def is_format_refusal(status: int | None, message: str) -> bool:
    """A client error (a 4xx, or a 5xx that reports a request validation error) whose text names the response
    format: the endpoint does not take this format."""
    return status is not None and status != 429 and bool(_FORMAT_REFUSAL.search(message))


def response_format(mode: StructuredMode, *, name: str, schema: dict[str, object]) -> dict[str, object]:
    """The ``response_format`` request field for ``mode``."""
    if mode == "json_schema":
        # Not "strict": pydantic schemas with defaults do not meet strict mode's rules; we validate.
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": False}}
    if mode == "json_object_schema":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_object"}


def forget(key: EndpointKey) -> None:
    """Forget what this process learned for ``key`` (its stored row was deleted: learn it again)."""
    with _lock:
        _known.pop(key, None)
        _no_tools.pop(key, None)
        _no_streamed_decisions.pop(key, None)


# --- tools --------------------------------------------------------------------------------------------------
# Endpoints found to refuse a request with tools (a model served without function calling, say Ollama's
# "does not support tools"). Only *optional* tools (``ToolSpec.optional``: the hand-to-a-person tool of a
# free chat) are left out for them; a request that needs its tools fails as before. Kept in this process:
# the first refused call of each process finds it again.
_no_tools: dict[EndpointKey, float] = {}
# How long a refusal is believed (a model swapped behind the same name takes tools again after it).
NO_TOOLS_SECONDS = 3600.0
# How servers say it: Ollama "does not support tools", vLLM "tool_choice ... requires --enable-auto-tool-choice",
# OpenAI-style validators "Unrecognized request argument supplied: tools", pydantic "tools: Extra inputs ...".
_TOOLS_REFUSAL = re.compile(
    r"(does not|doesn't|do not|cannot|can't) support (tools|tool|function)"
    r"|(tools?|tool calls|function calling) (are|is) not (supported|enabled|available)"
    r"|tool_choice|(unrecognized|unsupported|unknown|extra)\b[^.]{0,60}\btools\b|\btools\b[^.]{0,30}extra inputs",
    re.IGNORECASE,
)


def _refused_recently(refusals: dict[EndpointKey, float], key: EndpointKey) -> bool:
    """Was ``key`` seen refusing within ``NO_TOOLS_SECONDS``? (An older refusal is forgotten.)"""
    with _lock:
        since = refusals.get(key)
        if since is not None and time.monotonic() - since > NO_TOOLS_SECONDS:
            del refusals[key]
            return False
        return since is not None


def refuses_tools(key: EndpointKey) -> bool:
    return _refused_recently(_no_tools, key)


def remember_refuses_tools(key: EndpointKey) -> None:
    with _lock:
        _no_tools[key] = time.monotonic()
    logger.info("endpoint %s (%s) refuses tools: optional tools are left out of its requests", key.profile, key.model)


def is_tools_refusal(status: int | None, message: str) -> bool:
    """A client error whose text names tools: the endpoint (or its model) does not take them."""
    return status is not None and status != 429 and bool(_TOOLS_REFUSAL.search(message))


# --- streamed structured output -----------------------------------------------------------------------------
# Endpoints that refused a streamed structured request (a workflow's decision inside its reply's call) with a client
# error: their workflow turns decide in a call of their own, then reply (two calls), for ``NO_TOOLS_SECONDS``.
_no_streamed_decisions: dict[EndpointKey, float] = {}


def refuses_streamed_decisions(key: EndpointKey) -> bool:
    return _refused_recently(_no_streamed_decisions, key)


def remember_refuses_streamed_decisions(key: EndpointKey, why: str) -> None:
    with _lock:
        _no_streamed_decisions[key] = time.monotonic()
    logger.info(
        "endpoint %s (%s) cannot decide inside a streamed reply (%s): its workflows decide in a call of their own",
        key.profile,
        key.model,
        why[:300],
    )
