"""Which provider answers for an agent: its endpoint profile, or the demo model when none is set up."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol

from django.conf import settings

from llm.base import LLMConfigurationError, LLMProvider
from llm.demo import DEMO_LABEL, DemoModel
from llm.openai_compat import OpenAICompatibleProvider
from llm.profiles import EndpointProfile


class Agent(Protocol):
    """What choosing a provider reads of an agent (``agents.models.Agent`` has it; the library has no ORM)."""

    slug: str
    endpoint: str
    model: str


__all__ = [
    "DEMO_LABEL",
    "DEMO_PROFILE",
    "agent_profile",
    "endpoint_profile",
    "endpoint_window",
    "get_provider",
    "provider_override",
    "set_profile_source",
]

DEFAULT_PROFILE = "default"
# An agent whose endpoint is "demo" always gets the demo model, even when a real endpoint is configured.
DEMO_PROFILE = "demo"

_demo = DemoModel()

# What answers every call while ``provider_override`` is in force (a test's scripted model): one provider,
# or a function of (agent, cheap). Process-wide, not per thread: a turn's calls run on other threads too.
ProviderChoice = Callable[[Agent | None, bool], LLMProvider]
_override: ProviderChoice | None = None
_override_lock = threading.Lock()


@contextmanager
def provider_override(provider: LLMProvider | ProviderChoice) -> Iterator[None]:
    """Every ``get_provider`` call answers with ``provider`` until the block ends (or, given a function,
    with what it returns for the agent and ``cheap``): how tests put a scripted model at the edge."""
    global _override
    if hasattr(provider, "complete"):  # a provider: it answers everything
        fixed: LLMProvider = provider  # type: ignore[assignment]

        def choice(_agent: Agent | None, _cheap: bool) -> LLMProvider:
            return fixed

    else:
        choice = provider  # type: ignore[assignment]
    with _override_lock:
        previous, _override = _override, choice
    try:
        yield
    finally:
        with _override_lock:
            _override = previous


# Where profiles not in settings come from (the agents app installs the admin's connected endpoints): a
# function of a name giving an LLM_PROFILES entry, or None.
ProfileSource = Callable[[str], Mapping[str, object] | None]
_profile_source: ProfileSource | None = None


def set_profile_source(source: ProfileSource | None) -> None:
    global _profile_source
    _profile_source = source


def endpoint_profile(name: str) -> EndpointProfile | None:
    """The validated profile called ``name``: from settings (the environment) first, else from the installed
    source (an endpoint connected in the admin); ``None`` when neither defines it."""
    profiles: dict[str, dict[str, object]] = getattr(settings, "LLM_PROFILES", {}) or {}
    data: Mapping[str, object] | None = profiles.get(name)
    if data is None and _profile_source is not None:
        data = _profile_source(name)
    if data is None:
        return None
    return EndpointProfile.from_mapping(name, data)


def agent_profile(agent: Agent | None) -> EndpointProfile | None:
    """The endpoint profile that answers for ``agent`` (or the default one), None for the demo model.

    - ``agent.endpoint`` blank → the "default" profile; when that is not configured either, the demo model.
    - ``agent.endpoint == "demo"`` → the demo model.
    - ``agent.endpoint`` names a profile that does not exist → ``LLMConfigurationError`` (an
      ``ImproperlyConfigured``): an operator asked for it explicitly, so silently answering with the
      demo model would hide the mistake.
    """
    explicit = (agent.endpoint if agent is not None else "") or ""
    if explicit == DEMO_PROFILE:
        return None
    profile = endpoint_profile(explicit or DEFAULT_PROFILE)
    if profile is None and explicit:
        known = ", ".join(sorted(getattr(settings, "LLM_PROFILES", {}) or {})) or "none"
        raise LLMConfigurationError(
            f"agent {getattr(agent, 'slug', '?')!r} uses LLM endpoint profile {explicit!r}, which is not "
            f"configured (known profiles: {known}; see LLM_PROFILES_JSON)"
        )
    return profile


def endpoint_window(agent: Agent) -> int | None:
    """The context window configured for ``agent``'s endpoint profile, if any (none for the demo model or a
    profile that is not configured: the agent's own window stands)."""
    try:
        profile = agent_profile(agent)
    except LLMConfigurationError:
        return None  # the turn's provider lookup reports it
    return profile.context_window if profile is not None else None


def get_provider(*, agent: Agent | None = None, cheap: bool = False) -> LLMProvider:
    """The provider for ``agent`` (or the default profile); the demo model when none is configured
    (``agent_profile`` says which, and raises for a profile that is named but not configured).

    ``agent.model`` overrides the profile's model; ``cheap=True`` uses the profile's ``cheap_model``
    (falling back to the main model).
    """
    override = _override
    if override is not None:
        return override(agent, cheap)
    profile = agent_profile(agent)
    if profile is None:
        return _demo
    model = (agent.model if agent is not None and agent.model else "") or profile.model
    if cheap and profile.cheap_model:
        model = profile.cheap_model
    return OpenAICompatibleProvider(profile=profile, model=model)
