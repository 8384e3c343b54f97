"""The model endpoints: the default one from LLM_*, named profiles, retries, structured outputs."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from core.env import env_bool, env_float, env_int, env_str

LLM_BASE_URL = env_str("LLM_BASE_URL")
LLM_API_KEY = env_str("LLM_API_KEY")
LLM_MODEL = env_str("LLM_MODEL")
LLM_CONNECT_TIMEOUT = env_float("LLM_CONNECT_TIMEOUT", 5.0, minimum=0.1)
LLM_READ_TIMEOUT = env_float("LLM_READ_TIMEOUT", 60.0, minimum=0.1)
LLM_MAX_RETRIES = env_int("LLM_MAX_RETRIES", 3, minimum=0, maximum=10)
# Backoff between retries of 429/5xx/timeouts: base * 2**attempt seconds (capped, with jitter). A server's
# Retry-After is honoured, but one longer than LLM_MAX_RETRY_AFTER fails the call instead of holding a thread.
LLM_RETRY_BASE_DELAY = env_float("LLM_RETRY_BASE_DELAY", 0.5, minimum=0.0)
LLM_RETRY_MAX_DELAY = env_float("LLM_RETRY_MAX_DELAY", 8.0, minimum=0.0)
LLM_MAX_RETRY_AFTER = env_float("LLM_MAX_RETRY_AFTER", 30.0, minimum=0.0)
LLM_SUPPORTS_JSON_SCHEMA = env_bool("LLM_SUPPORTS_JSON_SCHEMA", True)
# How structured outputs are asked for: "auto" (try json_schema, then llama.cpp's json_object with a schema,
# then plain JSON mode, and remember what the endpoint took), or one of those pinned (docs/models.md).
LLM_STRUCTURED_OUTPUT = env_str("LLM_STRUCTURED_OUTPUT", "auto") or "auto"
if LLM_STRUCTURED_OUTPUT not in ("auto", "json_schema", "json_object_schema", "json_object"):
    raise ImproperlyConfigured(
        "LLM_STRUCTURED_OUTPUT must be auto, json_schema, json_object_schema or json_object "
        f"(got {LLM_STRUCTURED_OUTPUT!r})"
    )
# The default endpoint's context window, when known: a ceiling on every agent's own context_window.
LLM_CONTEXT_WINDOW = env_int("LLM_CONTEXT_WINDOW", 0, minimum=0) or None
if LLM_CONTEXT_WINDOW is not None and LLM_CONTEXT_WINDOW < 512:
    raise ImproperlyConfigured(f"LLM_CONTEXT_WINDOW must be at least 512 tokens (got {LLM_CONTEXT_WINDOW})")
# Where the admin's "Connect a model" form looks for a local Ollama to offer.
LLM_OLLAMA_URL = env_str("LLM_OLLAMA_URL", "http://127.0.0.1:11434") or "http://127.0.0.1:11434"
# A cheaper model on the same endpoint for relevance filtering, fact extraction and summaries ("" = LLM_MODEL).
LLM_CHEAP_MODEL = env_str("LLM_CHEAP_MODEL", "") or ""
# Named endpoint profiles that agents refer to by name (Agent.endpoint). API keys are never stored in
# the database: a profile names the environment variable that holds its key. "default" comes from the
# LLM_* variables above; more can be added as JSON in LLM_PROFILES_JSON, e.g.
# {"local": {"base_url": "http://127.0.0.1:11434/v1", "model": "llama3.2", "api_key_env": "OLLAMA_KEY"}}.
LLM_PROFILES: dict[str, dict[str, object]] = {}
if LLM_BASE_URL or LLM_MODEL:
    LLM_PROFILES["default"] = {
        "base_url": LLM_BASE_URL,
        "model": LLM_MODEL or "",
        "api_key_env": "LLM_API_KEY",
        "connect_timeout": LLM_CONNECT_TIMEOUT,
        "read_timeout": LLM_READ_TIMEOUT,
        "max_retries": LLM_MAX_RETRIES,
        "supports_json_schema": LLM_SUPPORTS_JSON_SCHEMA,
        "structured_output": LLM_STRUCTURED_OUTPUT,
        "context_window": LLM_CONTEXT_WINDOW,
        "cheap_model": LLM_CHEAP_MODEL,
    }
_profiles_json = env_str("LLM_PROFILES_JSON")
if _profiles_json:
    import json as _json

    try:
        _extra = _json.loads(_profiles_json)
    except ValueError as exc:
        raise ImproperlyConfigured(f"LLM_PROFILES_JSON is not valid JSON: {exc}") from exc
    if not isinstance(_extra, dict) or not all(isinstance(v, dict) for v in _extra.values()):
        raise ImproperlyConfigured("LLM_PROFILES_JSON must be an object of objects")
    LLM_PROFILES.update(_extra)
