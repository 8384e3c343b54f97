"""Fixtures of the turn's tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def remote_model(settings: Any, fake_openai: Any) -> Any:
    """Every agent's default endpoint is the fake OpenAI server (real HTTP, no retries, short timeouts)."""
    settings.LLM_PROFILES = {"default": fake_openai.profile(read_timeout=2.0, max_retries=0)}
    return fake_openai
