"""Serializer fields of the API that apply the rule every door shares (``config.incoming``)."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from rest_framework import serializers

from config.incoming import Unstorable, storable_datetime


class StorableDateTimeField(serializers.DateTimeField):
    """A date PostgreSQL and Python both hold, a day inside their limits (``config.incoming.EARLIEST`` to
    ``LATEST``), as the import and the MCP tools take it."""

    def enforce_timezone(self, value: datetime) -> datetime:
        try:
            if timezone.is_aware(value):
                # Checked before DRF converts it: its own overflow message does not say what is allowed.
                value = storable_datetime(value)
            return storable_datetime(super().enforce_timezone(value))
        except Unstorable as exc:
            raise serializers.ValidationError(exc.reason) from None
