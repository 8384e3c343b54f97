"""What every provider shares: timing, truncation checks, structured outputs with one repair, records.

A provider implements two primitives: ``_request`` (one reply, with its transport retries) and
``_open_stream`` (a reply as chunks). ``BaseProvider`` turns them into the public ``complete``,
``stream`` and ``structured`` calls, so that the demo model, the scripted fake and a real endpoint
behave alike, and every call leaves exactly one ``LLMCall`` row whatever happens.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from core.text import hold_high_surrogate, storable_text
from llm.base import (
    CallContext,
    Completion,
    LLMError,
    Message,
    SchemaT,
    StructuredOutputError,
    ToolCallRequest,
    ToolSpec,
    TruncatedOutputError,
)
from llm.recording import llm_call_record
from llm.redaction import redact
from llm.tokens import TokenCounter, counter_for

logger = logging.getLogger(__name__)

# Finish reasons that mean the reply is not whole. A stream that ends with no finish reason at all
# (the connection closed early) is treated the same way.
TRUNCATING_FINISH_REASONS = frozenset({"length", "content_filter"})
INCOMPLETE = "incomplete"


@dataclass
class RawCompletion:
    """One reply as a provider's transport returned it, before the shared checks."""

    text: str
    finish_reason: str
    model: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    retries: int = 0


