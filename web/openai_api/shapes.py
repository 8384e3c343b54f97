"""The OpenAI chat-completions protocol as this door reads and writes it: a request checked into what the turn
services take (``CompletionRequest``), and the bodies, stream chunks and errors the official SDKs parse.

What a request may hold: ``model`` (an agent's slug), ``messages`` (``system`` and ``developer`` messages are
left out: the agent has its own instructions; then the person's and the agent's messages in turn, the person's
last), ``stream``, ``stream_options.include_usage``, ``metadata.session_id``. Sampling parameters (``temperature``,
``max_tokens``, ...) are accepted and left to the agent's own settings; client-side ``tools`` are left out (the
agent runs its own), a ``tool_choice`` that requires one, ``n`` above 1 and ``tool`` messages are refused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.models import Agent
from agents.selectors import active_agent
from orchestrator.conversations import Exchange, reply_shown
from orchestrator.runtime import MessageRejected, validate_message

ROLES = ("system", "developer", "user", "assistant")
LEFT_OUT_ROLES = ("system", "developer")
SESSION_HEADER = "X-Session-Id"
# OpenAI's error types, by HTTP status (its SDKs raise one exception class per status).
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}


class OpenAIError(Exception):
    """A request refused by this door, answered in OpenAI's error shape."""

    def __init__(self, message: str, *, status: int = 400, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


@dataclass
class CompletionRequest:
    agent: Agent
    history: list[Exchange]
    message: str
    stream: bool = False
    include_usage: bool = False
    session_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def completion_request(data: Any, *, headers: Mapping[str, str]) -> CompletionRequest:
    """``data`` (the parsed JSON body) checked, or ``OpenAIError`` saying which parameter is wrong and why."""
    if not isinstance(data, dict):
        raise OpenAIError("The request body must be a JSON object.", code="invalid_body")
    agent = _agent(data.get("model"))
    history, message = _conversation(data.get("messages"))
    stream = data.get("stream", False)
    if not isinstance(stream, bool | None):
        raise OpenAIError("stream must be true or false.", code="invalid_type", param="stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool | None):
        raise OpenAIError('stream_options must be an object like {"include_usage": true}.', param="stream_options")
    n = data.get("n")
    if n not in (None, 1):
        raise OpenAIError("Only one choice is answered (n must be 1).", code="unsupported_value", param="n")
    # Client-side tools are left out (the agent runs its own): chat UIs such as Open WebUI offer theirs with every
    # message. Only a request that requires the model to call one of them is refused.
    choice = data.get("tool_choice")
    if (data.get("tools") or data.get("functions")) and (choice == "required" or isinstance(choice, dict)):
        raise OpenAIError(
            "A client-side tool cannot be required: the agent runs its own tools.",
            code="unsupported_parameter",
            param="tool_choice",
        )
    return CompletionRequest(
        agent=agent,
        history=history,
        message=message,
        stream=bool(stream),
        include_usage=bool(options.get("include_usage")),
        session_id=_session_id(data.get("metadata"), headers),
    )


def _agent(model: Any) -> Agent:
    if model is None or model == "":
        raise OpenAIError("model is required: an agent's slug (GET /v1/models lists them).", param="model")
    if not isinstance(model, str):
        raise OpenAIError("model must be a string: an agent's slug.", code="invalid_type", param="model")
    agent = active_agent(model) if "\x00" not in model and len(model) <= 200 else None
    if agent is None:
        raise OpenAIError(
            f"The model {model[:200]!r} does not exist or you do not have access to it (GET /v1/models lists them).",
            status=404,
            code="model_not_found",
            param="model",
        )
    return agent


def _conversation(messages: Any) -> tuple[list[Exchange], str]:
    """The person's and the agent's messages, paired, and the person's last message."""
    if not isinstance(messages, list):
        raise OpenAIError("messages must be a list of messages.", code="invalid_type", param="messages")
    said: list[tuple[str, str]] = []
    for i, item in enumerate(messages):
        if not isinstance(item, dict):
            raise OpenAIError("Each message must be an object.", code="invalid_type", param=f"messages[{i}]")
        role = item.get("role")
        if role not in ROLES:
            raise OpenAIError(
                f"The role {str(role)[:40]!r} is not accepted here: send user and assistant messages (system and "
                "developer messages are left out; the agent runs its own tools).",
                code="invalid_role",
                param=f"messages[{i}].role",
            )
        if item.get("tool_calls") or item.get("function_call"):
            raise OpenAIError(
                "Tool calls are the agent's own: a message cannot bring them.",
                code="unsupported_parameter",
                param=f"messages[{i}].tool_calls",
            )
        text = _text(item.get("content"), f"messages[{i}].content", required=role == "user")
        if role not in LEFT_OUT_ROLES:
            said.append((role, text))
    if not said:
        raise OpenAIError("messages must hold at least one user message.", code="empty_messages", param="messages")
    return _paired(said)


def _paired(said: list[tuple[str, str]]) -> tuple[list[Exchange], str]:
    for i, (role, _) in enumerate(said):
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected:
            raise OpenAIError(
                "The user's and the assistant's messages must take turns, beginning and ending with the user's "
                f"(message {i + 1} of the conversation, leaving system messages out, is the {role}'s).",
                code="invalid_conversation",
                param="messages",
            )
    if said[-1][0] != "user":
        raise OpenAIError("The last message must be the user's.", code="invalid_conversation", param="messages")
    for i, (role, text) in enumerate(said):
        if role == "user":
            _checked(text, f"messages (user message {i // 2 + 1})")
    history = [Exchange(user=said[i][1], assistant=said[i + 1][1]) for i in range(0, len(said) - 1, 2)]
    return history, said[-1][1]


def _text(content: Any, param: str, *, required: bool) -> str:
    """A message's text: a string, or text parts (``[{"type": "text", "text": ...}]``) joined."""
    if content is None and not required:
        return ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list) and content:
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError("Only text parts are accepted in a message.", code="unsupported_content", param=param)
            texts.append(part["text"])
        text = "\n".join(texts)
    else:
        raise OpenAIError("A message's content must be text.", code="invalid_type", param=param)
    if "\x00" in text:
        raise OpenAIError("The message contains NUL (\\x00) characters.", code="nul_bytes", param=param)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise OpenAIError("The message holds characters that are not valid Unicode text.", param=param) from None
    return text


def _checked(text: str, param: str) -> None:
    """The rules of every door for a person's message (``validate_message``): empty, too long."""
    try:
        validate_message(text)
    except MessageRejected as exc:
        raise OpenAIError(exc.message, status=exc.status, code=exc.code, param=param) from None


def _session_id(metadata: Any, headers: Mapping[str, str]) -> str | None:
    if metadata is not None and not isinstance(metadata, dict):
        raise OpenAIError("metadata must be an object.", code="invalid_type", param="metadata")
    named = (metadata or {}).get("session_id")
    header = (headers.get(SESSION_HEADER) or "").strip() or None
    if named is not None and not isinstance(named, str):
        raise OpenAIError("metadata.session_id must be a string.", code="invalid_type", param="metadata.session_id")
    if named and header and named != header:
        raise OpenAIError(
            f"The {SESSION_HEADER} header and metadata.session_id name different sessions.", param="metadata.session_id"
        )
    return named or header


# --- answers -------------------------------------------------------------------------------------------------
def completion_id(turn_id: int) -> str:
    return f"chatcmpl-turn-{turn_id}"


def usage_of(composition: Mapping[str, Any] | None, prompt_tokens: int) -> dict[str, int]:
    """The turn's tokens, from its record of its model calls (every call: decisions, tools, the reply)."""
    calls = (composition or {}).get("calls") or {}
    prompt = int(calls.get("prompt_tokens") or prompt_tokens or 0)
    completion = int(calls.get("completion_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(
    *, turn_id: int, model: str, reply: str, truncated: bool, usage: dict[str, int], session_id: str
) -> dict[str, Any]:
    """A whole answer: a ``chat.completion`` (with the session it is in, for the client to name next time)."""
    return {
        "id": completion_id(turn_id),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply, "refusal": None},
                "finish_reason": "length" if truncated else "stop",
                "logprobs": None,
            }
        ],
        "usage": usage,
        "system_fingerprint": None,
        "session_id": session_id,
    }


