"""The API's body parser (kept apart from the views: DRF imports it while loading its settings)."""

from __future__ import annotations

from io import BytesIO
from typing import Any

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class SizeLimitedJSONParser(JSONParser):
    """JSON parser that refuses bodies past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` even without a Content-Length
    (chunked uploads), instead of reading an unbounded stream into memory."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if stream is None or not limit:
            return super().parse(stream, media_type, parser_context)
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes.")
        return super().parse(BytesIO(raw), media_type, parser_context)
