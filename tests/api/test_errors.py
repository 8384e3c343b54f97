"""Every error, in one format: {"error": {"code", "message", "details"}} — 400/401/403/404/405/409/413/415/429/500."""

from __future__ import annotations

from io import BytesIO
from typing import Any

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import ParseError
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

from agents.models import Agent
from core.api_errors import api_exception_handler
from core.parsers import PayloadTooLarge, SizeLimitedJSONParser
from sessions.locks import SessionTurnLock
from sessions.models import Turn
from sessions.services import session_create
from tests.api.conftest import assert_error, token_client


@pytest.mark.django_db
def test_anonymous_is_401_with_a_challenge(anon_client: APIClient) -> None:
    response = anon_client.get("/api/sessions/")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Token")


@pytest.mark.django_db
def test_a_wrong_token_is_401(anon_client: APIClient) -> None:
    anon_client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert_error(anon_client.get("/api/me/"), 401, "authentication_failed")


@pytest.mark.django_db
def test_session_auth_without_csrf_token_is_403(alice: Any, chat_agent: Agent) -> None:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get("/api/me/").json()["username"] == "alice"
    error = assert_error(client.post("/api/sessions/", {"agent": "chatty"}, format="json"), 403, "permission_denied")
    assert "CSRF" in error["message"]


@pytest.mark.django_db
def test_unknown_api_path_is_a_json_404(alice_client: APIClient) -> None:
    error = assert_error(alice_client.get("/api/no-such-thing/"), 404, "not_found")
    assert error["details"]["path"] == "/api/no-such-thing/"
    assert_error(alice_client.get("/api/sessions/not-a-uuid/"), 404, "not_found")
    assert_error(alice_client.get("/api/agents/999999/"), 404, "not_found")


@pytest.mark.django_db
def test_a_change_to_an_unknown_api_path_is_a_json_404_not_a_csrf_page(alice: Any) -> None:
    # A token client, with CSRF checked as a browser's requests are: the 404 comes before any CSRF page.
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=alice)[0].key}")
    for send in (client.post, client.patch, client.delete):
        assert_error(send("/api/sessions/abc/messages/", {"message": "x"}, format="json"), 404, "not_found")


@pytest.mark.django_db
def test_an_agent_id_must_be_a_whole_number(alice_client: APIClient, chat_agent: Agent) -> None:
    # JSON's 1e400 is infinity to the parser: it was a 500. 1.9 was taken for agent 1.
    for bad in ("1e400", "-1e400", "1.9", "true", '"1.0"', '"١"'):
        body = f'{{"agent_id": {bad.replace("1", str(chat_agent.pk), 1) if bad == "1.9" else bad}}}'
        response = alice_client.post("/api/sessions/", data=body, content_type="application/json")
        assert "agent_id" in assert_error(response, 400, "invalid")["details"]["fields"], bad
    assert_error(alice_client.post("/api/sessions/", {"agent_id": 2**70}, format="json"), 400, "invalid")
    for good in (chat_agent.pk, str(chat_agent.pk)):
        response = alice_client.post("/api/sessions/", {"agent_id": good}, format="json")
        assert response.status_code == 201 and response.json()["agent"] == "chatty", response.content


@pytest.mark.django_db
def test_out_of_range_page_is_404(alice_client: APIClient) -> None:
    assert_error(alice_client.get("/api/sessions/", {"page": 99}), 404, "not_found")


@pytest.mark.django_db
def test_wrong_method_is_405(alice_client: APIClient) -> None:
    error = assert_error(alice_client.put("/api/agents/", {}, format="json"), 405, "method_not_allowed")
    assert "PUT" in error["message"]


@pytest.mark.django_db
def test_wrong_media_type_is_415(alice_client: APIClient, chat_agent: Agent) -> None:
    response = alice_client.post("/api/sessions/", data="agent=chatty", content_type="text/plain")
    assert_error(response, 415, "unsupported_media_type")


