"""Project-wide API pieces: who am I, usage metrics, and the JSON 404 for unknown /api/ paths."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from core.api_errors import error_response
from web.selectors import usage_summary_for_user


@extend_schema(
    tags=["me"],
    responses=inline_serializer(
        "Me",
        {"id": serializers.IntegerField(), "username": serializers.CharField(), "is_staff": serializers.BooleanField()},
    ),
)
@api_view(["GET"])
def whoami(request: Request) -> Response:
    """The signed-in user."""
    user = request.user
    return Response({"id": user.pk, "username": user.get_username(), "is_staff": user.is_staff})


@extend_schema(
    tags=["me"],
    summary="A summary of my own sessions: turns, model calls, tokens, tools, memories",
    responses=inline_serializer(
        "UsageSummary",
        {
            "sessions": serializers.DictField(),
            "turns": serializers.DictField(),
            "llm_calls": serializers.DictField(),
            "tools": serializers.DictField(),
            "memories": serializers.DictField(),
        },
    ),
)
@api_view(["GET"])
def metrics(request: Request) -> Response:
    """Usage figures for the signed-in user's own sessions (operators: /ops/ and /metrics)."""
    return Response(usage_summary_for_user(user=request.user))


@csrf_exempt  # a POST to an unknown path is a 404 in JSON, not Django's HTML CSRF page (nothing changes here)
def api_not_found(request: HttpRequest, unmatched: str = "") -> JsonResponse:
    """Unknown /api/ paths answer in the API's error format, not with Django's HTML 404 page."""
    return error_response(
        code="not_found", message=f"No API endpoint at {request.path}.", status_code=404, details={"path": request.path}
    )
