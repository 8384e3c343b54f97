"""Named endpoint profiles (``settings.LLM_PROFILES``), read into a typed, validated form.

A profile says where a model lives and how to call it. It names the environment variable that
holds its API key (``api_key_env``), never the key itself, so keys stay out of the database,
the admin and the settings dump.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings

from llm.base import LLMConfigurationError
from llm.capabilities import AUTO, MODES

# Defaults for keys a profile may leave out (LLM_PROFILES_JSON entries are often minimal).
_DEFAULTS: dict[str, object] = {
    "api_key_env": "",
    "connect_timeout": 5.0,
    "read_timeout": 60.0,
    "max_retries": 3,
    "supports_json_schema": True,
    "structured_output": AUTO,
    "context_window": None,  # unknown unless configured; then a ceiling for every agent on the endpoint
    "cheap_model": "",
    # Backoff: base * 2**attempt seconds, capped, with jitter; a Retry-After above the cap is not waited for.
    "retry_base_delay": 0.5,
    "retry_max_delay": 8.0,
    "max_retry_after": 30.0,
    "stream_usage": True,
}


@dataclass(frozen=True)
class EndpointProfile:
    name: str
    base_url: str
    model: str
    api_key_env: str
    connect_timeout: float
    read_timeout: float
    max_retries: int
    # False: the learning of structured_output "auto" starts after json_schema.
    supports_json_schema: bool
    # "auto" (learned by trying, llm.capabilities) or a mode pinned: json_schema, json_object_schema, json_object.
    structured_output: str
    # The model's context window as the operator knows it, if given: agents' budgets never exceed it.
    context_window: int | None
    cheap_model: str
    retry_base_delay: float
    retry_max_delay: float
    max_retry_after: float
    # Ask for token usage in streams (stream_options.include_usage); a few servers reject it.
    stream_usage: bool

    @classmethod
    def from_mapping(cls, name: str, data: Mapping[str, object]) -> EndpointProfile:
        """Validate one profile; a missing or mistyped value raises ``LLMConfigurationError`` naming it."""
        merged = {**_DEFAULTS, **settings_defaults(), **dict(data)}
        try:
            profile = cls(
                name=name,
                base_url=str(merged.get("base_url") or ""),
                model=str(merged.get("model") or ""),
                api_key_env=str(merged["api_key_env"] or ""),
                connect_timeout=_number(merged["connect_timeout"]),
                read_timeout=_number(merged["read_timeout"]),
                max_retries=int(_number(merged["max_retries"])),
                supports_json_schema=_flag(merged["supports_json_schema"]),
                structured_output=str(merged["structured_output"] or AUTO),
                # 0 or blank: not known (as when unset).
                context_window=int(_number(merged["context_window"])) or None
                if merged["context_window"] not in (None, "")
                else None,
                cheap_model=str(merged["cheap_model"] or ""),
                retry_base_delay=_number(merged["retry_base_delay"]),
                retry_max_delay=_number(merged["retry_max_delay"]),
                max_retry_after=_number(merged["max_retry_after"]),
                stream_usage=_flag(merged["stream_usage"]),
            )
        except (TypeError, ValueError) as exc:
            raise LLMConfigurationError(f"LLM profile {name!r} has an invalid value: {exc}") from exc
        if profile.structured_output not in (AUTO, *MODES):
            raise LLMConfigurationError(
                f"LLM profile {name!r}: structured_output must be {AUTO} or one of {', '.join(MODES)}"
            )
        if not profile.base_url:
            raise LLMConfigurationError(f"LLM profile {name!r} has no base_url (set LLM_BASE_URL)")
        if not profile.model:
            raise LLMConfigurationError(f"LLM profile {name!r} has no model (set LLM_MODEL)")
        if profile.context_window is not None and profile.context_window < 512:
            raise LLMConfigurationError(f"LLM profile {name!r}: context_window must be at least 512 tokens")
        if profile.connect_timeout <= 0 or profile.read_timeout <= 0 or profile.max_retries < 0:
            raise LLMConfigurationError(f"LLM profile {name!r}: timeouts must be > 0 and max_retries >= 0")
        return profile

    def api_key(self) -> str:
        """The key from the environment at call time ("" when the endpoint needs none, e.g. Ollama)."""
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""


def settings_defaults() -> dict[str, object]:
    """Retry tuning from settings, when set, for every profile that does not say otherwise."""
    values: dict[str, object] = {}
    for key, setting in (
        ("retry_base_delay", "LLM_RETRY_BASE_DELAY"),
        ("retry_max_delay", "LLM_RETRY_MAX_DELAY"),
        ("max_retry_after", "LLM_MAX_RETRY_AFTER"),
    ):
        value = getattr(settings, setting, None)
        if value is not None:
            values[key] = value
    return values


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise TypeError(f"expected true or false, got {value!r}")