@dataclass
class ToolCallDelta:
    """A piece of a streamed tool call: the first piece carries id and name, later ones more arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class StreamChunk:
    text: str = ""
    tool_call_deltas: list[ToolCallDelta] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model: str | None = None


@dataclass
class OpenedStream:
    """A stream whose request succeeded (after ``retries`` retries); chunks are read lazily."""

    chunks: Iterator[StreamChunk]
    retries: int = 0


# A JSON "\u0000" escape (not preceded by an escaped backslash): parsed, it is a NUL that PostgreSQL refuses.
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000", re.IGNORECASE)


def parse_structured(text: str, schema: type[SchemaT]) -> SchemaT:
    """Validate a reply as one JSON object of ``schema``; raise ``ValueError`` with a readable reason.

    Only a Markdown code fence around the object is tolerated: anything else (prose around it,
    a half object) is invalid, so control flow never runs on a guess.
    """
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
        body = body.strip()
    if not body:
        raise ValueError("the reply was empty; expected one JSON object")
    body = _NUL_ESCAPE.sub(r"\1\\ufffd", body)
    try:
        return schema.model_validate_json(body)
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()[:10]
        )
        raise ValueError(errors or str(exc)) from exc


# Each model class's JSON schema and its compact text, built once: pydantic builds the schema afresh on every
# ``model_json_schema()`` (about a millisecond for a workflow decision), and every structured call needs it twice
# (the instruction and ``response_format``): an eighth of a turn worker's CPU at 64 chats at once. Weak keys: a
# class made at run time (a workflow defined in the admin) is forgotten with it.
_schemas: weakref.WeakKeyDictionary[type[BaseModel], tuple[dict[str, Any], str]] = weakref.WeakKeyDictionary()
_schemas_lock = threading.Lock()


def _schema_of(schema: type[BaseModel]) -> tuple[dict[str, Any], str]:
    with _schemas_lock:
        known = _schemas.get(schema)
    if known is None:
        built = schema.model_json_schema()
        known = (built, json.dumps(built, separators=(",", ":")))
        if not _built_each_time(schema):
            with _schemas_lock:
                _schemas[schema] = known
    return known


def _built_each_time(schema: type[BaseModel]) -> bool:
    """Does ``schema`` compute a part of its JSON schema when it is built (a ``json_schema_extra`` function, of the
    model or of a field: a limit read from the settings)? Such a schema is not kept."""
    extras = [schema.model_config.get("json_schema_extra")]
    extras += [field.json_schema_extra for field in schema.model_fields.values()]
    return any(callable(extra) for extra in extras)


def json_schema_of(schema: type[BaseModel]) -> dict[str, Any]:
    """``schema.model_json_schema()``, built once per class (a copy: the caller may change it)."""
    return copy.deepcopy(_schema_of(schema)[0])


def schema_instruction(schema: type[BaseModel]) -> str:
    """The instruction that asks a model for one JSON object of ``schema`` (used by JSON mode too)."""
    return (
        "Reply with exactly one JSON object and nothing else (no prose, no code fence). "
        f"It must validate against this JSON schema:\n{_schema_of(schema)[1]}"
    )


class BaseProvider:
    """Shared behaviour of all providers. Subclasses set ``name``/``model`` and the two primitives.

    Instances hold no per-call state, so one provider may serve many threads at once.
    """

    name: str = "base"
    model: str = ""
    is_demo: bool = False

    def __init__(self, *, model: str, secrets: tuple[str, ...] = ()) -> None:
        self.model = model
        # Values to scrub from every stored or logged error text (the API key of this endpoint).
        self._secrets = secrets

    @property
    def counter(self) -> TokenCounter:
        return counter_for(self.model)

    def decides_in_reply(self) -> bool:
        """May a turn's decision travel inside its reply's own call (``LLMProvider.decides_in_reply``)? Not unless a
        provider says its endpoint takes tool calls in a streamed reply."""
        return False

    # --- primitives -------------------------------------------------------------------------------
    def _request(
        self,
        messages: list[Message],
        *,
        temperature: float | None,
        max_tokens: int | None,
        tools: list[ToolSpec] | None,
        schema: type[BaseModel] | None,
        purpose: str,
    ) -> RawCompletion:
        raise NotImplementedError

    def _open_stream(
        self,
        messages: list[Message],
        *,
        temperature: float | None,
        max_tokens: int | None,
        tools: list[ToolSpec] | None,
        purpose: str,
    ) -> OpenedStream:
        raise NotImplementedError

    # --- public calls -----------------------------------------------------------------------------
    def complete(
        self,
        messages: list[Message],
        *,
        ctx: CallContext,
        temperature: float | None = None,
        max_tokens: int | None = None,
        tools: list[ToolSpec] | None = None,
    ) -> Completion:
        """One reply. Raises ``TruncatedOutputError`` when cut off, an ``LLMError`` subclass on failure."""
        raw, latency_ms = self._timed_request(
            messages, ctx=ctx, temperature=temperature, max_tokens=max_tokens, tools=tools, schema=None
        )
        completion = self._completion(messages, raw, latency_ms=latency_ms, tools=tools)
        if raw.finish_reason in TRUNCATING_FINISH_REASONS:
            self._record(
                ctx, completion, outcome="truncated", error=f"reply cut off (finish reason {raw.finish_reason})"
            )
            raise TruncatedOutputError(
                f"the reply was cut off (finish reason {raw.finish_reason})", partial_text=raw.text
            )
        self._record(ctx, completion, outcome="ok")
        return completion

    def stream(
        self,
        messages: list[Message],
        *,
        ctx: CallContext,
        temperature: float | None = None,
        max_tokens: int | None = None,
        tools: list[ToolSpec] | None = None,
    ) -> RecordedStream:
        """A reply as token deltas; the request is made when iteration starts (see ``LLMProvider.stream``)."""
        return RecordedStream(
            self, list(messages), ctx=ctx, temperature=temperature, max_tokens=max_tokens, tools=tools
        )

    def structured(
        self,
        messages: list[Message],
        *,
        schema: type[SchemaT],
        ctx: CallContext,
        max_tokens: int | None = None,
    ) -> SchemaT:
        """A validated ``schema`` instance (temperature 0; one repair attempt) or ``StructuredOutputError``.

        Each attempt is its own model call with its own record; a failed attempt is recorded with
        outcome ``invalid_output`` (or ``truncated``) and the validation error.
        """
        attempt_messages = list(messages)
        last_error = ""
        last_text = ""
        for attempt in (1, 2):
            raw, latency_ms = self._timed_request(
                attempt_messages, ctx=ctx, temperature=0.0, max_tokens=max_tokens, tools=None, schema=schema
            )
            completion = self._completion(attempt_messages, raw, latency_ms=latency_ms, tools=None)
            last_text = raw.text
            if raw.finish_reason in TRUNCATING_FINISH_REASONS:
                last_error = f"the reply was cut off (finish reason {raw.finish_reason}); reply with a shorter object"
                self._record(ctx, completion, outcome="truncated", error=f"attempt {attempt}: {last_error}")
            else:
                try:
                    instance = parse_structured(raw.text, schema)
                except ValueError as exc:
                    last_error = str(exc)
                    self._record(
                        ctx, completion, outcome="invalid_output", error=f"attempt {attempt}: {last_error[:1500]}"
                    )
                else:
                    self._record(ctx, completion, outcome="ok")
                    return instance
            # The repair attempt shows the model what it said and why it was rejected.
            attempt_messages = [
                *messages,
                {"role": "assistant", "content": raw.text},
                {
                    "role": "user",
                    "content": (
                        f"Your reply was not a valid {schema.__name__} object: {last_error}. "
                        "Reply again with only one JSON object that fixes this."
                    ),
                },
            ]
        raise StructuredOutputError(
            f"no valid {schema.__name__} after a repair attempt: {last_error[:500]}",
            raw=last_text,
            validation_error=last_error,
        )

    # --- shared plumbing --------------------------------------------------------------------------
    def _timed_request(
        self,
        messages: list[Message],
        *,
        ctx: CallContext,
        temperature: float | None,
        max_tokens: int | None,
        tools: list[ToolSpec] | None,
        schema: type[BaseModel] | None,
    ) -> tuple[RawCompletion, float]:
        started = time.monotonic()
        try:
            raw = self._request(
                messages,
                temperature=temperature,
                max_tokens=max_tokens,
                tools=tools,
                schema=schema,
                purpose=ctx.purpose,
            )
        except LLMError as exc:
            self._record_failure(ctx, messages, exc, latency_ms=_ms_since(started), tools=tools)
            raise
        except Exception as exc:
            # An unexpected failure (SDK bug, malformed reply) still leaves a record and reaches the
            # caller as an LLMError, the one family callers handle.
            wrapped = LLMError(redact(f"{type(exc).__name__}: {exc}", self._secrets))
            self._record_failure(ctx, messages, wrapped, latency_ms=_ms_since(started), tools=tools)
            raise wrapped from exc
        # What a model says is stored (replies, records, memories): NUL and lone surrogates cannot be.
        raw.text = storable_text(raw.text)
        raw.tool_calls = [
            ToolCallRequest(id=c.id, name=storable_text(c.name), arguments=storable_text(c.arguments))
            for c in raw.tool_calls
        ]
        return raw, _ms_since(started)

    def _prompt_tokens(self, messages: list[Message], tools: list[ToolSpec] | None) -> int:
        counter = self.counter
        total = counter.count_messages(messages)
        if tools:
            total += counter.count_tools([t.as_openai() for t in tools])
        return total

    def _completion(
        self,
        messages: list[Message],
        raw: RawCompletion,
        *,
        latency_ms: float,
        tools: list[ToolSpec] | None,
        ttft_ms: float | None = None,
        counted_prompt: int | None = None,
    ) -> Completion:
        """The call's completion. Its prompt tokens: as the server reported them, else ``counted_prompt`` (the
        context builder's count of these very messages and tools), else counted here."""
        counter = self.counter
        if raw.prompt_tokens is not None:
            prompt_tokens = raw.prompt_tokens
        elif counted_prompt is not None:
            prompt_tokens = counted_prompt
        else:
            prompt_tokens = self._prompt_tokens(messages, tools)
        if raw.completion_tokens is not None:
            completion_tokens = raw.completion_tokens
        else:
            completion_tokens = counter.count(raw.text) + sum(
                counter.count(c.name) + counter.count(c.arguments) for c in raw.tool_calls
            )
        return Completion(
            text=raw.text,
            finish_reason=raw.finish_reason,
            model=raw.model or self.model,
            tool_calls=list(raw.tool_calls),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
            ttft_ms=ttft_ms,
            retries=raw.retries,
            is_demo=self.is_demo,
        )

    def _record(self, ctx: CallContext, completion: Completion, *, outcome: str, error: str = "") -> None:
        llm_call_record(
            ctx=ctx,
            provider=self.name,
            model=completion.model,
            outcome=outcome,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            latency_ms=completion.latency_ms,
            ttft_ms=completion.ttft_ms,
            retries=completion.retries,
            finish_reason=completion.finish_reason or "",
            error=redact(error, self._secrets),
        )

    def _record_failure(
        self,
        ctx: CallContext,
        messages: list[Message],
        exc: LLMError,
        *,
        latency_ms: float,
        tools: list[ToolSpec] | None,
        completion_tokens: int = 0,
        ttft_ms: float | None = None,
    ) -> None:
        text = redact(f"{type(exc).__name__}: {exc}", self._secrets)
        logger.warning(
            "LLM call failed (purpose=%s, model=%s, retries=%s): %s", ctx.purpose, self.model, exc.retries, text
        )
        llm_call_record(
            ctx=ctx,
            provider=self.name,
            model=self.model,
            outcome=exc.outcome,
            prompt_tokens=self._prompt_tokens(messages, tools),
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
            ttft_ms=ttft_ms,
            retries=exc.retries,
            error=text,
        )


