"""One error format for the whole API: ``{"error": {"code": ..., "message": ..., "details": {...}}}``.

Every error a client can meet goes through here: DRF's own exceptions (400 parse errors, 401, 403,
404, 405, 415, 429), Django's ``Http404``/``PermissionDenied``/``RequestDataTooBig``, every
``core.errors.Refusal`` (the runtime's ``SessionBusyError``, 409, and ``MessageRejected``, 400/413), and unexpected exceptions (500, logged).
Routes that DRF never sees (an unknown ``/api/...`` path, a body over the size limit) use
``error_response`` directly: the catch-all route in ``web.api.urls`` and ``RequestSizeLimitMiddleware``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from core.errors import Refusal
from core.parsers import PayloadTooLarge

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"
# The OpenAI-compatible door (``web.openai_api``): its errors take OpenAI's shape, which its clients read.
OPENAI_PREFIX = "/v1/"
# What a 503 for an unreachable database tells clients to wait before retrying (a restart takes seconds).
DATABASE_RETRY_AFTER_SECONDS = 5


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of every API error."""
    return {"error": {"code": code, "message": message, "details": details or {}}}


def error_response(*, code: str, message: str, status_code: int, details: dict[str, Any] | None = None) -> JsonResponse:
    """A plain Django response in the API's error format, for code paths outside DRF views."""
    return JsonResponse(error_body(code, message, details), status=status_code)


def openai_error_body(message: str, *, kind: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An error as OpenAI's API sends it (``{"error": {"message", "type", "param", "code"}}``): what its SDKs
    parse into ``openai.APIStatusError`` for the OpenAI-compatible door."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_error_response(
    *, message: str, status_code: int, kind: str = "invalid_request_error", code: str | None = None
) -> JsonResponse:
    """A plain Django response in OpenAI's error shape, for code paths outside the door's views."""
    return JsonResponse(openai_error_body(message, kind=kind, code=code), status=status_code)


def runtime_error_status(exc: Exception) -> tuple[str, str, int] | None:
    """``(code, message, status)`` for a refusal (busy or closed session, rejected message, an agent whose
    workflow is gone: any ``core.errors.Refusal``), or None for any other exception."""
    if isinstance(exc, Refusal):
        return exc.code, exc.message_for_people(), int(exc.status)
    return None


def refusal_headers(exc: Exception) -> dict[str, str]:
    """``Retry-After`` for a refusal that says when to try again (a full turns queue)."""
    wait = getattr(exc, "retry_after", None)
    return {"Retry-After": str(int(wait))} if wait else {}


def _message_of(detail: Any) -> str:
    if isinstance(detail, list) and detail:
        return _message_of(detail[0])
    if isinstance(detail, dict) and detail:
        key, value = next(iter(detail.items()))
        inner = _message_of(value)
        return inner if key == "non_field_errors" else f"{key}: {inner}"
    return str(detail)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's ``EXCEPTION_HANDLER``: every error in the one format."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()

    runtime = runtime_error_status(exc)
    if runtime is not None:
        code, message, status_code = runtime
        set_rollback()
        return Response(error_body(code, message), status=status_code, headers=refusal_headers(exc))

    if isinstance(exc, (OperationalError, InterfaceError)):
        # The database is unreachable (restarting, failing over, out of connections): a temporary
        # condition the client should retry, not a bug. A message being answered was saved before the
        # model call; the next request finishes it (crash recovery in orchestrator.runtime).
        logger.error("database unavailable during an API request", exc_info=exc)
        set_rollback()
        return Response(
            error_body("database_unavailable", "The database is unavailable right now; please retry shortly."),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
        )

    if not isinstance(exc, exceptions.APIException):
        # Unexpected: log with the traceback, answer in the same format without leaking internals.
        logger.exception("unhandled API error", extra={"view": type(context.get("view")).__name__})
        set_rollback()
        return Response(
            error_body("server_error", "Something went wrong on our side."),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )

    headers: dict[str, str] = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = str(exc.auth_header)  # type: ignore[attr-defined]
    details: dict[str, Any] = {}
    if isinstance(exc, exceptions.ValidationError):
        code = "invalid"
        message = _message_of(exc.detail) or "The request is not valid."
        details = {"fields": exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}}
    else:
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else exc.default_code
        message = _message_of(exc.detail)
        if isinstance(exc.detail, dict):  # a refusal that names fields (an agent not found: 404)
            details["fields"] = exc.detail
    wait = getattr(exc, "wait", None) if isinstance(exc, exceptions.Throttled) else None
    if wait is not None:
        details["retry_after_seconds"] = int(wait)
        headers["Retry-After"] = str(int(wait))
    set_rollback()
    return Response(error_body(str(code), message, details), status=exc.status_code, headers=headers)


