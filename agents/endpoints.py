"""Model endpoints connected from the admin: the profile source behind them, the Test, and a local Ollama.

An endpoint saved in the admin (``ModelEndpoint``) is a profile like those of the environment, which win over
it when both have the name. ``endpoint_test`` makes real calls (a short reply, then a structured one, which
learns the format the endpoint takes) and keeps what it found on the row, for the admin to show.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, Literal

import httpx
from django.conf import settings
from django.utils import timezone
from pydantic import BaseModel, Field

from agents.models import ModelEndpoint
from llm.base import CallContext, LLMError, TruncatedOutputError
from llm.capabilities import MODE_LABELS, EndpointKey, known_mode
from llm.openai_compat import OpenAICompatibleProvider
from llm.profiles import EndpointProfile

# How long a profile read from the table is reused before it is read again (a save in this process forgets
# it at once; other processes see the change within this many seconds).
CACHE_SECONDS = 5.0

_cache: dict[str, tuple[float, dict[str, object] | None]] = {}
_cache_lock = threading.Lock()


def stored_profile(name: str) -> Mapping[str, object] | None:
    """The ``LLM_PROFILES`` entry of the endpoint called ``name`` connected in the admin, if any."""
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(name)
    if hit is not None and now - hit[0] < CACHE_SECONDS:
        return hit[1]
    row = ModelEndpoint.objects.filter(name=name).first()
    profile = row.as_profile() if row is not None else None
    with _cache_lock:
        _cache[name] = (now, profile)
    return profile


def forget_stored_profiles() -> None:
    with _cache_lock:
        _cache.clear()


class ProbeAnswer(BaseModel):
    """What the Test asks for as structured output."""

    answer: Literal["yes", "no"]
    confidence: float = Field(ge=0, le=1)


def endpoint_test(endpoint: ModelEndpoint) -> dict[str, Any]:
    """Call the endpoint for real: a short reply, then a structured one. Keeps and returns what was found."""
    result: dict[str, Any] = {"checked_at": timezone.now().isoformat(timespec="seconds")}
    try:
        profile = EndpointProfile.from_mapping(
            endpoint.name, {**endpoint.as_profile(), "max_retries": 0, "read_timeout": 60.0}
        )
    except LLMError as exc:
        result.update(ok=False, error=str(exc))
        return _kept(endpoint, result)
    provider = OpenAICompatibleProvider(profile=profile)
    ctx = CallContext(purpose="other")
    started = time.monotonic()
    try:
        completion = provider.complete(
            [{"role": "user", "content": "Reply with the single word: ready"}], ctx=ctx, max_tokens=16
        )
        chat: dict[str, Any] = {"ok": True, "reply": completion.text[:200], "finish_reason": completion.finish_reason}
    except TruncatedOutputError as exc:  # it answered, at length: the endpoint works
        chat = {"ok": True, "reply": exc.partial_text[:200], "finish_reason": "length"}
    except LLMError as exc:
        chat = {"ok": False, "error": str(exc)[:500]}
    chat["latency_ms"] = round((time.monotonic() - started) * 1000)
    result["chat"] = chat
    if chat["ok"]:
        try:
            provider.structured(
                [{"role": "user", "content": "Is Paris in France? Answer as the JSON object asked for."}],
                schema=ProbeAnswer,
                ctx=ctx,
                max_tokens=64,
            )
            structured: dict[str, Any] = {"ok": True}
        except LLMError as exc:
            structured = {"ok": False, "error": str(exc)[:500]}
        learned = known_mode(EndpointKey(profile=profile.name, base_url=profile.base_url, model=profile.model))
        if learned is not None:
            structured["mode"] = learned.mode
            structured["mode_label"] = MODE_LABELS[learned.mode]
        result["structured"] = structured
    result["ok"] = bool(chat["ok"] and result.get("structured", {}).get("ok"))
    return _kept(endpoint, result)


def _kept(endpoint: ModelEndpoint, result: dict[str, Any]) -> dict[str, Any]:
    ModelEndpoint.objects.filter(pk=endpoint.pk).update(last_test=result)
    endpoint.last_test = result
    return result


def ollama_url() -> str:
    """Where a local Ollama would answer (``LLM_OLLAMA_URL``), without ``/v1``."""
    return str(settings.LLM_OLLAMA_URL).rstrip("/")


def ollama_models(timeout: float = 0.5) -> list[str] | None:
    """The models of the Ollama answering at ``ollama_url()``, or ``None`` when none answers there."""
    base = ollama_url()
    try:
        response = httpx.get(f"{base}/api/tags", timeout=timeout)
        response.raise_for_status()
        body = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    models = body.get("models") if isinstance(body, dict) else None
    if not isinstance(models, list):
        return None
    return [str(m["name"]) for m in models if isinstance(m, dict) and m.get("name")]
