"""Memories API: one's own memories — create, list, retrieve, update, delete, and search through the
same tiered retriever the agent uses. Another user's memory answers 404."""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from memory.models import Memory
from memory.retrieval import memories_for_prompt
from memory.selectors import memories_in_force, own_memories
from memory.services import MemoryConflict, memory_forget, memory_get_or_create, memory_update
from web.api.memory_serializers import (
    MemoryCreateSerializer,
    MemoryListInputSerializer,
    MemoryOutputSerializer,
    MemorySearchInputSerializer,
    MemorySearchOutputSerializer,
    MemoryUpdateSerializer,
)


class MemoryListApi(generics.GenericAPIView[Memory]):
    serializer_class = MemoryOutputSerializer

    def get_queryset(self) -> QuerySet[Memory]:
        user = self.request.user
        # A plain dict, not the QueryDict: DRF reads ``?kind=`` (sent, empty) from a QueryDict as not sent.
        params = MemoryListInputSerializer(data=dict(self.request.query_params.items()))
        params.is_valid(raise_exception=True)
        # The memories in force, as MCP and the retriever see them; ?archived=true: all of one's memories.
        listed = own_memories(user) if params.validated_data["archived"] else memories_in_force(user=user)
        memories = listed.order_by("-created_at", "-pk")
        if "kind" in params.validated_data:
            memories = memories.filter(kind=params.validated_data["kind"])
        return memories

    @extend_schema(
        tags=["memories"],
        summary="List my memories in force, newest first",
        parameters=[MemoryListInputSerializer],
        responses=MemoryOutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(MemoryOutputSerializer(page, many=True).data)

    @extend_schema(
        tags=["memories"],
        summary="Remember something (embedded now)",
        request=MemoryCreateSerializer,
        responses={201: MemoryOutputSerializer, 200: MemoryOutputSerializer},
        description="201 with the new memory; 200 with the existing one when a current memory of the same kind has this text (restored if it was archived).",
    )
    def post(self, request: Request) -> Response:
        serializer = MemoryCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            memory, created = memory_get_or_create(user=request.user, **serializer.validated_data)
        except ValueError as exc:
            raise ValidationError({"text": [str(exc)]}) from exc
        # The same text as a current memory of the same kind is that memory (restored if archived): 200.
        return Response(
            MemoryOutputSerializer(memory).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class MemoryDetailApi(APIView):
    def _memory(self, request: Request, memory_id: int) -> Memory:
        return get_object_or_404(own_memories(request.user), pk=memory_id)

    @extend_schema(tags=["memories"], summary="One of my memories", responses=MemoryOutputSerializer)
    def get(self, request: Request, memory_id: int) -> Response:
        return Response(MemoryOutputSerializer(self._memory(request, memory_id)).data)

    @extend_schema(
        tags=["memories"],
        summary="Change a memory (a new text is re-embedded)",
        request=MemoryUpdateSerializer,
        responses={
            200: MemoryOutputSerializer,
            409: OpenApiResponse(
                description="Another memory of this kind has this text (`memory_conflict`, naming it), or the fact "
                "was replaced by a newer one meanwhile."
            ),
        },
    )
    def patch(self, request: Request, memory_id: int) -> Response:
        memory = self._memory(request, memory_id)
        serializer = MemoryUpdateSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        try:
            memory = memory_update(memory=memory, **serializer.validated_data)
        except MemoryConflict:
            raise  # 409, with what it conflicts with
        except ValueError as exc:
            raise ValidationError({"non_field_errors": [str(exc)]}) from exc
        return Response(MemoryOutputSerializer(memory).data)

    @extend_schema(tags=["memories"], summary="Forget a memory", responses={204: None})
    def delete(self, request: Request, memory_id: int) -> Response:
        if not memory_forget(user=request.user, memory_id=memory_id):
            raise NotFound()
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemorySearchApi(APIView):
    @extend_schema(
        tags=["memories"],
        summary="Search my memories with the agent's tiered retriever",
        parameters=[MemorySearchInputSerializer],
        responses=MemorySearchOutputSerializer,
    )
    def get(self, request: Request) -> Response:
        params = MemorySearchInputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        found = memories_for_prompt(
            user=request.user,
            query=params.validated_data["q"],
            budget_tokens=params.validated_data["budget_tokens"],
            use_model_filter=params.validated_data["use_model_filter"],
        )
        body = {
            "query": params.validated_data["q"],
            "items": [
                {"memory": item.memory, "score": item.score, "tier": item.tier, "tokens": item.tokens}
                for item in found.items
            ],
            "total_tokens": found.total_tokens,
            "report": found.as_report(),
        }
        return Response(MemorySearchOutputSerializer(body).data)
