"""``BaseProvider``: the public calls every provider shares (``complete``, ``stream``, ``structured``), made of a
subclass's two primitives, with the shared checks (timing, truncation, one repair) and one record a call.
"""

from __future__ import annotations

import logging
import time
from typing import Unpack

from core.text import storable_text
from llm.base import (
    CallContext,
    Completion,
    LLMError,
    Message,
    ReplyOptions,
    SchemaT,
    StructuredOutputError,
    ToolCallRequest,
    ToolSpec,
    TruncatedOutputError,
)
from llm.provider_base.decided import DecidedStream
from llm.provider_base.primitives import (
    TRUNCATING_FINISH_REASONS,
    OpenedStream,
    RawCompletion,
    RequestParams,
    StreamParams,
    ms_since,
)
from llm.provider_base.streaming import RecordedStream
from llm.provider_base.structured import parse_structured, repair_messages
from llm.recording import llm_call_record
from llm.redaction import redact
from llm.tokens import TokenCounter, counter_for

logger = logging.getLogger(__name__)


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
    def _request(self, messages: list[Message], **params: Unpack[RequestParams]) -> RawCompletion:
        raise NotImplementedError

    def _open_stream(self, messages: list[Message], **params: Unpack[StreamParams]) -> OpenedStream:
        raise NotImplementedError

    # --- public calls -----------------------------------------------------------------------------
    def complete(self, messages: list[Message], *, ctx: CallContext, **options: Unpack[ReplyOptions]) -> Completion:
        """One reply. Raises ``TruncatedOutputError`` when cut off, an ``LLMError`` subclass on failure."""
        params = RequestParams(**_stream_params(ctx, options))
        raw, latency_ms = self._timed_request(messages, ctx=ctx, params=params)
        completion = self._completion(messages, raw, latency_ms=latency_ms, tools=params["tools"])
        if raw.finish_reason in TRUNCATING_FINISH_REASONS:
            self._record(
                ctx, completion, outcome="truncated", error=f"reply cut off (finish reason {raw.finish_reason})"
            )
            raise TruncatedOutputError(
                f"the reply was cut off (finish reason {raw.finish_reason})", partial_text=raw.text
            )
        self._record(ctx, completion, outcome="ok")
        return completion

    def stream(self, messages: list[Message], *, ctx: CallContext, **options: Unpack[ReplyOptions]) -> RecordedStream:
        """A reply as token deltas; the request is made when iteration starts (see ``LLMProvider.stream``)."""
        return RecordedStream(self, list(messages), ctx=ctx, params=_stream_params(ctx, options))

    def stream_structured(
        self,
        messages: list[Message],
        *,
        schema: type[SchemaT],
        ctx: CallContext,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> DecidedStream[SchemaT]:
        """A structured reply streamed while it is written (``llm.provider_base.decided``): ``schema`` ends with the
        text the user reads; its decision fields come first. One call, no repair attempt."""
        params = StreamParams(
            temperature=temperature, max_tokens=max_tokens, tools=None, purpose=ctx.purpose, schema=schema
        )
        return DecidedStream(RecordedStream(self, list(messages), ctx=ctx, params=params), schema)

    def streams_decisions(self) -> bool:
        """May a workflow's decision travel inside its reply's own call (``stream_structured``)? Not unless a provider
        says its endpoint streams structured output."""
        return False

    def streamed_decision_failed(self, why: str) -> None:
        """A streamed decision of this endpoint failed in a way a second try would repeat (``streams_decisions``
        may say False for a while); nothing to remember by default."""

    def structured(
        self, messages: list[Message], *, schema: type[SchemaT], ctx: CallContext, max_tokens: int | None = None
    ) -> SchemaT:
        """A validated ``schema`` instance (temperature 0; one repair attempt) or ``StructuredOutputError``.

        Each attempt is its own model call with its own record; a failed attempt is recorded with
        outcome ``invalid_output`` (or ``truncated``) and the validation error.
        """
        attempt_messages = list(messages)
        last_error = ""
        last_text = ""
        params = RequestParams(temperature=0.0, max_tokens=max_tokens, tools=None, schema=schema, purpose=ctx.purpose)
        for attempt in (1, 2):
            raw, latency_ms = self._timed_request(attempt_messages, ctx=ctx, params=params)
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
            attempt_messages = repair_messages(messages, reply=raw.text, schema=schema, error=last_error)
        raise StructuredOutputError(
            f"no valid {schema.__name__} after a repair attempt: {last_error[:500]}",
            raw=last_text,
            validation_error=last_error,
        )

    # --- shared plumbing --------------------------------------------------------------------------
    def _timed_request(
        self, messages: list[Message], *, ctx: CallContext, params: RequestParams
    ) -> tuple[RawCompletion, float]:
        started = time.monotonic()
        tools = params["tools"]
        try:
            raw = self._request(messages, **params)
        except LLMError as exc:
            self._record_failure(ctx, messages, exc, latency_ms=ms_since(started), tools=tools)
            raise
        except Exception as exc:
            # An unexpected failure (SDK bug, malformed reply) still leaves a record and reaches the
            # caller as an LLMError, the one family callers handle.
            wrapped = LLMError(redact(f"{type(exc).__name__}: {exc}", self._secrets))
            self._record_failure(ctx, messages, wrapped, latency_ms=ms_since(started), tools=tools)
            raise wrapped from exc
        # What a model says is stored (replies, records, memories): NUL and lone surrogates cannot be.
        raw.text = storable_text(raw.text)
        raw.tool_calls = [
            ToolCallRequest(id=c.id, name=storable_text(c.name), arguments=storable_text(c.arguments))
            for c in raw.tool_calls
        ]
        return raw, ms_since(started)

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


def _stream_params(ctx: CallContext, options: ReplyOptions) -> StreamParams:
    """A reply's request keywords: the caller's options (``None`` for each left out) and the call's purpose."""
    return StreamParams(
        temperature=options.get("temperature"),
        max_tokens=options.get("max_tokens"),
        tools=options.get("tools"),
        purpose=ctx.purpose,
        schema=None,
    )
