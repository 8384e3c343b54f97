"""What the API's OpenAPI schema says beyond what drf-spectacular reads from the views (a postprocessing hook,
after ``core.api_schema.document_errors``): the shape of a turn's server-sent events, and the requests whose rules
span fields.

Found by schemathesis (tests/api/test_schemathesis.py): the event streams were typed as one plain string, so a
client learnt nothing of their events; a session's body was optional with every field optional, though it needs
an agent.
"""

from __future__ import annotations

from typing import Any, get_args, get_type_hints

from core.events import EVENT_ID_PATTERN
from orchestrator.context import TurnEvent

EVENT_TYPES = list(get_args(get_type_hints(TurnEvent)["type"]))

TURN_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One server-sent event of a turn: `event: <type>`, an `id:` to send back as `Last-Event-ID` "
    "when it has one, and a `data:` line, a JSON object whose `type` is the event's type (docs/web-and-api.md).",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": EVENT_TYPES},
        "id": {"type": "string", "pattern": EVENT_ID_PATTERN},
        # OpenAPI 3.0 has no contentSchema: the JSON object a data line holds is described in words.
        "data": {
            "type": "string",
            "description": "A JSON object: `type` (the event's type) and the keys of that type (docs/web-and-api.md).",
        },
        "retry": {"type": "integer", "minimum": 0},
    },
}


def describe_streams_and_requests(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Each ``text/event-stream`` answer as its events (``TurnEvent``); a session's body as required, with an
    agent by slug or by id."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["TurnEvent"] = TURN_EVENT_SCHEMA
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict):
                continue
            for response in operation.get("responses", {}).values():
                stream = response.get("content", {}).get("text/event-stream")
                if stream is not None:
                    stream["schema"] = {"$ref": "#/components/schemas/TurnEvent"}
    session = schemas.get("SessionInputRequest")
    create = result.get("paths", {}).get("/api/sessions/", {}).get("post")
    if session is not None and create is not None:
        session["anyOf"] = [{"required": ["agent"]}, {"required": ["agent_id"]}]
        create["requestBody"]["required"] = True
        create["responses"]["404"] = {
            "description": "No active agent has this slug or id (`not_found`); `details.fields` names the field.",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    return result
