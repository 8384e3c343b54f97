"""Serializer fields of the API that apply the rule every door shares (``core.incoming``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from core.incoming import Unstorable, storable_datetime


class StorableDateTimeField(serializers.DateTimeField):
    """A date PostgreSQL and Python both hold, a day inside their limits (``core.incoming.EARLIEST`` to
    ``LATEST``), as the import and the MCP tools take it."""

    def enforce_timezone(self, value: datetime) -> datetime:
        try:
            if timezone.is_aware(value):
                # Checked before DRF converts it: its own overflow message does not say what is allowed.
                value = storable_datetime(value)
            return storable_datetime(super().enforce_timezone(value))
        except Unstorable as exc:
            raise serializers.ValidationError(exc.reason) from None


class StrictCharField(serializers.CharField):
    """Text, and only text: DRF's own field takes a number (``"workflow": 0``) and keeps its digits, where the
    schema says string."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """``true`` or ``false``, as JSON writes them: DRF's own field also takes ``0``, ``1``, ``"yes"``, ``"on"``...
    where the schema says boolean."""

    default_error_messages = {"invalid": "Must be true or false (a JSON boolean)."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictFloatField(serializers.FloatField):
    """A JSON number: DRF's own field also takes ``false`` (as 0.0) and ``"0.5"``, where the schema says number."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class QueryBooleanField(serializers.BooleanField):
    """A boolean as a query string writes one by the schema: ``true`` or ``false`` (DRF's own field also took
    ``""``, ``0``, ``1``, ``on``, ``yes``...)."""

    default_error_messages = {"invalid": "Must be true or false."}

    def get_value(self, dictionary: Any) -> Any:
        # DRF reads ``?use_model_filter=`` (sent, empty) as not sent at all; it is a value, and not a boolean.
        if self.field_name in dictionary and dictionary.get(self.field_name) == "":
            return ""
        return super().get_value(dictionary)

    def to_internal_value(self, data: Any) -> bool:
        if isinstance(data, bool):
            return data
        if isinstance(data, str) and data.lower() in ("true", "false"):
            return data.lower() == "true"
        self.fail("invalid", input=data)