class RequestSizeLimitMiddleware:
    """413 before anything reads a body whose Content-Length is over ``DATA_UPLOAD_MAX_MEMORY_SIZE``.

    Django itself only checks the size when ``request.body``/``POST`` is read (and then answers 400);
    DRF reads the stream directly, so without this an oversize API body would be read in full.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = getattr(settings, "LARGE_BODY_PATHS", {}).get(request.path, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        raw_length = request.META.get("CONTENT_LENGTH") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            length = 0
        if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            # Django reads a body by its Content-Length: a chunked one (none given) would be read as empty, and a
            # message "required" although it was sent. Refused, saying what to do instead.
            message = "Send the request body with a Content-Length header; chunked transfer encoding is not accepted."
            if request.path.startswith(API_PREFIX):
                return error_response(code="length_required", message=message, status_code=411)
            if request.path.startswith(OPENAI_PREFIX):
                return openai_error_response(message=message, status_code=411, code="length_required")
            return HttpResponse(message, status=411, content_type="text/plain; charset=utf-8")
        if limit is not None and length > limit:
            message = f"The request body is {length} bytes; the limit is {limit}."
            if request.path.startswith(API_PREFIX):
                return error_response(
                    code="payload_too_large",
                    message=message,
                    status_code=413,
                    details={"limit_bytes": limit},
                )
            if request.path.startswith(OPENAI_PREFIX):
                return openai_error_response(message=message, status_code=413, code="payload_too_large")
            return HttpResponse(message, status=413, content_type="text/plain; charset=utf-8")
        return self.get_response(request)


class NulQueryMiddleware:
    """400 for a page whose query string holds a NUL character (``%00``), before a view filters on it.

    PostgreSQL refuses NUL in text, so a list filter like the admin's ``?status=a%00b`` would end in a 500.
    The API validates its own query parameters (its serializers refuse NUL with a field error), so it is
    left to them.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX) and "\x00" in _query_text(request):
            return HttpResponse(
                "The address holds a NUL (%00) character, which no page accepts.",
                status=400,
                content_type="text/plain; charset=utf-8",
            )
        return self.get_response(request)


def _query_text(request: HttpRequest) -> str:
    return "".join(key + "".join(values) for key, values in request.GET.lists())


class DatabaseUnavailableMiddleware:
    """A 503 (never Django's 500 page or traceback) for a page, the chat's stream or ``/metrics`` when the
    database is unreachable, in the form the client reads: JSON in the one error format for the API and for
    clients that ask for JSON or an event stream (the chat's script), plain text for ``/metrics``, a page
    otherwise. With ``Retry-After``. (The API's views answer the same through ``api_exception_handler``.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        logger.error("database unavailable during %s %s", request.method, request.path, exc_info=exception)
        message = "The database is unavailable right now; please retry shortly."
        accept = request.META.get("HTTP_ACCEPT", "")
        response: HttpResponse
        if request.path.startswith(OPENAI_PREFIX):
            response = openai_error_response(
                message=message, status_code=503, kind="server_error", code="database_unavailable"
            )
        elif request.path.startswith(API_PREFIX) or "application/json" in accept or "text/event-stream" in accept:
            response = error_response(code="database_unavailable", message=message, status_code=503)
        elif request.path.rstrip("/") == "/metrics":
            response = HttpResponse(message + "\n", status=503, content_type="text/plain; charset=utf-8")
        else:
            # A page of its own: the site's layout reads the signed-in user, from the database that is down.
            response = HttpResponse(
                render_to_string("503.html", {"retry_after": DATABASE_RETRY_AFTER_SECONDS}), status=503
            )
        response["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
        return response
