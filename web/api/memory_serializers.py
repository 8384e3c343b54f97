"""API shapes of memories. Embeddings and content hashes stay inside: they mean nothing to a client."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from memory.models import MEMORY_CONTENT_FIELDS, Memory
from web.api.fields import (
    QueryBooleanField,
    StorableDateTimeField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
)


class MemoryOutputSerializer(serializers.ModelSerializer[Memory]):
    source_session = serializers.UUIDField(source="source_session_id", read_only=True, allow_null=True)
    source_turn = serializers.IntegerField(source="source_turn_id", read_only=True, allow_null=True)
    is_current = serializers.BooleanField(read_only=True)

    class Meta:
        model = Memory
        fields = [
            "id",
            *MEMORY_CONTENT_FIELDS,
            "is_current",
            "source_session",
            "source_turn",
            "valid_from",
            "valid_to",
            "expires_at",
            "access_count",
            "last_accessed_at",
            "occurred_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class MemoryCreateSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=Memory.Kind.choices)
    text = StrictCharField(max_length=4000)
    importance = StrictFloatField(min_value=0.0, max_value=1.0, required=False, default=0.5)
    pinned = StrictBooleanField(required=False, default=False)
    fact_key = StrictCharField(max_length=80, required=False, allow_blank=True, default="")
    trigger = StrictCharField(max_length=200, required=False, allow_blank=True, default="")
    workflow = StrictCharField(max_length=80, required=False, allow_blank=True, default="")
    occurred_at = StorableDateTimeField(
        required=False,
        default=None,
        help_text="When what it tells happened (used for recency and shown to the model); default: now.",
    )


class MemoryUpdateSerializer(serializers.Serializer[Any]):
    """Every field optional: PATCH changes what it names. Changing the text re-embeds the memory."""

    kind = serializers.ChoiceField(choices=Memory.Kind.choices, required=False)
    text = StrictCharField(max_length=4000, required=False)
    importance = StrictFloatField(min_value=0.0, max_value=1.0, required=False)
    pinned = StrictBooleanField(required=False)
    archived = StrictBooleanField(required=False)
    fact_key = StrictCharField(max_length=80, required=False, allow_blank=True)
    trigger = StrictCharField(max_length=200, required=False, allow_blank=True)
    workflow = StrictCharField(max_length=80, required=False, allow_blank=True)
    expires_at = StorableDateTimeField(required=False, allow_null=True)
    occurred_at = StorableDateTimeField(required=False, help_text="When what it tells happened.")


class MemoryListInputSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=Memory.Kind.choices, required=False, help_text="Only memories of this kind.")
    archived = QueryBooleanField(
        required=False,
        default=False,
        help_text="true: all my memories, archived, superseded, expired and not yet valid ones included.",
    )


class MemorySearchInputSerializer(serializers.Serializer[Any]):
    q = serializers.CharField(max_length=2000, help_text="What to look for (as a chat message would say it).")
    budget_tokens = serializers.IntegerField(min_value=1, max_value=20000, required=False, default=2000)
    use_model_filter = QueryBooleanField(
        required=False, default=False, help_text="Also ask the cheap model which candidates are relevant."
    )


class MemorySearchHitSerializer(serializers.Serializer[Any]):
    memory = MemoryOutputSerializer()
    score = serializers.FloatField()
    tier = serializers.CharField()
    tokens = serializers.IntegerField()


class MemorySearchOutputSerializer(serializers.Serializer[Any]):
    query = serializers.CharField()
    items = MemorySearchHitSerializer(many=True)
    total_tokens = serializers.IntegerField()
    report = serializers.DictField(help_text="Every candidate, why it was kept or dropped, the filter mode, timings.")
