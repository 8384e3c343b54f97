"""PostgreSQL restarting under a running web server (a real gunicorn subprocess on the test database).

A restart looks like this to the app: every connection is dropped (``pg_terminate_backend``), and for a
while new connections are refused (simulated with ``ALTER DATABASE … ALLOW_CONNECTIONS false``, which is
what a server still starting up answers). A request caught by it fails with a clear JSON 503 in the one
error format — never a 500 HTML page — and the next request succeeds, finishing the interrupted turn
first. When the database is back at once, the request in flight reconnects and simply succeeds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg
import pytest
from django.db import connection

from agents.models import Agent
from conftest import wait_for
from sessions.models import Turn
from sessions.services import session_create
from tests.fakes.openai_server import hang, stream
from tests.reliability.conftest import api_token

pytestmark = pytest.mark.django_db(transaction=True)


def _drop_other_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


@contextmanager
def _database_refusing_connections() -> Iterator[None]:
    """New connections to the test database are refused until the block ends (PostgreSQL forbids
    this on the current database, so it is switched from a connection to the maintenance database)."""
    s = connection.settings_dict
    params = {"dbname": "postgres", "user": s["USER"], "password": s["PASSWORD"], "host": s["HOST"]}
    if s.get("PORT"):
        params["port"] = s["PORT"]
    quoted = connection.ops.quote_name(s["NAME"])
    with psycopg.connect(autocommit=True, **params) as admin:
        admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false")
        try:
            yield
        finally:
            admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true")


def _post_in_background(client: httpx.Client, url: str, headers: dict[str, str], message: str) -> Any:
    responses: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: responses.append(client.post(url, json={"message": message}, headers=headers))
    )
    thread.start()
    return thread, responses


def test_a_request_caught_by_a_restart_is_a_json_503_and_the_next_finishes_its_turn(
    alice: Any, chat_agent: Agent, fake_openai: Any, web_server: Any
) -> None:
    server = web_server(llm_profile=fake_openai.profile(read_timeout=30.0, max_retries=0))
    session = session_create(user=alice, agent=chat_agent)
    headers = {"Authorization": f"Token {api_token(alice)}"}
    url = f"{server.url}/api/sessions/{session.pk}/messages/"
    fake_openai.enqueue(hang(2.0, then=stream("(this reply is lost with the connection)")))

    with httpx.Client(timeout=60) as client:
        thread, responses = _post_in_background(client, url, headers, "hello")
        wait_for(lambda: fake_openai.chat_requests(), timeout=30, message="the model call")
        with _database_refusing_connections():
            assert _drop_other_connections() >= 1
            thread.join(timeout=60)
            [failed] = responses
        assert failed.status_code == 503, (failed.status_code, failed.text[:500], server.log_text()[-3000:])
        assert failed.headers["Content-Type"].startswith("application/json")
        assert failed.json() == {
            "error": {
                "code": "database_unavailable",
                "message": "The database is unavailable right now; please retry shortly.",
                "details": {},
            }
        }
        assert int(failed.headers["Retry-After"]) > 0

        # The message was saved before the model call; its reply could not be.
        [turn] = Turn.objects.filter(session=session)
        assert (turn.user_message, turn.status, turn.assistant_message) == ("hello", Turn.Status.RUNNING, "")

        # The database is back: the next request finishes the interrupted turn, then answers its own.
        fake_openai.enqueue(stream("Hello to you."), stream("Hi again."))
        ok = client.post(url, json={"message": "hi again"}, headers=headers)
        assert ok.status_code == 201, ok.text[:2000]
        assert ok.json()["reply"] == "Hi again."
    turns = list(Turn.objects.filter(session=session).order_by("seq").values_list("seq", "status", "assistant_message"))
    assert turns == [(1, "completed", "Hello to you."), (2, "completed", "Hi again.")]


def test_connections_dropped_while_the_database_stays_up_are_reconnected(
    alice: Any, chat_agent: Agent, fake_openai: Any, web_server: Any
) -> None:
    server = web_server(llm_profile=fake_openai.profile(read_timeout=30.0, max_retries=0))
    session = session_create(user=alice, agent=chat_agent)
    headers = {"Authorization": f"Token {api_token(alice)}"}
    url = f"{server.url}/api/sessions/{session.pk}/messages/"
    fake_openai.enqueue(hang(1.5, then=stream("Still here.")))
    with httpx.Client(timeout=60) as client:
        thread, responses = _post_in_background(client, url, headers, "hello")
        wait_for(lambda: fake_openai.chat_requests(), timeout=30, message="the model call")
        assert _drop_other_connections() >= 1
        thread.join(timeout=60)
        [response] = responses
        assert response.status_code == 201, response.text[:2000]
        # Idle connections dropped between requests are noticed and replaced (CONN_HEALTH_CHECKS).
        assert _drop_other_connections() >= 1
        fake_openai.enqueue(stream("Yes."))
        again = client.post(url, json={"message": "still there?"}, headers=headers)
        assert again.status_code == 201, again.text[:2000]
    turns = list(Turn.objects.filter(session=session).order_by("seq").values_list("status", "assistant_message"))
    assert turns == [("completed", "Still here."), ("completed", "Yes.")]


def test_the_web_door_answers_a_database_outage_with_503s_in_the_form_each_client_reads(
    alice: Any, chat_agent: Agent, web_server: Any
) -> None:
    """Pages, the chat's stream and /metrics: a 503 (a page, JSON, text) with Retry-After, never Django's 500
    page with its traceback."""
    server = web_server()
    session = session_create(user=alice, agent=chat_agent)
    token = "a" * 32  # a CSRF secret in its unmasked form: the cookie and the header agree
    cookies = {"sessionid": "x" * 32, "csrftoken": token}  # reading the session is the first database query
    with httpx.Client(base_url=server.url, timeout=30, cookies=cookies) as client:
        assert client.get("/metrics").status_code == 200  # up: loopback may scrape
        with _database_refusing_connections():
            _drop_other_connections()
            page = client.get("/")
            stream = client.post(
                f"/chats/{session.pk}/stream/",
                json={"message": "hello"},
                headers={"Accept": "text/event-stream", "X-CSRFToken": token},
            )
            metrics = client.get("/metrics")
    log = server.log_text()[-3000:]
    assert page.status_code == 503, (page.status_code, page.text[:300], log)
    assert page.headers["Content-Type"].startswith("text/html") and "Back in a moment" in page.text
    assert "Traceback" not in page.text and "OperationalError" not in page.text
    assert stream.status_code == 503, (stream.status_code, stream.text[:300], log)
    assert stream.json()["error"]["code"] == "database_unavailable"
    assert metrics.status_code == 503 and metrics.headers["Content-Type"].startswith("text/plain")
    assert all(int(r.headers["Retry-After"]) > 0 for r in (page, stream, metrics))
