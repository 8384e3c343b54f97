"""The provider interface every model call goes through, its data types and its errors.

Three implementations: ``openai_compat.OpenAICompatibleProvider`` (any OpenAI-compatible
endpoint), ``demo.DemoModel`` (offline, deterministic, labelled "demo model, not an LLM") and
``scripted.ScriptedProvider`` (tests). ``llm.providers.get_provider`` picks one.

Every call takes a ``CallContext`` saying why it is made (purpose) and for whom (agent, session,
turn, prompt sections), and leaves one ``LLMCall`` row behind, whatever the outcome.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict, TypeVar, Unpack

from django.core.exceptions import ImproperlyConfigured
from pydantic import BaseModel

# A chat message in the OpenAI wire format: {"role": ..., "content": ..., ["tool_calls"|"tool_call_id"|"name"]}.
Message = dict[str, Any]

Purpose = Literal["reply", "summarize", "relevance", "query", "extract", "route", "slots", "other"]
Outcome = Literal[
    "ok",
    "timeout",
    "rate_limited",
    "server_error",
    "client_error",
    "connection_error",
    "invalid_output",
    "truncated",
    "error",
]

SchemaT = TypeVar("SchemaT", bound=BaseModel)


@dataclass(frozen=True)
class CallContext:
    """Why and for whom a model call is made; stored on its ``LLMCall`` record."""

    purpose: Purpose = "reply"
    agent_id: int | None = None
    session_id: Any = None  # ChatSession primary key (UUID)
    turn_id: int | None = None
    # Tokens per prompt section, as counted by the context builder ({"system": 120, "memories": 300, ...}).
    prompt_sections: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: name, description and the JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    # The model must call this tool now (``tool_choice``): a workflow's action state, whose step is the call.
    forced: bool = False
    # Offered where the endpoint takes tools, left out where it refuses them (``HANDOFF_TOOL``).
    optional: bool = False

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


# Offered in a free chat's replies (an agent with no tools of its own): the model calls it when the user asks for
# a person, and the turn hands the chat to one. Asking for a person is then a structured outcome in every agent:
# a workflow's decision has ``wants_person``, an agent with tools is routed (``agents.routing``).
HANDOFF_TOOL = ToolSpec(
    name="hand_to_person",
    description=(
        "Hand this conversation to a person on the team. Call it only when the user asks to talk to a human "
        "(a person, an agent, an operator) or needs something only a person may do."
    ),
    parameters={
        "type": "object",
        "properties": {"reason": {"type": "string", "description": "why, in a few words"}},
        "required": [],
    },
    optional=True,
)


@dataclass(frozen=True)
class ToolCallRequest:
    """A tool call the model asked for; ``arguments`` is the raw JSON text, validated by the tool registry."""

    id: str
    name: str
    arguments: str


@dataclass
class Completion:
    text: str
    finish_reason: str
    model: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    retries: int = 0
    is_demo: bool = False


class ReplyOptions(TypedDict, total=False):
    """The keywords a reply is asked with (``complete``, ``stream``); one left out is ``None`` (not sent)."""

    temperature: float | None
    max_tokens: int | None
    tools: list[ToolSpec] | None


class ReplyStream(Protocol):
    """Text deltas as they arrive; ``completion`` is set once the iterator is exhausted."""

    completion: Completion | None

    def __iter__(self) -> Iterator[str]: ...


class LLMProvider(Protocol):
    name: str  # "openai", "demo", "scripted"
    model: str
    is_demo: bool

    def complete(self, messages: list[Message], *, ctx: CallContext, **options: Unpack[ReplyOptions]) -> Completion:
        """One reply. Raises ``TruncatedOutputError`` when cut off, an ``LLMError`` subclass on failure."""
        ...

    def stream(self, messages: list[Message], *, ctx: CallContext, **options: Unpack[ReplyOptions]) -> ReplyStream:
        """A reply as token deltas; time to first token is measured and recorded.

        The request is made when iteration starts, so every error (``LLMError`` subclasses) is raised
        from the iteration. Streamed tool-call deltas are joined into ``completion.tool_calls``. A reply
        cut off by the token limit raises ``TruncatedOutputError`` at the end of the iteration.
        """
        ...

    def structured(
        self, messages: list[Message], *, schema: type[SchemaT], ctx: CallContext, max_tokens: int | None = None
    ) -> SchemaT:
        """A validated instance of ``schema`` (temperature 0, one repair attempt) or ``StructuredOutputError``."""
        ...

    def decides_in_reply(self) -> bool:
        """May a turn's decision travel inside its reply's own streamed call (the tools and the hand-off offered
        as functions; plain text is the answer)? False: the turn decides in a structured call of its own first."""
        ...

    def streams_decisions(self) -> bool:
        """May a workflow's decision travel inside its reply's own call: one structured output, the decision's
        fields first and the reply's text streamed while it is written (``stream_structured``)? False: the workflow
        decides in a structured call of its own, then the reply."""
        ...

    def stream_structured(
        self,
        messages: list[Message],
        *,
        schema: type[SchemaT],
        ctx: CallContext,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> Any:
        """A ``DecidedStream`` of ``schema`` (``llm.provider_base.decided``): its decision, then its reply's deltas."""
        ...


class LLMError(Exception):
    """Base of every error a provider raises. ``outcome`` is what the call record stores."""

    outcome: Outcome = "error"
    retryable: bool = False
    # Set by the provider: how many times the request was retried before this error was raised.
    retries: int = 0
    # Seconds the server asked us to wait (Retry-After), when it said so.
    retry_after: float | None = None
    # The HTTP status the endpoint answered with, when it answered.
    status: int | None = None


class LLMTimeout(LLMError):
    outcome = "timeout"
    retryable = True


class LLMConnectionError(LLMError):
    outcome = "connection_error"
    retryable = True


class LLMRateLimited(LLMError):
    outcome = "rate_limited"
    retryable = True


class LLMServerError(LLMError):
    outcome = "server_error"
    retryable = True


class LLMConfigurationError(LLMError, ImproperlyConfigured):
    """The endpoint profile named by an agent is missing or incomplete: a deployment problem, not a model one."""


class LLMClientError(LLMError):
    """A 4xx other than 429: the request is wrong; never retried."""

    outcome = "client_error"


class TruncatedOutputError(LLMError):
    """The reply hit the token limit (finish reason ``length``) or ended early: never treated as complete."""

    outcome = "truncated"

    def __init__(self, message: str, *, partial_text: str = "") -> None:
        super().__init__(message)
        self.partial_text = partial_text


class StructuredOutputError(LLMError):
    """The model did not produce a valid instance of the schema, even after one repair attempt."""

    outcome = "invalid_output"

    def __init__(self, message: str, *, raw: str = "", validation_error: str = "") -> None:
        super().__init__(message)
        self.raw = raw
        self.validation_error = validation_error
