"""Sign-in forms that stop password guessing: after ``LOGIN_MAX_FAILURES`` failed sign-ins for one username
from one address within ``LOGIN_FAILURE_WINDOW_SECONDS``, that pair is refused without checking the password
until the window has passed. The chat's login page and the admin's use the same forms.

Counted per (address, username) so that guessing one account is slowed while nobody can lock another user
out from elsewhere. The counters live in Django's cache, which every process shares (settings.CACHES).
The address is ``client_address``: behind reverse proxies, set ``NUM_PROXIES`` to their number, or every
request has the proxy's address, the count is per username, and guesses from anywhere can lock that
username out for the window.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache
from django.core.exceptions import ValidationError
from rest_framework.throttling import BaseThrottle


def client_address(request: Any) -> str:
    """The client's address as the API throttles see it (DRF's ``get_ident``): ``REMOTE_ADDR``, or with
    ``NUM_PROXIES`` = n, the n-th address from the end of X-Forwarded-For (those before it are the
    client's to write, so they never count)."""
    return str(BaseThrottle().get_ident(request) or "")


def _failures_key(request: Any, username: str) -> str:
    address = client_address(request) if request is not None else ""
    digest = hashlib.sha256(f"{address}\n{username.strip().lower()}".encode()).hexdigest()
    return f"login-failures:{digest}"


class ThrottledLoginMixin:
    """For ``AuthenticationForm`` subclasses (``self.request`` and ``self.cleaned_data`` come from it)."""

    request: Any
    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        limit = int(settings.LOGIN_MAX_FAILURES)
        window = int(settings.LOGIN_FAILURE_WINDOW_SECONDS)
        key = _failures_key(self.request, self.cleaned_data.get("username") or "")
        # Counted before the password is checked; a sign-in that succeeds clears the count. The increment is
        # atomic on Redis; the database cache reads then writes, so guesses sent at the very same moment may
        # share a number (a few extra guesses, not a bypass). The window restarts with each attempt.
        cache.add(key, 0, window)
        try:
            attempts = cache.incr(key)
        except ValueError:  # expired between the two calls
            cache.set(key, 1, window)
            attempts = 1
        cache.touch(key, window)
        if attempts > limit:
            minutes = max(1, round(window / 60))
            raise ValidationError(
                f"Too many failed sign-ins for this username from your address. Try again in {minutes} minutes.",
                code="throttled",
            )
        data: dict[str, Any] = super().clean()  # type: ignore[misc]
        cache.delete(key)
        return data


class LoginForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class AdminLoginForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass
