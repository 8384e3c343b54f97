"""Any OpenAI-compatible chat endpoint (OpenAI, Ollama, vLLM, llama.cpp server, LM Studio, gateways).

Retries are ours, not the SDK's: the SDK client is built with ``max_retries=0`` because it would
also retry 408 and 409 (and obey an ``x-should-retry`` header), and its retries cannot be counted.
Here only 429, 5xx, timeouts and connection errors are retried, with exponential backoff and
jitter, honouring ``Retry-After``; each retry is counted on the call's record.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar, Unpack

import httpx2
import openai

from llm.base import (
    LLMClientError,
    LLMConnectionError,
    LLMError,
    LLMRateLimited,
    LLMServerError,
    LLMTimeout,
    Message,
    ToolCallRequest,
)
from llm.capabilities import (
    MODES,
    EndpointKey,
    LearnedMode,
    StructuredMode,
    is_format_refusal,
    is_tools_refusal,
    known_mode,
    modes_to_try,
    refuses_streamed_decisions,
    refuses_tools,
    remember,
    remember_refuses_streamed_decisions,
    remember_refuses_tools,
    response_format,
)
from llm.profiles import EndpointProfile
from llm.provider_base import BaseProvider, OpenedStream, RawCompletion, StreamChunk, ToolCallDelta
from llm.provider_base.primitives import RequestParams, StreamParams
from llm.provider_base.structured import json_schema_of, schema_instruction
from llm.redaction import redact

logger = logging.getLogger(__name__)

T = TypeVar("T")

_clients: dict[tuple[str, ...], openai.OpenAI] = {}
# A 5xx whose body is a request validation error (FastAPI/pydantic wording).
_REQUEST_VALIDATION = re.compile(r"validation error|literal_error|Input should be", re.IGNORECASE)
_clients_lock = threading.Lock()
# Endpoints that need no key (Ollama, llama.cpp) still need a non-empty one for the SDK.
_NO_KEY = "not-needed"


def client_for(profile: EndpointProfile, api_key: str) -> openai.OpenAI:
    """One SDK client (and its connection pool) per profile and key, shared by all threads."""
    key_digest = hashlib.sha256(api_key.encode()).hexdigest()[:16]
    cache_key = (profile.name, profile.base_url, key_digest, str(profile.connect_timeout), str(profile.read_timeout))
    with _clients_lock:
        client = _clients.get(cache_key)
        if client is None:
            client = openai.OpenAI(
                api_key=api_key or _NO_KEY,
                base_url=profile.base_url,
                timeout=openai.Timeout(
                    profile.read_timeout,
                    connect=profile.connect_timeout,
                    read=profile.read_timeout,
                    write=profile.read_timeout,
                    pool=profile.connect_timeout,
                ),
                max_retries=0,
            )
            _clients[cache_key] = client
        return client


def parse_retry_after(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), else ``None``."""
    if headers is None:
        return None
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / divisor)
        except ValueError:
            pass
        parsed = email.utils.parsedate_to_datetime(value) if header == "retry-after" else None
        if parsed is not None:
            return max(0.0, parsed.timestamp() - time.time())
    return None


def backoff_delay(attempt: int, *, base: float, cap: float, retry_after: float | None = None) -> float:
    """How long to wait before retry number ``attempt + 1``.

    The server's Retry-After wins when given. Otherwise exponential (base * 2**attempt, capped) with
    "equal jitter": a random point in the upper half, so clients that failed together spread out
    without any of them retrying at once.
    """
    if retry_after is not None:
        return retry_after
    ceiling = min(cap, base * (2**attempt))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


