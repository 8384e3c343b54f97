"""Typed helpers that read settings from environment variables and fail loudly.

Every helper raises ``ImproperlyConfigured`` on a value it cannot parse, so a typo in
production configuration stops the process at start-up instead of being ignored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import parse_qs, unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    return _env_number(name, default, int, "an integer", minimum, maximum)


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    return _env_number(name, default, float, "a number", minimum, maximum)


N = TypeVar("N", int, float)


def _env_number(name: str, default: N, parse: Callable[[str], N], what: str, minimum: N | None, maximum: N | None) -> N:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = parse(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not {what}") from exc
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above the maximum {maximum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


_RATE = re.compile(r"^\s*(\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour|d|day)\s*$", re.IGNORECASE)


def env_rate(name: str, default: str) -> str:
    """A request rate as Django REST framework reads it: ``<count>/<period>``, the period one of s, m, h, d
    (or sec, min, hour, day). DRF parses it on every request, so a typo would fail each one with a 500."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    match = _RATE.match(raw)
    if not match or int(match.group(1)) < 1:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a rate like 30/min (a count of at least 1, then s, m, h or d)"
        )
    return f"{int(match.group(1))}/{match.group(2).lower()}"


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (compared in upper case, as log levels are written)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().upper()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r} is not one of {', '.join(choices)}")
    return value


def database_from_url(url: str) -> dict[str, object]:
    """Turn ``postgres://user:pass@host:port/name?sslmode=…`` into a Django DATABASES entry.

    A ``host`` query parameter (a socket folder, as libpq accepts) overrides the netloc host.
    """
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ImproperlyConfigured(
            f"DATABASE_URL must be a postgres:// URL (pgvector needs PostgreSQL), got scheme {parsed.scheme!r}"
        )
    name = unquote(parsed.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL has no database name")
    try:
        port = parsed.port
    except ValueError as exc:  # "Port could not be cast to integer value", "Port out of range 0-65535"
        raise ImproperlyConfigured(f"DATABASE_URL has an invalid port: {exc}") from None
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    host = query.pop("host", None) or (unquote(parsed.hostname) if parsed.hostname else "")
    options: dict[str, str] = dict(query)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": host,
        "PORT": str(port or ""),
        "OPTIONS": options,
    }