class RecordedStream:
    """Iterate once for text deltas; afterwards ``completion`` holds the whole reply and its figures."""

    def __init__(
        self,
        provider: BaseProvider,
        messages: list[Message],
        *,
        ctx: CallContext,
        temperature: float | None,
        max_tokens: int | None,
        tools: list[ToolSpec] | None,
    ) -> None:
        self._provider = provider
        self._messages = messages
        self._ctx = ctx
        self._temperature = temperature
        self._max_tokens = max_tokens
        self._tools = tools
        self._started = False
        self.completion: Completion | None = None

    def __iter__(self) -> Iterator[str]:
        if self._started:
            raise RuntimeError("a reply stream can be iterated only once")
        self._started = True
        return self._run()

    def _run(self) -> Iterator[str]:
        provider = self._provider
        got = _StreamSoFar(started=time.monotonic(), model=provider.model)
        chunks: Iterator[StreamChunk] | None = None
        finished = False
        try:
            opened = provider._open_stream(
                self._messages,
                temperature=self._temperature,
                max_tokens=self._max_tokens,
                tools=self._tools,
                purpose=self._ctx.purpose,
            )
            got.retries = opened.retries
            chunks = opened.chunks
            for chunk in chunks:
                text = got.take(chunk)
                if text:
                    yield text
            if got.held:  # its second half never came
                yield got.flush_held()
            finished = True
        except GeneratorExit:
            # The consumer stopped reading (a client went away): record what was spent, then stop.
            provider._record(
                self._ctx, self._partial(got), outcome="error", error="stream abandoned by the caller before its end"
            )
            raise
        except LLMError as exc:
            self._record_failed(got, exc)
            raise
        except Exception as exc:
            raise self._record_broken(got, exc) from exc
        finally:
            close = getattr(chunks, "close", None)
            if close is not None and not finished:
                close()
        self._record_finished(got)

    def _record_failed(self, got: _StreamSoFar, exc: LLMError) -> None:
        """The provider's own error: recorded with the tokens the reply had reached."""
        exc.retries = max(exc.retries, got.retries)
        self._provider._record_failure(
            self._ctx,
            self._messages,
            exc,
            latency_ms=_ms_since(got.started),
            tools=self._tools,
            completion_tokens=self._provider.counter.count("".join(got.parts)),
            ttft_ms=got.ttft_ms,
        )

    def _record_broken(self, got: _StreamSoFar, exc: Exception) -> LLMError:
        """Any other error, recorded as an ``LLMError`` (its text redacted), which is returned to be raised."""
        provider = self._provider
        wrapped = LLMError(redact(f"{type(exc).__name__}: {exc}", provider._secrets))
        wrapped.retries = got.retries
        provider._record_failure(
            self._ctx,
            self._messages,
            wrapped,
            latency_ms=_ms_since(got.started),
            tools=self._tools,
            ttft_ms=got.ttft_ms,
        )
        return wrapped

    def _record_finished(self, got: _StreamSoFar) -> None:
        """The stream's end: the whole completion, recorded; a reply cut off raises ``TruncatedOutputError``."""
        provider, ctx = self._provider, self._ctx
        completion = self._partial(got)
        if got.completion_tokens is not None:
            completion.completion_tokens = got.completion_tokens
        self.completion = completion
        if got.finish_reason is None or got.finish_reason in TRUNCATING_FINISH_REASONS:
            reason = got.finish_reason or INCOMPLETE
            completion.finish_reason = reason
            provider._record(ctx, completion, outcome="truncated", error=f"stream ended early (finish reason {reason})")
            raise TruncatedOutputError(
                f"the streamed reply was cut off (finish reason {reason})", partial_text=completion.text
            )
        provider._record(ctx, completion, outcome="ok")

    def _partial(self, got: _StreamSoFar) -> Completion:
        tool_calls = [
            ToolCallRequest(
                id=slot["id"] or f"call_{index}",
                name=storable_text(slot["name"]),
                arguments=storable_text("".join(slot["arguments"])),
            )
            for index, slot in sorted(got.calls.items())
        ]
        raw = RawCompletion(
            text="".join(got.parts),
            finish_reason=got.finish_reason or "",
            model=got.model,
            tool_calls=tool_calls,
            prompt_tokens=got.prompt_tokens,
            retries=got.retries,
        )
        # A reply the runtime streams was built by the context builder, which counted exactly these messages
        # and tools (its sections add up to the prompt's total): no need to count them again.
        sections = self._ctx.prompt_sections
        return self._provider._completion(
            self._messages,
            raw,
            latency_ms=_ms_since(got.started),
            tools=self._tools,
            ttft_ms=got.ttft_ms,
            counted_prompt=sum(sections.values()) if sections else None,
        )


