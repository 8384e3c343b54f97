"""The first run with a real model: with none configured, staff are offered an admin form to connect one (a local
Ollama when one answers), whose "Save and test" calls it for real and shows what it supports; the endpoint
saved there answers every agent that names no other, unless the environment configures one of the name."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client

from agents.models import EndpointCapability, ModelEndpoint
from llm.openai_compat import OpenAICompatibleProvider
from llm.providers import get_provider
from orchestrator.runtime import turn_run
from sessions.services import session_create
from tests.fakes import openai_server as fake
from tests.world import make_agent

pytestmark = pytest.mark.django_db

LLAMA_CPP_REFUSAL = "{\"error\": {\"message\": \"validation error: ('body', 'response_format', 'type'): Input should be 'text' or 'json_object'\"}}"


@pytest.fixture
def no_model(settings: Any) -> None:
    settings.LLM_PROFILES = {}


@pytest.fixture
def ollama(settings: Any) -> Iterator[str]:
    """A stand-in for a local Ollama's model list (GET /api/tags) on a free port."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"models": [{"name": "llama3.2:latest"}, {"name": "qwen3:4b"}]}).encode()
            self.send_response(200 if self.path == "/api/tags" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.LLM_OLLAMA_URL = f"http://127.0.0.1:{server.server_address[1]}"
    yield settings.LLM_OLLAMA_URL
    server.shutdown()


def test_staff_with_the_permission_are_offered_the_form_when_no_model_is_configured(
    no_model: None, admin_user: Any, alice: Any, settings: Any
) -> None:
    make_agent(name="Chat", slug="chat", system_prompt="Hi.")
    staff = Client()
    staff.force_login(admin_user)
    page = staff.get("/").content.decode()
    assert 'id="connect-model"' in page and "/admin/agents/modelendpoint/add/" in page
    user = Client()
    user.force_login(alice)
    assert 'id="connect-model"' not in user.get("/").content.decode()
    settings.LLM_PROFILES = {"default": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}
    assert 'id="connect-model"' not in staff.get("/").content.decode()  # a model is configured: no offer


def test_a_local_ollama_is_offered_in_the_form(no_model: None, admin_user: Any, ollama: str) -> None:
    staff = Client()
    staff.force_login(admin_user)
    page = staff.get("/admin/agents/modelendpoint/add/").content.decode()
    assert f"A local Ollama answers at {ollama}" in page and "llama3.2:latest, qwen3:4b" in page
    assert f'value="{ollama}/v1"' in page and 'value="llama3.2:latest"' in page


def test_no_ollama_no_offer(no_model: None, admin_user: Any, settings: Any) -> None:
    settings.LLM_OLLAMA_URL = "http://127.0.0.1:9"  # nothing listens there
    staff = Client()
    staff.force_login(admin_user)
    page = staff.get("/admin/agents/modelendpoint/add/").content.decode()
    assert "A local Ollama answers" not in page and 'name="base_url"' in page


def test_save_and_test_calls_the_endpoint_and_shows_what_it_supports(
    no_model: None, admin_user: Any, fake_openai: fake.FakeOpenAIServer
) -> None:
    fake_openai.enqueue(
        fake.reply("ready"),
        fake.FakeResponse(status=422, body=LLAMA_CPP_REFUSAL),
        fake.json_reply({"answer": "yes", "confidence": 0.9}),
    )
    staff = Client()
    staff.force_login(admin_user)
    response = staff.post(
        "/admin/agents/modelendpoint/add/",
        {"name": "default", "base_url": fake_openai.base_url, "model": "local-model", "api_key_env": "", "_test": "1"},
        follow=True,
    )
    assert response.status_code == 200
    page = response.content.decode()
    endpoint = ModelEndpoint.objects.get()
    assert endpoint.last_test["ok"] is True
    assert endpoint.last_test["chat"]["reply"] == "ready"
    assert endpoint.last_test["structured"]["mode"] == "json_object_schema"
    assert "answers; structured outputs: JSON object constrained by a schema (llama.cpp)" in page
    assert "Last test" in page and "works" in page
    assert EndpointCapability.objects.get(profile="default").structured_mode == "json_object_schema"
    assert [r.body["model"] for r in fake_openai.chat_requests()] == ["local-model"] * 3


def test_a_failed_test_says_why(no_model: None, admin_user: Any) -> None:
    staff = Client()
    staff.force_login(admin_user)
    response = staff.post(
        "/admin/agents/modelendpoint/add/",
        {"name": "default", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "", "_test": "1"},
        follow=True,
    )
    page = response.content.decode()
    assert "did not pass the test" in page and "cannot reach http://127.0.0.1:9/v1" in page
    assert ModelEndpoint.objects.get().last_test["ok"] is False


def test_the_connected_endpoint_answers_the_agents(
    no_model: None, alice: Any, fake_openai: fake.FakeOpenAIServer
) -> None:
    agent = make_agent(name="Chat", slug="chat", system_prompt="Hi.")
    assert get_provider(agent=agent).is_demo
    ModelEndpoint.objects.create(name="default", base_url=fake_openai.base_url, model="local-model")
    provider = get_provider(agent=agent)
    assert isinstance(provider, OpenAICompatibleProvider) and provider.model == "local-model"
    fake_openai.enqueue(fake.stream("Hello from the connected model."))
    result = turn_run(session=session_create(user=alice, agent=agent), message="Hi")
    assert result.reply == "Hello from the connected model." and not result.is_demo


def test_the_environment_wins_over_a_connected_endpoint_of_the_same_name(settings: Any) -> None:
    ModelEndpoint.objects.create(name="default", base_url="http://127.0.0.1:9/v1", model="from-the-admin")
    settings.LLM_PROFILES = {"default": {"base_url": "http://127.0.0.1:8/v1", "model": "from-the-environment"}}
    assert get_provider().model == "from-the-environment"


def test_staff_without_the_permission_cannot_connect_a_model(no_model: None, viewer_staff: Any) -> None:
    viewer = Client()
    viewer.force_login(viewer_staff)
    assert viewer.get("/admin/agents/modelendpoint/add/").status_code == 403
    assert 'id="connect-model"' not in viewer.get("/").content.decode()


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://127.0.0.1:11434/v1", True),
        ("http://ollama:11434/v1", True),  # a compose service name: no dot
        ("https://api.openai.com/v1", True),
        ("ftp://example.com/v1", False),
        ("http://:80/v1", False),
        ("http://host:99999/v1", False),
        ("127.0.0.1:11434", False),
    ],
)
def test_the_base_url_is_any_http_address_a_server_can_reach(url: str, ok: bool) -> None:
    from django.core.exceptions import ValidationError

    from agents.models import validate_endpoint_url

    if ok:
        validate_endpoint_url(url)
    else:
        with pytest.raises(ValidationError):
            validate_endpoint_url(url)


def test_only_superusers_connect_a_model_and_the_key_variable_must_name_a_key(
    no_model: None, admin_user: Any, django_user_model: Any
) -> None:
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user(username="ops", password="ops-pass-123", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__endswith="modelendpoint"))
    ops = Client()
    ops.force_login(staff)
    assert ops.get("/admin/agents/modelendpoint/add/").status_code == 403  # a model permission is not enough
    superuser = Client()
    superuser.force_login(admin_user)
    for name in ("SECRET_KEY", "DATABASE_URL", "lowercase_key", "HOME"):
        page = superuser.post(
            "/admin/agents/modelendpoint/add/",
            {"name": "default", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": name},
        ).content.decode()
        assert "errorlist" in page, name
    assert not ModelEndpoint.objects.exists()
