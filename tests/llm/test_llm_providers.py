"""Choosing a provider, sharing it across threads, the call records, the admin, and the scripted fake."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from agents.models import LLMCall
from llm.base import CallContext, LLMRateLimited, TruncatedOutputError
from llm.demo import DemoModel
from llm.openai_compat import OpenAICompatibleProvider
from llm.providers import get_provider
from llm.scripted import ScriptedProvider, ScriptedReply
from tests.fakes import openai_server as fake
from tests.fakes.openai_server import FakeOpenAIServer
from tests.world import make_agent

MESSAGES = [{"role": "user", "content": "Hello"}]


@pytest.mark.django_db
def test_no_profile_means_the_demo_model(settings: Any) -> None:
    settings.LLM_PROFILES = {}
    assert isinstance(get_provider(), DemoModel)
    assert get_provider(agent=make_agent()).is_demo


@pytest.mark.django_db
def test_the_default_profile_and_the_agent_overrides(settings: Any, fake_openai: FakeOpenAIServer) -> None:
    settings.LLM_PROFILES = {
        "default": fake_openai.profile(model="big-model", cheap_model="small-model"),
        "other": fake_openai.profile(model="other-model"),
    }
    provider = get_provider()
    assert isinstance(provider, OpenAICompatibleProvider) and not provider.is_demo
    assert provider.model == "big-model"
    assert get_provider(cheap=True).model == "small-model"
    assert get_provider(agent=make_agent(model="agent-model")).model == "agent-model"
    assert get_provider(agent=make_agent(endpoint="other")).model == "other-model"
    assert get_provider(agent=make_agent(endpoint="demo")).is_demo

    fake_openai.enqueue(fake.reply("from the endpoint"))
    assert get_provider(agent=make_agent(model="agent-model")).complete(MESSAGES, ctx=CallContext()).text == (
        "from the endpoint"
    )
    assert fake_openai.chat_requests()[0].body["model"] == "agent-model"


@pytest.mark.django_db
def test_a_named_profile_that_does_not_exist_is_a_configuration_error(settings: Any) -> None:
    settings.LLM_PROFILES = {}
    with pytest.raises(ImproperlyConfigured, match="gateway"):
        get_provider(agent=make_agent(endpoint="gateway"))


@pytest.mark.django_db
def test_an_incomplete_profile_is_a_configuration_error(settings: Any) -> None:
    settings.LLM_PROFILES = {"default": {"base_url": "http://127.0.0.1:1/v1", "model": ""}}
    with pytest.raises(ImproperlyConfigured, match="model"):
        get_provider()
    settings.LLM_PROFILES = {"default": {"base_url": "http://127.0.0.1:1/v1", "model": "m", "read_timeout": "soon"}}
    with pytest.raises(ImproperlyConfigured, match="read_timeout|invalid"):
        get_provider()


@pytest.mark.django_db
def test_the_sdk_client_is_shared_per_profile(settings: Any, fake_openai: FakeOpenAIServer) -> None:
    settings.LLM_PROFILES = {"default": fake_openai.profile()}
    first, second = get_provider(), get_provider()
    assert isinstance(first, OpenAICompatibleProvider) and isinstance(second, OpenAICompatibleProvider)
    assert first._client is second._client


@pytest.mark.django_db(transaction=True)
def test_one_provider_serves_many_threads(settings: Any, fake_openai: FakeOpenAIServer) -> None:
    settings.LLM_PROFILES = {"default": fake_openai.profile()}
    provider = get_provider()
    fake_openai.enqueue(*[fake.reply("same answer") for _ in range(8)])
    results: list[str] = []
    errors: list[Exception] = []

    def ask() -> None:
        try:
            results.append(provider.complete(MESSAGES, ctx=CallContext()).text)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert results == ["same answer"] * 8
    assert LLMCall.objects.filter(outcome="ok").count() == 8


@pytest.mark.django_db(transaction=True)
def test_the_record_of_a_call_whose_session_was_deleted_meanwhile_is_kept_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A session (and turn) deleted while the model answered: the record is kept, its references cleared, as the
    # deletion clears them on the records written before it; no foreign-key error, nothing logged.
    provider = ScriptedProvider(["still answered"])
    with caplog.at_level(logging.ERROR, logger="llm.recording"):
        completion = provider.complete(MESSAGES, ctx=CallContext(session_id=uuid.uuid4(), turn_id=987654321))
    assert completion.text == "still answered"
    record = LLMCall.objects.get()
    assert (record.session_id, record.turn_id, record.outcome) == (None, None, "ok")
    assert "could not record LLM call" not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_database_error_while_recording_does_not_break_the_call(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    import agents.call_records

    def database_gone(calls: object) -> None:
        raise OperationalError("the server closed the connection unexpectedly")

    monkeypatch.setattr(agents.call_records, "llm_calls_insert", database_gone)
    provider = ScriptedProvider(["still answered"])
    with caplog.at_level(logging.ERROR, logger="llm.recording"):
        completion = provider.complete(MESSAGES, ctx=CallContext())
    assert completion.text == "still answered"
    assert LLMCall.objects.count() == 0
    assert "could not record LLM call" in caplog.text


@pytest.mark.django_db
def test_scripted_errors_are_recorded_with_their_outcome() -> None:
    provider = ScriptedProvider([LLMRateLimited("scripted 429"), ScriptedReply(text="cut", cut_stream=True)])
    with pytest.raises(LLMRateLimited):
        provider.complete(MESSAGES, ctx=CallContext())
    stream = provider.stream(MESSAGES, ctx=CallContext())
    with pytest.raises(TruncatedOutputError, match="cut off"):
        list(stream)
    assert list(LLMCall.objects.order_by("id").values_list("outcome", flat=True)) == ["rate_limited", "truncated"]
    assert [r.streamed for r in provider.requests] == [False, True]


@pytest.mark.django_db
def test_an_abandoned_stream_is_recorded() -> None:
    provider = ScriptedProvider(["one two three four"])
    stream = iter(provider.stream(MESSAGES, ctx=CallContext()))
    assert next(stream) == "one "
    stream.close()  # type: ignore[attr-defined]
    call = LLMCall.objects.get()
    assert call.outcome == "error" and "abandoned" in call.error


@pytest.mark.django_db
def test_the_admin_shows_calls_read_only_and_agents_with_fieldsets(staff: Any, settings: Any) -> None:
    settings.LLM_PROFILES = {"default": {"base_url": "http://x/v1", "model": "m", "api_key_env": "SECRET_KEY_VAR"}}
    agent = make_agent()
    ScriptedProvider(["hi"]).complete(MESSAGES, ctx=CallContext(agent_id=agent.pk))
    call = LLMCall.objects.get()
    client = Client()
    client.force_login(staff)

    listing = client.get("/admin/agents/llmcall/?outcome__exact=ok")
    assert listing.status_code == 200 and "scripted" in listing.content.decode()
    assert client.get("/admin/agents/llmcall/add/").status_code == 403
    detail = client.get(f"/admin/agents/llmcall/{call.pk}/change/")
    assert detail.status_code == 200 and 'name="outcome"' not in detail.content.decode()
    assert client.post(f"/admin/agents/llmcall/{call.pk}/delete/").status_code == 403

    page = client.get(f"/admin/agents/agent/{agent.pk}/change/").content.decode()
    assert "Context budget" in page and "Configured profiles: default" in page
    assert "SECRET_KEY_VAR" not in page


def test_a_models_json_schema_is_built_once_and_handed_out_as_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every structured call needs its schema twice (the instruction and ``response_format``), and pydantic builds
    it afresh on each ``model_json_schema()``: the provider builds it once per class, hands out copies (a caller
    that cleans one for tool calling changes no one else's), and forgets a class made at run time with it."""
    import gc
    import weakref

    from pydantic import BaseModel, create_model

    from llm.provider_base import json_schema_of, schema_instruction, structured

    class Answer(BaseModel):
        verdict: str
        confidence: float = 0.5

    built = []
    original = Answer.model_json_schema

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        built.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(Answer, "model_json_schema", counted)
    first = json_schema_of(Answer)
    assert first == original()
    first["properties"].clear()  # the caller's own copy
    assert json_schema_of(Answer)["properties"].keys() == {"verdict", "confidence"}
    assert '"verdict"' in schema_instruction(Answer)
    assert len(built) == 1

    made = create_model("MadeAtRunTime", answer=(str, ...))
    json_schema_of(made)
    gone = weakref.ref(made)
    del made
    gc.collect()
    assert gone() is None and all(cls.__name__ != "MadeAtRunTime" for cls in list(structured._schemas.keys()))


def test_a_schema_that_computes_a_part_of_itself_is_built_each_time() -> None:
    """A model whose JSON schema reads a setting when built (``json_schema_extra`` a function: the http tool's size
    limit) is not kept: a changed setting shows in the next call's schema."""
    from pydantic import BaseModel, ConfigDict

    from llm.provider_base import json_schema_of

    limit = {"now": 10}

    def current(schema: dict[str, Any]) -> None:
        schema["maxBytes"] = limit["now"]

    class Fetch(BaseModel):
        model_config = ConfigDict(json_schema_extra=current)
        url: str

    assert json_schema_of(Fetch)["maxBytes"] == 10
    limit["now"] = 20
    assert json_schema_of(Fetch)["maxBytes"] == 20
