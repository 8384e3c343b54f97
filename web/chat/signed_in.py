"""What the chat page's own requests do when the person is signed out."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase

from core.api_errors import error_response


def signed_in_or_401(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """For the chat page's own requests (its stream and panels): a signed-out request gets a JSON 401 the
    script can act on (keep the text, offer to sign in again), not a redirect to the sign-in page, which
    ``fetch`` follows and whose HTML then landed in the page."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            chat = request.path.rsplit("/", 2)[0] + "/"
            return error_response(
                code="not_authenticated",
                message="Your sign-in has expired. Sign in again to send this message; it is kept here.",
                status_code=401,
                details={"login_url": f"{settings.LOGIN_URL}?{urlencode({'next': chat}, safe='/')}"},
            )
        return view(request, *args, **kwargs)

    return wrapper
