"""What plugs in: workflows, tools, seeded agents, erasers of a person's data; how tools run."""

from __future__ import annotations

from core.env import env_float, env_int, env_list, env_str

# --- Workflows and tools (agents/workflows, agents/tools; docs/extending.md) ------------------------
# The workflows agents may follow, besides the built-in free chat: dotted paths to a Workflow; installed
# packages add theirs through the entry-point group ``agents_runtime.workflows``. AGENT_EXTRA_WORKFLOWS adds
# paths without a settings module of your own.
AGENT_WORKFLOWS = [
    "examples.booking.workflow.FLIGHT_BOOKING",
    *env_list("AGENT_EXTRA_WORKFLOWS", []),
]
# The tools agents may use: dotted paths to a Tool (``@tool`` or ``Tool(...)``) or a list of them; installed
# packages add theirs through the entry-point group ``agents_runtime.tools`` (docs/extending.md).
# AGENT_EXTRA_TOOLS adds paths to these without a settings module of your own.
AGENT_TOOLS = [
    "memory.tools.SEARCH_MEMORY",
    "examples.booking.tools.SEARCH_FLIGHTS",
    "examples.booking.tools.BOOK_FLIGHT",
    "agents.tools.web.HTTP_GET",
    *env_list("AGENT_EXTRA_TOOLS", []),
]
# The agents created when missing (``manage.py runstack``), besides the built-in assistant: dotted paths to a dict
# of Agent fields with a slug, a list of them, or a callable returning either; a seed whose workflow is not
# plugged in is skipped. Installed packages add theirs through the entry-point group ``agents_runtime.agent_seeds``.
AGENT_SEEDS = [
    "examples.booking.seed.flight_booking_agent",
]
# What packages keep about a person, erased with the rest (people.erasure.person_erase): dotted paths to callables
# ``(user) -> dict[str, int]`` (counts by name). Installed packages add theirs through the entry-point group
# ``agents_runtime.person_erasers``.
PERSON_ERASERS = [
    "examples.booking.erasure.bookings_erase",
]
# Seconds one attempt of a tool may run before it is abandoned (the model sees "TOOL_ERROR: … timed out").
TOOLS_DEFAULT_TIMEOUT = env_float("TOOLS_DEFAULT_TIMEOUT", 10.0, minimum=0.05, maximum=600.0)
# Retryable failures (timeouts, connection errors, 5xx) get up to this many attempts; 4xx never retry.
TOOLS_MAX_ATTEMPTS = env_int("TOOLS_MAX_ATTEMPTS", 3, minimum=1, maximum=10)
TOOLS_RETRY_BASE_DELAY = env_float("TOOLS_RETRY_BASE_DELAY", 0.5, minimum=0.0, maximum=60.0)
TOOLS_RETRY_MAX_DELAY = env_float("TOOLS_RETRY_MAX_DELAY", 8.0, minimum=0.0, maximum=300.0)
# http_get: hosts it may fetch ("example.com", ".example.com" for subdomains, "*" for any public host).
# Private, loopback and link-local addresses are refused unless their host is listed by name.
TOOLS_HTTP_ALLOWED_HOSTS = env_list("TOOLS_HTTP_ALLOWED_HOSTS", [])
TOOLS_HTTP_MAX_BYTES = env_int("TOOLS_HTTP_MAX_BYTES", 65536, minimum=256, maximum=10 * 1024 * 1024)
TOOLS_HTTP_TIMEOUT = env_float("TOOLS_HTTP_TIMEOUT", 8.0, minimum=0.05, maximum=600.0)
# Injected tool failures for tests and benchmarks, e.g. "search_flights:http_503:2,book_flight:timeout:1"
# (kinds: timeout, http_503, http_400, malformed_payload, connection_error; count or "*"). Empty in production.
TOOLS_FAULTS = env_str("TOOLS_FAULTS", "") or ""