def model_entry(agent: Agent) -> dict[str, Any]:
    return {
        "id": agent.slug,
        "object": "model",
        "created": int(agent.created_at.timestamp()) if getattr(agent, "created_at", None) else 0,
        "owned_by": "agents",
        "name": agent.name,
        "description": agent.description,
    }


def _sse(payload: Mapping[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, default=str)
    return f"data: {data}\n\n".encode()


class ChunkWriter:
    """A turn's events (``orchestrator.context.TurnEvent``) as ``chat.completion.chunk`` server-sent events: the
    role first, each delta of the reply, what the final reply adds to what was streamed, the finish reason, the
    usage when asked, and ``[DONE]``. A failed turn ends with an error in OpenAI's shape, which the SDKs raise."""

    def __init__(self, *, model: str, session_id: str, include_usage: bool, usage_for: Any) -> None:
        self.model = model
        self.session_id = session_id
        self.include_usage = include_usage
        # ``usage_for(turn_id)``: the usage of a finished turn (a read of the database).
        self.usage_for = usage_for
        self.created = int(time.time())
        self.turn_id = 0
        self.sent = ""
        self.started = False
        self.ended = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse(
            {
                "id": completion_id(self.turn_id),
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
                "session_id": self.session_id,
            }
        )

    def _start(self, event: Mapping[str, Any]) -> Iterator[bytes]:
        if not self.started:
            self.started = True
            self.turn_id = int(event.get("turn_id") or 0)
            yield self._chunk({"role": "assistant", "content": ""})

    def feed(self, event: Mapping[str, Any], *, usage: dict[str, int] | None = None) -> Iterator[bytes]:
        """The chunks of one event (none for the events OpenAI's protocol has no place for: state, tools).
        ``usage``: the finished turn's, read ahead by a caller that may not read the database here (ASGI)."""
        if self.ended:
            return
        kind = event.get("type")
        if kind == "turn" and not self.started:
            yield from self._start(event)
        elif kind == "delta" and event.get("text"):
            yield from self._start(event)
            self.sent += str(event["text"])
            yield self._chunk({"content": str(event["text"])})
        elif kind == "done":
            yield from self._start(event)
            yield from self._done(event, usage)
        elif kind == "error":
            self.ended = True
            status = 502 if str(event.get("code") or "").startswith("llm_") else 500
            message = str(event.get("message") or "The reply failed.")
            yield _sse(
                {"error": {"message": message, "type": error_type(status), "param": None, "code": event.get("code")}}
            )

    def _done(self, event: Mapping[str, Any], usage: dict[str, int] | None) -> Iterator[bytes]:
        self.ended = True
        self.turn_id = int(event.get("turn_id") or self.turn_id)
        reply = reply_shown(str(event.get("reply") or ""), with_person=event.get("status") == "needs_human")
        # The reply as saved is what the client must hold (its next request resends it): what the stream did not
        # carry of it follows; a reply that took another shape than its deltas is sent whole after them.
        rest = reply[len(self.sent) :] if reply.startswith(self.sent) else "\n\n" + reply
        if rest.strip():
            yield self._chunk({"content": rest})
        yield self._chunk({}, finish="length" if event.get("truncated") else "stop")
        if self.include_usage:
            if usage is None:
                usage = self.usage_for(self.turn_id) if self.turn_id else usage_of(None, 0)
            yield _sse(
                {
                    "id": completion_id(self.turn_id),
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": usage,
                }
            )
        yield _sse("[DONE]")

    def closing(self) -> Iterator[bytes]:
        """After the last event: an end for a stream that had none (its events stopped without a done)."""
        if not self.ended:
            self.ended = True
            yield _sse(
                {"error": {"message": "The reply ended early.", "type": "server_error", "param": None, "code": None}}
            )