@dataclass
class _StreamSoFar:
    """What a reply stream has brought so far: its text, tool calls and figures."""

    started: float
    model: str
    ttft_ms: float | None = None
    parts: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    retries: int = 0
    held: str = ""  # a high surrogate that ended the last chunk's text (hold_high_surrogate)

    def take(self, chunk: StreamChunk) -> str:
        """Take in one chunk; the text to pass on now ("" for none)."""
        self._figures(chunk)
        for delta in chunk.tool_call_deltas:
            self._first_token()
            slot = self.calls.setdefault(delta.index, {"id": None, "name": "", "arguments": []})
            if delta.id:
                slot["id"] = delta.id
            if delta.name and delta.name != slot["name"]:
                # OpenAI sends the name once; some servers (llama-cpp-python) repeat it in every delta.
                slot["name"] += delta.name
            slot["arguments"].append(delta.arguments)  # made storable whole (_partial)
        if not chunk.text:
            return ""
        self._first_token()
        # A character's first half at the chunk's end waits for its second half in the next.
        text, self.held = hold_high_surrogate(self.held + chunk.text)
        if not text:
            return ""
        text = storable_text(text)  # shown as it is stored: no NUL, no lone surrogate
        self.parts.append(text)
        return text

    def flush_held(self) -> str:
        """The held half of a character whose second half never came, made storable."""
        self.parts.append(storable_text(self.held))
        self.held = ""
        return self.parts[-1]

    def _figures(self, chunk: StreamChunk) -> None:
        if chunk.model:
            self.model = chunk.model
        if chunk.prompt_tokens is not None:
            self.prompt_tokens = chunk.prompt_tokens
        if chunk.completion_tokens is not None:
            self.completion_tokens = chunk.completion_tokens
        if chunk.finish_reason:
            self.finish_reason = chunk.finish_reason

    def _first_token(self) -> None:
        if self.ttft_ms is None:
            self.ttft_ms = _ms_since(self.started)


def _ms_since(started: float) -> float:
    return (time.monotonic() - started) * 1000.0
