from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response


@extend_schema(
    responses=inline_serializer(
        "Me",
        {"id": serializers.IntegerField(), "username": serializers.CharField(), "is_staff": serializers.BooleanField()},
    )
)
@api_view(["GET"])
def whoami(request: Request) -> Response:
    """The signed-in user."""
    user = request.user
    return Response({"id": user.pk, "username": user.get_username(), "is_staff": user.is_staff})
