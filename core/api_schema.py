"""The API's error answers in its OpenAPI schema: one ``Error`` component (``core.api_errors.error_body``)
and the statuses each operation can answer with besides its success (a drf-spectacular postprocessing hook).

Without it the schema listed successes only, so a client generated from it knew neither the error body nor
that a message can be refused with 413 or 422; a schema-driven fuzzer (schemathesis) flagged every error
answer as undocumented.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every error answer of the API: a stable code, a message for people, and details.",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "details"],
            "properties": {
                "code": {
                    "type": "string",
                    "description": "Stable, for programs: invalid, not_found, session_busy, throttled, ...",
                },
                "message": {"type": "string"},
                "details": {
                    "type": "object",
                    "additionalProperties": True,
                    "description": "For invalid input, `fields`: the field names with their messages.",
                },
            },
        }
    },
}

# status -> what it means on any operation that can answer it
_COMMON = {
    "400": "Invalid input (code `invalid`, or a more precise one such as `invalid_characters`); "
    "`details.fields` names the fields.",
    "401": "Not signed in (`not_authenticated`): send `Authorization: Token <key>` or a session cookie.",
    "403": "Refused (`permission_denied`): signed in with the session cookie, a change needs the `X-CSRFToken` header.",
    "404": "No such object of yours (`not_found`): another user's id is a 404 too; so is a page past the last.",
    "411": "The body came in chunks, without a Content-Length (`length_required`): send its length.",
    "413": "The request body is too large (`payload_too_large`).",
    "415": "The body is not JSON (`unsupported_media_type`).",
    "414": "The address (path and query) is longer than the server reads (4,094 bytes): answered by the web "
    "server (gunicorn) before the app, as an HTML page, not in the `Error` format.",
    "429": "Too many requests (`throttled`); `Retry-After` says when to try again.",
    "503": "The database is unreachable (`database_unavailable`, with `Retry-After`), or the agent's "
    "workflow is not available on this server (`agent_unavailable`).",
}
_MESSAGE_POST = {
    "400": "The message is empty (`empty_message`), holds NUL characters (`nul_bytes`) or unpaired "
    "surrogates (`invalid_characters`), or the Idempotency-Key cannot be stored (`invalid`).",
    "409": "Another message on this session is still being answered (`session_busy`), or the session is "
    "closed (`session_closed`).",
    "413": "The message is longer than the limit (`message_too_long`); nothing was saved.",
    "422": "This Idempotency-Key was used for another message on this session (`idempotency_key_reused`).",
}


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def document_errors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Add the ``Error`` component, each operation's error statuses, and the message's length limits."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            parameters = {p.get("in") for p in operation.get("parameters", [])}
            names = {p.get("name") for p in operation.get("parameters", [])}
            body = "requestBody" in operation
            # Any request can meet these, whatever the operation declares: a malformed one (a NUL in the address,
            # a header that cannot be read) is a 400, a chunked body a 411 and one over the limit a 413 on any
            # method (the size check comes first), an address too long a 414 from the web server.
            statuses = ["400", "401", "411", "413", "414", "429", "503"]
            if "path" in parameters or "page" in names:
                statuses.append("404")
            if body:
                statuses.append("415")
            if method in ("post", "put", "patch", "delete"):
                statuses.append("403")
            messages = method == "post" and path.rstrip("/").endswith(("/messages", "/messages/stream"))
            if messages:
                statuses += ["409", "422"]
            responses = operation["responses"]
            for status in sorted(set(statuses)):
                text = (_MESSAGE_POST.get(status) if messages else None) or _COMMON[status]
                existing = responses.get(status)
                if status == "414":
                    responses[status] = {"description": text, "content": {"text/html": {"schema": {"type": "string"}}}}
                elif existing is None:
                    responses[status] = _error_response(text)
                elif "content" not in existing:  # a status documented with words only: give it the body
                    responses[status] = _error_response(existing.get("description") or text)
    message = result["components"]["schemas"].get("MessageInputRequest", {}).get("properties", {}).get("message")
    if message is not None:
        message.update({"minLength": 1, "maxLength": int(settings.MAX_MESSAGE_CHARS)})
    return result
