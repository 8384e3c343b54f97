"""The API's body parser (kept apart from the views: DRF imports it while loading its settings)."""

from __future__ import annotations

from io import BytesIO
from typing import Any

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import BaseParser, JSONParser


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class SizeLimitedJSONParser(JSONParser):
    """JSON parser that refuses bodies past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` even without a Content-Length
    (chunked uploads), instead of reading an unbounded stream into memory."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = _limit_for(parser_context)
        if stream is None or not limit:
            return self._parse_bounded_depth(stream, media_type, parser_context)
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes.")
        return self._parse_bounded_depth(BytesIO(raw), media_type, parser_context)

    def _parse_bounded_depth(self, stream: Any, media_type: str | None, parser_context: Any) -> Any:
        # Note: json.loads recurses once per nesting level; a small body like "[[[[…]]]]" 50,000 deep
        # raises RecursionError, which is not a ValueError, so DRF would answer it with a 500.
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise exceptions.ParseError("JSON parse error - the document is nested too deeply.") from exc


class RawTextParser(BaseParser):
    """The body as text, whatever its type (an import file: JSON Lines, or Mem0's JSON), within the same size
    limit; invalid UTF-8 is a parse error."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:  # str
        limit = _limit_for(parser_context)
        raw = stream.read(limit + 1 if limit else -1) if stream is not None else b""
        if limit and len(raw) > limit:
            raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes.")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError("The body is not UTF-8 text.") from exc


def _limit_for(parser_context: Any) -> int | None:
    """The body limit of the request's path: its own in ``LARGE_BODY_PATHS``, else ``DATA_UPLOAD_MAX_MEMORY_SIZE``."""
    request = (parser_context or {}).get("request")
    path = getattr(request, "path", "")
    limit: int | None = getattr(settings, "LARGE_BODY_PATHS", {}).get(path, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    return limit