@pytest.mark.django_db
def test_malformed_json_is_400_parse_error(alice_client: APIClient, chat_agent: Agent) -> None:
    response = alice_client.post("/api/sessions/", data='{"agent": "chatty"', content_type="application/json")
    error = assert_error(response, 400, "parse_error")
    assert "JSON" in error["message"]


@pytest.mark.django_db
def test_validation_errors_name_the_field(alice_client: APIClient) -> None:
    error = assert_error(
        alice_client.post("/api/memories/", {"kind": "dream", "text": ""}, format="json"), 400, "invalid"
    )
    assert set(error["details"]["fields"]) == {"kind", "text"}


@pytest.mark.django_db
def test_body_over_the_limit_is_413(alice_client: APIClient, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    body = '{"kind": "semantic", "text": "' + "x" * 4000 + '"}'
    error = assert_error(alice_client.post("/api/memories/", data=body, content_type="application/json"), 413)
    assert error["code"] == "payload_too_large"
    assert error["details"]["limit_bytes"] == 2048


def test_parser_refuses_an_oversize_stream_without_content_length(settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    parser = SizeLimitedJSONParser()
    assert parser.parse(BytesIO(b'{"a": 1}'), "application/json", {}) == {"a": 1}
    with pytest.raises(PayloadTooLarge):
        parser.parse(BytesIO(b'{"a": "' + b"y" * 2000 + b'"}'), "application/json", {})
    with pytest.raises(ParseError):
        parser.parse(BytesIO(b"{nope"), "application/json", {})


@pytest.mark.django_db
def test_message_over_max_chars_is_413_and_saves_nothing(
    alice: Any, alice_client: APIClient, chat_agent: Agent, settings: Any
) -> None:
    settings.MAX_MESSAGE_CHARS = 100
    session = session_create(user=alice, agent=chat_agent)
    for path in (f"/api/sessions/{session.pk}/messages/", f"/api/sessions/{session.pk}/messages/stream/"):
        error = assert_error(alice_client.post(path, {"message": "z" * 101}, format="json"), 413)
        assert "100" in error["message"]
    assert not Turn.objects.filter(session=session).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("message", "code"), [("", "empty_message"), ("   \n", "empty_message"), ("a\x00b", "nul_bytes")]
)
def test_empty_or_nul_message_is_400(
    alice: Any, alice_client: APIClient, chat_agent: Agent, message: str, code: str
) -> None:
    session = session_create(user=alice, agent=chat_agent)
    assert_error(
        alice_client.post(f"/api/sessions/{session.pk}/messages/", {"message": message}, format="json"), 400, code
    )
    assert not Turn.objects.filter(session=session).exists()


@pytest.mark.django_db
def test_missing_message_is_400(alice: Any, alice_client: APIClient, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    error = assert_error(alice_client.post(f"/api/sessions/{session.pk}/messages/", {}, format="json"), 400, "invalid")
    assert "message" in error["details"]["fields"]


@pytest.mark.django_db
def test_busy_session_is_409(alice: Any, alice_client: APIClient, chat_agent: Agent, settings: Any) -> None:
    settings.TURN_LOCK_WAIT_SECONDS = 0.0
    session = session_create(user=alice, agent=chat_agent)
    # Another runner (a worker, another web process, in production) holds the session's turn lease.
    other = SessionTurnLock(session.pk)
    assert other.try_acquire()
    try:
        for path in (f"/api/sessions/{session.pk}/messages/", f"/api/sessions/{session.pk}/messages/stream/"):
            assert_error(alice_client.post(path, {"message": "hello"}, format="json"), 409, "session_busy")
        assert_error(alice_client.delete(f"/api/sessions/{session.pk}/"), 409, "session_busy")
    finally:
        other.release()
    # Once the other turn is over, the same message goes through.
    assert (
        alice_client.post(f"/api/sessions/{session.pk}/messages/", {"message": "hello"}, format="json").status_code
        == 201
    )


@pytest.mark.django_db
def test_throttled_is_429_with_retry_after(alice_client: APIClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "user", "3/min")
    for _ in range(3):
        assert alice_client.get("/api/me/").status_code == 200
    response = alice_client.get("/api/me/")
    error = assert_error(response, 429, "throttled")
    assert 0 < error["details"]["retry_after_seconds"] <= 60
    assert int(response["Retry-After"]) == error["details"]["retry_after_seconds"]


@pytest.mark.django_db
def test_posting_messages_has_its_own_tighter_rate(
    alice: Any, alice_client: APIClient, chat_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "messages", "2/min")
    session = session_create(user=alice, agent=chat_agent)
    path = f"/api/sessions/{session.pk}/messages/"
    assert [alice_client.post(path, {"message": f"m{i}"}, format="json").status_code for i in range(2)] == [201, 201]
    assert_error(alice_client.post(path, {"message": "m3"}, format="json"), 429, "throttled")
    # Reading is not a model call: the history stays readable.
    assert alice_client.get(path).status_code == 200
    assert Turn.objects.filter(session=session).count() == 2


def test_unexpected_exception_is_a_500_in_the_same_format() -> None:
    response = api_exception_handler(RuntimeError("database password is hunter2"), {"view": None})
    assert response is not None and response.status_code == 500
    assert response.data["error"]["code"] == "server_error"
    assert "hunter2" not in str(response.data)


@pytest.mark.django_db
def test_staff_token_does_not_open_other_peoples_sessions(staff: Any, alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    assert_error(token_client(staff).get(f"/api/sessions/{session.pk}/state/"), 404, "not_found")


@pytest.mark.django_db
def test_nul_bytes_in_lookups_are_400_not_500(alice: Any, alice_client: APIClient, chat_agent: Agent) -> None:
    # Found by the schemathesis run: PostgreSQL refuses NUL in text, which used to surface as a 500.
    assert_error(alice_client.post("/api/sessions/", {"agent": "chat\x00ty"}, format="json"), 400, "invalid")
    session = session_create(user=alice, agent=chat_agent)
    path = f"/api/sessions/{session.pk}/messages/"
    error = assert_error(
        alice_client.post(path, {"message": "hi"}, format="json", HTTP_IDEMPOTENCY_KEY="k" * 201), 400, "invalid"
    )
    assert "Idempotency-Key" in error["details"]["fields"]
    assert not Turn.objects.filter(session=session).exists()


def test_request_data_too_big_maps_to_413() -> None:
    from django.core.exceptions import RequestDataTooBig

    response = api_exception_handler(RequestDataTooBig("too big"), {"view": None})
    assert response is not None and response.status_code == 413
    assert response.data["error"]["code"] == "payload_too_large"


@pytest.mark.django_db
def test_oversize_body_outside_the_api_is_a_plain_413(alice: Any, chat_agent: Agent, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    session = session_create(user=alice, agent=chat_agent)
    client = APIClient()
    client.force_login(alice)
    response = client.post(f"/chats/{session.pk}/stream/", data="x" * 5000, content_type="application/json")
    assert response.status_code == 413 and response["Content-Type"].startswith("text/plain")
    assert not Turn.objects.filter(session=session).exists()


@pytest.mark.django_db
def test_field_errors_are_lists_and_a_utf8_idempotency_key_is_read_as_sent(
    alice_client: APIClient, chat_agent: Agent
) -> None:
    kind = assert_error(alice_client.get("/api/memories/", {"kind": "bogus"}), 400, "invalid")
    assert isinstance(kind["details"]["fields"]["kind"], list)
    session = alice_client.post("/api/sessions/", {"agent": "chatty"}, format="json").json()["id"]
    url = f"/api/sessions/{session}/messages/"
    bad = alice_client.post(url, {"message": "hi"}, format="json", HTTP_IDEMPOTENCY_KEY="a\x07b")
    assert isinstance(assert_error(bad, 400, "invalid")["details"]["fields"]["Idempotency-Key"], list)

    # The header's UTF-8 bytes, as WSGI passes them on: decoded as latin-1.
    wire = "clé-€".encode().decode("latin-1")
    first = alice_client.post(url, {"message": "hi"}, format="json", HTTP_IDEMPOTENCY_KEY=wire)
    again = alice_client.post(url, {"message": "hi"}, format="json", HTTP_IDEMPOTENCY_KEY=wire)
    assert (first.status_code, again.status_code) == (201, 200) and again.json()["replayed"]
    assert Turn.objects.get(session_id=session).idempotency_key == "clé-€"


@pytest.mark.django_db
def test_an_agent_id_of_thousands_of_digits_is_invalid_not_a_500(alice_client: APIClient, chat_agent: Agent) -> None:
    response = alice_client.post("/api/sessions/", {"agent_id": "1" * 5000}, format="json")
    assert "agent_id" in assert_error(response, 400, "invalid")["details"]["fields"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/agents/", "/api/sessions/", "/api/memories/"])
@pytest.mark.parametrize("value", ["null", "", "abc", "0", "-1", "1.5", "00", "\u0661"])
def test_a_page_size_that_is_not_a_whole_number_from_1_is_a_400(alice_client: APIClient, path: str, value: str) -> None:
    error = assert_error(alice_client.get(path, {"page_size": value}), 400, "invalid")
    assert "page_size" in error["details"]["fields"]


@pytest.mark.django_db
def test_a_page_size_over_the_most_gives_the_most(alice_client: APIClient) -> None:
    assert alice_client.get("/api/sessions/", {"page_size": 500}).status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("field", ["workflow", "fact_key", "trigger", "text"])
def test_a_number_where_the_schema_says_string_is_a_400(alice_client: APIClient, field: str) -> None:
    body = {"kind": "semantic", "text": "Likes figs.", field: 0}
    error = assert_error(alice_client.post("/api/memories/", body, format="json"), 400, "invalid")
    assert field in error["details"]["fields"]


@pytest.mark.django_db
def test_a_session_title_must_be_text(alice_client: APIClient, chat_agent: Agent) -> None:
    response = alice_client.post("/api/sessions/", {"agent": chat_agent.slug, "title": 7}, format="json")
    assert "title" in assert_error(response, 400, "invalid")["details"]["fields"]


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["", "0", "1", "yes", "on"])
def test_use_model_filter_takes_true_or_false_only(alice_client: APIClient, value: str) -> None:
    response = alice_client.get("/api/memories/search/", {"q": "figs", "use_model_filter": value})
    assert "use_model_filter" in assert_error(response, 400, "invalid")["details"]["fields"]
    fine = alice_client.get("/api/memories/search/", {"q": "figs", "use_model_filter": "false"})
    assert fine.status_code == 200


@pytest.mark.django_db
def test_the_erase_phrase_is_the_phrase_exactly(alice_client: APIClient) -> None:
    response = alice_client.post("/api/me/erase/", {"confirm": " ERASE my data "}, format="json")
    assert "confirm" in assert_error(response, 400, "invalid")["details"]["fields"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "last_event_id",
    ["99999999999999999999-99999999999999999999", "18446744073709551616-0", "1-2-3", "abc", "1700000000000"],
)
def test_a_last_event_id_the_channel_could_not_have_given_is_400(
    alice: Any, alice_client: APIClient, chat_agent: Agent, last_event_id: str
) -> None:
    """A Redis stream id is two numbers below 2^64: a bigger one is the client's error, not the server's."""
    session = session_create(user=alice, agent=chat_agent)
    turn = Turn.objects.create(session=session, seq=1, user_message="Hi", assistant_message="Hello", status="completed")
    response = alice_client.get(f"/api/turns/{turn.pk}/events/", HTTP_LAST_EVENT_ID=last_event_id)
    assert_error(response, 400, "invalid")
    assert "Last-Event-ID" in response.json()["error"]["details"]["fields"]