class OpenAICompatibleProvider(BaseProvider):
    name = "openai"

    def __init__(
        self,
        *,
        profile: EndpointProfile,
        model: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.profile = profile
        self._api_key = profile.api_key()
        super().__init__(model=model or profile.model, secrets=(self._api_key,) if self._api_key else ())
        self._client = client_for(profile, self._api_key)
        # Injectable so tests can see the waits (Retry-After honoured) without waiting them.
        self._sleep = sleep

    def decides_in_reply(self) -> bool:
        """An OpenAI-compatible endpoint takes tools in a streamed call unless it was seen refusing them (then the
        turn decides in a structured call of its own, as before: ``llm.capabilities.refuses_tools``)."""
        return not refuses_tools(self._key())

    def streams_decisions(self) -> bool:
        """An OpenAI-compatible endpoint streams structured output (in the format it takes, ``llm.capabilities``)
        unless its streamed decision was seen failing (``streamed_decision_failed``)."""
        return not refuses_streamed_decisions(self._key())

    def streamed_decision_failed(self, why: str) -> None:
        """Its streamed decision failed in a way a second try would repeat: decide in a call of its own for a while."""
        remember_refuses_streamed_decisions(self._key(), self._scrub(why))

    def _key(self) -> EndpointKey:
        return EndpointKey(profile=self.profile.name, base_url=self.profile.base_url, model=self.model)

    # --- transport ----------------------------------------------------------------------------------
    def _with_retries(self, send: Callable[[], T]) -> tuple[T, int]:
        attempt = 0
        while True:
            try:
                return send(), attempt
            except (openai.OpenAIError, httpx2.HTTPError) as exc:
                error = self._translate(exc)
                cause: BaseException = exc
            error.retries = attempt
            if not error.retryable or attempt >= self.profile.max_retries:
                raise error from cause
            if error.retry_after is not None and error.retry_after > self.profile.max_retry_after:
                # Waiting minutes would hold a web thread; fail now and let the caller degrade.
                raise error from cause
            delay = backoff_delay(
                attempt,
                base=self.profile.retry_base_delay,
                cap=self.profile.retry_max_delay,
                retry_after=error.retry_after,
            )
            logger.info(
                "LLM call to %s failed (%s); retry %d of %d in %.2fs",
                self.profile.name,
                error.outcome,
                attempt + 1,
                self.profile.max_retries,
                delay,
            )
            self._sleep(delay)
            attempt += 1

    def _translate(self, exc: BaseException) -> LLMError:
        """Map SDK and HTTP errors onto our error family, with secrets scrubbed from the message."""
        error: LLMError
        if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException):
            error = LLMTimeout(
                f"no answer within the timeout (connect {self.profile.connect_timeout}s, "
                f"read {self.profile.read_timeout}s)"
            )
        elif isinstance(exc, openai.APIConnectionError | httpx2.TransportError):
            error = LLMConnectionError(self._scrub(f"cannot reach {self.profile.base_url}: {exc}"))
        elif isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            message = f"HTTP {status}: {exc.message}"
            try:
                body = exc.response.text[:800]
            except Exception:  # noqa: BLE001 - a streamed body that cannot be read: the status says enough
                body = ""
            if body and body not in message:
                # The SDK's message leaves out bodies of other shapes (FastAPI's {"detail": [...]}, plain text),
                # where a server says what it refused (which response_format, which parameter).
                message += f" ({body})"
            message = self._scrub(message)
            if status == 429:
                error = LLMRateLimited(message)
            elif status >= 500 and _REQUEST_VALIDATION.search(message):
                # A server that reports a request it could not validate as a 5xx (llama-cpp-python 0.3's
                # server does, for a response_format it does not know): the request is wrong, not the server.
                error = LLMClientError(message)
            elif status >= 500:
                error = LLMServerError(message)
            else:
                # 400, 401, 403, 404, 408, 409, 422…: the request itself is wrong; retrying repeats it.
                error = LLMClientError(message)
            error.retry_after = parse_retry_after(exc.response.headers)
            error.status = status
        else:
            error = LLMError(self._scrub(f"{type(exc).__name__}: {exc}"))
        return error

    def _scrub(self, text: str) -> str:
        return redact(text, self._secrets)

    def _params(
        self, messages: list[Message], asked: RequestParams, mode: StructuredMode | None = None
    ) -> dict[str, Any]:
        """The SDK's request keywords for ``asked``; a structured request's ``response_format`` in ``mode``."""
        temperature, max_tokens = asked["temperature"], asked["max_tokens"]
        tools, schema = asked["tools"], asked["schema"]
        params: dict[str, Any] = {"model": self.model, "messages": messages}
        if temperature is not None:
            params["temperature"] = temperature
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        if tools:
            params["tools"] = [tool.as_openai() for tool in tools]
            forced = next((tool.name for tool in tools if tool.forced), None)
            if forced is not None:
                params["tool_choice"] = {"type": "function", "function": {"name": forced}}
        if schema is not None:
            # The schema is in the prompt whatever the format: plain JSON mode has nothing else to go by.
            params["messages"] = _with_instruction(messages, schema_instruction(schema))
            params["response_format"] = response_format(
                mode or "json_schema", name=schema.__name__, schema=json_schema_of(schema)
            )
        return params

    def _request(self, messages: list[Message], **params: Unpack[RequestParams]) -> RawCompletion:
        if params["schema"] is not None:
            response, retries = self._structured_request(messages, {**params, "tools": None})
        else:
            response, retries = self._create_with_tools(messages, params, stream=False)
        if not response.choices:
            error = LLMError("the endpoint answered with no choices")
            error.retries = retries
            raise error
        choice = response.choices[0]
        tool_calls = [
            ToolCallRequest(id=call.id, name=call.function.name, arguments=call.function.arguments or "")
            for call in (choice.message.tool_calls or [])
            if getattr(call, "function", None) is not None
        ]
        usage = response.usage
        return RawCompletion(
            text=choice.message.content or "",
            finish_reason=choice.finish_reason or "",
            model=response.model or self.model,
            tool_calls=tool_calls,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            retries=retries,
        )

    def _structured_request(
        self, messages: list[Message], asked: RequestParams, *, stream: bool = False
    ) -> tuple[Any, int]:
        """Ask in the format this endpoint is known to take; on a refusal of the format, the next one
        (``llm.capabilities``). What worked is remembered for the endpoint. ``stream``: a streamed reply
        (``stream_structured``), opened the same way."""
        key = self._key()
        learned = known_mode(key)
        modes = modes_to_try(
            pinned=self.profile.structured_output,
            supports_json_schema=self.profile.supports_json_schema,
            learned=learned,
        )
        refusals: list[str] = []
        for index, mode in enumerate(modes):
            params = self._params(messages, asked, mode)
            send: Callable[[], Any] = partial(self._client.chat.completions.create, **params)
            if stream:
                send = partial(_open_raw_stream, self._client, self._streamed(params))
            try:
                response, retries = self._with_retries(send)
            except LLMClientError as exc:
                if index + 1 < len(modes) and is_format_refusal(exc.status, str(exc)):
                    logger.info("endpoint %s refused response_format %s: %s", self.profile.name, mode, exc)
                    refusals.append(f"{mode}: {str(exc)[:300]}")
                    continue
                raise
            if self.profile.structured_output not in MODES and (learned is None or learned.mode != mode):
                remember(key, LearnedMode(mode=mode, detail=self._scrub("; ".join(refusals))))
            return response, retries
        raise AssertionError("unreachable: the last mode's refusal is raised")

    def _open_stream(self, messages: list[Message], **params: Unpack[StreamParams]) -> OpenedStream:
        # Only opening the stream is retried: once deltas have reached the caller, a retry would repeat them.
        if params["schema"] is not None:
            raw, retries = self._structured_request(messages, {**params, "tools": None}, stream=True)
        else:
            raw, retries = self._create_with_tools(messages, params, stream=True)
        return OpenedStream(chunks=self._chunks(raw), retries=retries)

    def _streamed(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` asking for a streamed reply (with its usage, where the profile says the endpoint sends it)."""
        params["stream"] = True
        if self.profile.stream_usage:
            params["stream_options"] = {"include_usage": True}
        return params

    def _create_with_tools(self, messages: list[Message], asked: RequestParams, *, stream: bool) -> tuple[Any, int]:
        """One completion request, with no schema (retried as ``_with_retries`` says). Optional tools
        (``ToolSpec.optional``) are left out for an endpoint known to refuse tools; a refusal that names tools,
        when every tool offered was optional, is remembered and the request made again without them."""
        key = self._key()
        tools = asked["tools"]
        optional_only = bool(tools) and all(tool.optional for tool in tools or [])
        if optional_only and refuses_tools(key):
            tools = None
        while True:
            params = self._params(messages, {**asked, "tools": tools, "schema": None})
            send: Callable[[], Any] = partial(self._client.chat.completions.create, **params)
            if stream:
                send = partial(_open_raw_stream, self._client, self._streamed(params))
            try:
                return self._with_retries(send)
            except LLMClientError as exc:
                if not (tools and optional_only and is_tools_refusal(exc.status, str(exc))):
                    raise
                logger.info("endpoint %s refused tools; asking again without them: %s", self.profile.name, exc)
                remember_refuses_tools(key)
                tools = None

    def _chunks(self, raw: RawStream) -> Iterator[StreamChunk]:
        """The stream's chunks, read from its server-sent events as plain JSON: the SDK's typed chunk objects
        cost ~10 ms of CPU a 60-chunk reply (bench/README.md, "Many people at once"), and a turn worker runs
        hundreds of replies at once. An ``error`` payload mid-stream raises, as the SDK does."""
        try:
            for data in sse_data(raw.response.iter_lines()):
                if data.startswith("[DONE]"):
                    break
                event = json.loads(data)
                if not isinstance(event, dict):
                    continue
                if event.get("error"):
                    error = event["error"]
                    message = error.get("message") if isinstance(error, dict) else None
                    raise LLMError(self._scrub(f"APIError: {message or 'An error occurred during streaming'}"))
                yield stream_chunk(event)
        except (openai.OpenAIError, httpx2.HTTPError) as exc:
            raise self._translate(exc) from exc
        except ValueError as exc:  # a data line that is not JSON
            raise LLMError(self._scrub(f"the endpoint streamed something that is not JSON: {exc}")) from exc
        finally:
            raw.close()


class RawStream:
    """A streamed completion opened through the SDK (its status checked, errors raised as the SDK raises them),
    its body not yet read."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self.response = manager.__enter__()

    def close(self) -> None:
        self._manager.__exit__(None, None, None)


def _open_raw_stream(client: openai.OpenAI, params: dict[str, Any]) -> RawStream:
    return RawStream(client.chat.completions.with_streaming_response.create(**params))


def sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The ``data`` of each server-sent event (its data lines joined by newlines), in order."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _tool_call_delta(call: Any) -> ToolCallDelta:
    """A streamed piece of a tool call (an ill-typed piece adds nothing to index 0)."""
    call = call if isinstance(call, dict) else {}
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    index, call_id, name = call.get("index"), call.get("id"), function.get("name")
    return ToolCallDelta(
        index=index if isinstance(index, int) else 0,
        id=call_id if isinstance(call_id, str) else None,
        name=name if isinstance(name, str) else None,
        arguments=_text(function.get("arguments")),
    )


def stream_chunk(event: dict[str, Any]) -> StreamChunk:
    """One ``chat.completion.chunk`` event as a StreamChunk (fields of the wrong type are left out)."""
    usage = event.get("usage") if isinstance(event.get("usage"), dict) else None
    model = event.get("model")
    chunk = StreamChunk(
        model=model if isinstance(model, str) and model else None,
        prompt_tokens=usage.get("prompt_tokens") if usage else None,
        completion_tokens=usage.get("completion_tokens") if usage else None,
    )
    choices = event.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            chunk.text += _text(delta.get("content"))
            calls = delta.get("tool_calls")
            chunk.tool_call_deltas += [_tool_call_delta(c) for c in (calls if isinstance(calls, list) else [])]
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            chunk.finish_reason = finish
    return chunk


def _with_instruction(messages: list[Message], instruction: str) -> list[Message]:
    # Into the first system message when there is one: several local chat templates accept only one,
    # and only first. A prompt that holds it already (a reply's own prompt, built and counted with it) is sent as is.
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        if instruction in messages[0]["content"]:
            return messages
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{instruction}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]
