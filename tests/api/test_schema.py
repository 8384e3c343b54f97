"""The OpenAPI 3 schema covers every endpoint, and the docs UI loads nothing from the internet."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

EXPECTED_PATHS = {
    "/api/me/": {"get"},
    "/api/me/erase/": {"post"},
    "/api/me/delete/": {"post"},
    "/api/me/export/": {"get"},
    "/api/me/import/": {"post"},
    "/api/metrics/": {"get"},
    "/api/agents/": {"get"},
    "/api/agents/{id}/": {"get"},
    "/api/sessions/": {"get", "post"},
    "/api/sessions/{session_id}/": {"get", "delete"},
    "/api/sessions/{session_id}/fork/": {"post"},
    "/api/sessions/{session_id}/branches/": {"get"},
    "/api/sessions/{session_id}/state/": {"get"},
    "/api/sessions/{session_id}/checkpoints/": {"get"},
    "/api/sessions/{session_id}/messages/": {"get", "post"},
    "/api/sessions/{session_id}/messages/stream/": {"post"},
    "/api/turns/{turn_id}/composition/": {"get"},
    "/api/turns/{turn_id}/events/": {"get"},
    "/api/memories/": {"get", "post"},
    "/api/memories/{memory_id}/": {"get", "patch", "delete"},
    "/api/memories/search/": {"get"},
}


@pytest.mark.django_db
def test_schema_is_valid_openapi_3_with_every_endpoint(alice_client: APIClient) -> None:
    response = alice_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema: dict[str, Any] = response.json()
    assert schema["openapi"].startswith("3.")
    validate_schema(schema)
    paths = {path: set(ops) - {"parameters"} for path, ops in schema["paths"].items()}
    assert paths == EXPECTED_PATHS
    schemes = schema["components"]["securitySchemes"]
    assert {"tokenAuth", "cookieAuth"} <= set(schemes)
    stream = schema["paths"]["/api/sessions/{session_id}/messages/stream/"]["post"]
    assert "text/event-stream" in stream["responses"]["200"]["content"]
    idempotency = [
        p for p in schema["paths"]["/api/sessions/{session_id}/messages/"]["post"]["parameters"] if p["in"] == "header"
    ]
    assert [p["name"] for p in idempotency] == ["Idempotency-Key"]


@pytest.mark.django_db
def test_the_schema_documents_the_error_answers(alice_client: APIClient) -> None:
    schema = alice_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert schema["components"]["schemas"]["Error"]["required"] == ["error"]
    error = {"$ref": "#/components/schemas/Error"}
    post = schema["paths"]["/api/sessions/{session_id}/messages/"]["post"]["responses"]
    for status in ("400", "401", "403", "404", "409", "413", "415", "422", "429", "503"):
        assert post[status]["content"]["application/json"]["schema"] == error, status
    assert "idempotency_key_reused" in post["422"]["description"]
    # Every operation says how a missing sign-in and the throttle answer.
    for operations in schema["paths"].values():
        for operation in (o for name, o in operations.items() if name != "parameters"):
            assert {"400", "401", "411", "413", "414", "429"} <= set(operation["responses"])
    # Any request can be malformed, chunked, too big or too long, whatever the operation declares.
    me = schema["paths"]["/api/me/"]["get"]["responses"]
    for status in ("400", "411", "413"):
        assert me[status]["content"]["application/json"]["schema"] == error, status
    assert "gunicorn" in me["414"]["description"] and "text/html" in me["414"]["content"]
    message = schema["components"]["schemas"]["MessageInputRequest"]["properties"]["message"]
    assert message["minLength"] == 1 and message["maxLength"] == settings.MAX_MESSAGE_CHARS


@pytest.mark.django_db
def test_docs_ui_assets_are_served_locally(client: Client, alice: Any) -> None:
    client.force_login(alice)
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html) + re.findall(
        r"""["'](https?://[^"']+)["']""", html
    )
    assert any("swagger-ui" in u for u in urls)
    external = [u for u in urls if re.match(r"^(https?:)?//", u)]
    assert external == [], f"the docs page would load from the internet: {external}"
    for asset in {u for u in urls if u.startswith("/static/")}:
        assert client.get(asset).status_code == 200, asset


@pytest.mark.django_db
def test_the_schema_says_what_the_server_takes(alice_client: APIClient) -> None:
    schema = alice_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    erase = schema["components"]["schemas"]["EraseMeInputRequest"]["properties"]["confirm"]
    ref = erase["allOf"][0]["$ref"].rsplit("/", 1)[-1]  # drf-spectacular names each enum as a component
    assert schema["components"]["schemas"][ref]["enum"] == ["erase my data"]
    lists = 0
    for operations in schema["paths"].values():
        for operation in (o for name, o in operations.items() if name != "parameters"):
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "page_size":
                    lists += 1
                    assert parameter["schema"] == {"type": "integer", "minimum": 1}
                    assert "at most 200" in parameter["description"]
    assert lists >= 5


@pytest.mark.django_db
def test_the_schema_gives_bounds_media_types_and_events(alice_client: APIClient) -> None:
    """What schemathesis found the schema did not say (issue 55): the page's bounds, the import's one media type,
    an event stream's events, a session's required body and its 404."""
    schema = alice_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    pages = [
        parameter
        for operations in schema["paths"].values()
        for operation in operations.values()
        for parameter in operation.get("parameters", [])
        if parameter["name"] == "page"
    ]
    assert len(pages) >= 5 and all(p["schema"] == {"type": "integer", "minimum": 1} for p in pages)
    # The import takes JSON Lines, not a JSON object (it advertised one and refused it).
    assert set(schema["paths"]["/api/me/import/"]["post"]["requestBody"]["content"]) == {"application/x-ndjson"}
    streams = [
        schema["paths"]["/api/sessions/{session_id}/messages/stream/"]["post"],
        schema["paths"]["/api/turns/{turn_id}/events/"]["get"],
    ]
    for operation in streams:
        content = operation["responses"]["200"]["content"]["text/event-stream"]
        assert content["schema"] == {"$ref": "#/components/schemas/TurnEvent"}
    event = schema["components"]["schemas"]["TurnEvent"]
    assert event["required"] == ["event", "data"] and "done" in event["properties"]["event"]["enum"]
    create = schema["paths"]["/api/sessions/"]["post"]
    assert create["requestBody"]["required"] is True and "404" in create["responses"]
    assert schema["components"]["schemas"]["SessionInputRequest"]["anyOf"] == [
        {"required": ["agent"]},
        {"required": ["agent_id"]},
    ]
