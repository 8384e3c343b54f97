"""Streamed replies: ``RecordedStream`` reads a provider's ``_open_stream`` chunks, passes their text on as it comes,
joins the tool calls, and leaves one record whatever happens (finished, cut off, failed, or abandoned by the reader).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.text import hold_high_surrogate, storable_text
from llm.base import CallContext, Completion, LLMError, Message, ToolCallRequest, TruncatedOutputError
from llm.provider_base.primitives import (
    INCOMPLETE,
    TRUNCATING_FINISH_REASONS,
    RawCompletion,
    StreamChunk,
    StreamParams,
    ms_since,
)
from llm.redaction import redact

# The finish reason recorded for a reply its caller ended on purpose (``RecordedStream.stop``).
STOPPED = "stopped"

if TYPE_CHECKING:
    from llm.provider_base.provider import BaseProvider


class RecordedStream:
    """Iterate once for text deltas; afterwards ``completion`` holds the whole reply and its figures."""

    def __init__(
        self, provider: BaseProvider, messages: list[Message], *, ctx: CallContext, params: StreamParams
    ) -> None:
        self._provider = provider
        self._messages = messages
        self._ctx = ctx
        self._params = params
        self._tools = params["tools"]
        self._started = False
        self._stopped = False
        self._iterator: Iterator[str] | None = None
        self.completion: Completion | None = None

    def __iter__(self) -> Iterator[str]:
        if self._started:
            raise RuntimeError("a reply stream can be iterated only once")
        self._started = True
        self._iterator = self._run()
        return self._iterator

    def stop(self) -> None:
        """End the reply here, on purpose (what was read is all the caller needs): recorded with finish reason
        "stopped", not as a failure; the connection is closed."""
        self._stopped = True
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()

    def _run(self) -> Iterator[str]:
        provider = self._provider
        got = _StreamSoFar(started=time.monotonic(), model=provider.model)
        chunks: Iterator[StreamChunk] | None = None
        finished = False
        try:
            opened = provider._open_stream(self._messages, **self._params)
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
            # The consumer stopped reading: on purpose (``stop``), or a client went away. What was spent is recorded.
            if self._stopped:
                got.finish_reason = STOPPED
                self.completion = self._partial(got)
                provider._record(self._ctx, self.completion, outcome="ok")
            else:
                provider._record(
                    self._ctx,
                    self._partial(got),
                    outcome="error",
                    error="stream abandoned by the caller before its end",
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
            latency_ms=ms_since(got.started),
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
            latency_ms=ms_since(got.started),
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
            latency_ms=ms_since(got.started),
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
            self.ttft_ms = ms_since(self.started)
