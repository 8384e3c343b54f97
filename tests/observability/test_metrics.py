from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from observability.services import alerts_evaluate
from tests.observability.builders import build_death_spiral, build_healthy_run, make_agent

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.216.34"  # a public address (documentation ranges count as private)


def _families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _value(family: Any, sample_name: str, **labels: str) -> float:
    for sample in family.samples:
        if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    raise AssertionError(f"no sample {sample_name} {labels}")


def test_metrics_parse_and_match_the_records(client: Client, alice: Any, settings: Any) -> None:
    settings.METRICS_TOKEN = "s3cret"
    now = timezone.now()
    build_death_spiral(user=alice, agent=make_agent("spiral"), now=now)
    build_healthy_run(user=alice, agent=make_agent("calm"), now=now, sessions=2)
    alerts_evaluate(now=now)

    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret", REMOTE_ADDR=PUBLIC)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    families = _families(response.content.decode())

    calls = families["agent_llm_calls"]
    assert calls.type == "counter"
    assert _value(calls, "agent_llm_calls_total", agent="spiral") == 100
    assert _value(calls, "agent_llm_calls_total", agent="calm") == 96
    assert _value(families["agent_llm_calls_retried"], "agent_llm_calls_retried_total", agent="spiral") == 8
    assert _value(families["agent_llm_retries"], "agent_llm_retries_total", agent="spiral") == 16
    assert _value(families["agent_fsm_resets"], "agent_fsm_resets_total", agent="spiral") == 7
    assert _value(families["agent_fsm_resets"], "agent_fsm_resets_total", agent="calm") == 0
    assert _value(families["agent_step_limit_hits"], "agent_step_limit_hits_total", agent="spiral") == 8
    assert _value(families["agent_context_degradations"], "agent_context_degradations_total", agent="spiral") == 8
    assert _value(families["agent_tool_invocations"], "agent_tool_invocations_total", agent="calm") == 48

    tokens = families["agent_llm_prompt_tokens"]
    assert tokens.type == "histogram"
    assert _value(tokens, "agent_llm_prompt_tokens_count", agent="calm") == 96
    assert _value(tokens, "agent_llm_prompt_tokens_bucket", agent="calm", le="512") == 0
    # Calm prompts are 1000, 1020 or 1040 tokens (chat) and 600 (slots): 16 of the 96 are above 1024.
    assert _value(tokens, "agent_llm_prompt_tokens_bucket", agent="calm", le="1024") == 80
    assert _value(tokens, "agent_llm_prompt_tokens_bucket", agent="calm", le="2048") == 96
    assert _value(tokens, "agent_llm_prompt_tokens_bucket", agent="spiral", le="+Inf") == 100
    # The same figures under the GenAI semantic conventions' name.
    usage = families["gen_ai_client_token_usage"]
    assert usage.type == "histogram"
    labels = {"agent": "calm", "gen_ai_operation_name": "chat", "gen_ai_token_type": "input"}
    assert _value(usage, "gen_ai_client_token_usage_bucket", le="1024", **labels) == 80
    assert _value(usage, "gen_ai_client_token_usage_count", **labels) == 96
    ttft = families["agent_llm_ttft_seconds"]
    assert _value(ttft, "agent_llm_ttft_seconds_bucket", agent="spiral", le="8.0") == 92
    assert _value(ttft, "agent_llm_ttft_seconds_bucket", agent="spiral", le="16.0") == 100

    rate = families["agent_llm_retry_rate_15m"]
    assert _value(rate, "agent_llm_retry_rate_15m", agent="spiral") == pytest.approx(0.5)
    open_alerts = families["agent_alerts_open"]
    assert _value(open_alerts, "agent_alerts_open", rule="Retry rate above 10% over 15 minutes", scope="spiral") == 1


def test_metrics_refuse_without_the_token(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = "s3cret"
    settings.METRICS_ALLOW_INTERNAL = False
    assert client.get("/metrics", REMOTE_ADDR=PUBLIC).status_code == 401
    assert client.get("/metrics", REMOTE_ADDR=PUBLIC, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    # With a token configured, even loopback must present it.
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", REMOTE_ADDR=PUBLIC, HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_without_a_token_only_loopback_may_scrape(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOW_INTERNAL = False
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 401
    assert client.get("/metrics", REMOTE_ADDR=PUBLIC).status_code == 401


@pytest.mark.parametrize("header", ["HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP"])
def test_behind_a_proxy_on_the_same_host_loopback_is_not_trusted(client: Client, settings: Any, header: str) -> None:
    """gunicorn behind nginx sees every internet client as 127.0.0.1: a forwarded request needs the token."""
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOW_INTERNAL = True
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1", **{header: PUBLIC}).status_code == 401
    settings.METRICS_TOKEN = "s3cret"
    authorized = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer s3cret", **{header: PUBLIC})
    assert authorized.status_code == 200


def test_allow_internal_admits_private_networks_only(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = "s3cret"
    settings.METRICS_ALLOW_INTERNAL = True
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.168.0.5").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR=PUBLIC).status_code == 401


def test_an_empty_database_still_exposes_valid_metrics(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    families = _families(response.content.decode())
    assert families["agent_llm_calls"].type == "counter"
    assert families["agent_llm_calls"].samples == []


def test_metrics_count_the_calls_and_tokens_of_turns_by_purpose(client: Client, alice: Any, settings: Any) -> None:
    """Issue 54: what turns cost, by what each call was for. A booking turn on the demo model decides inside its
    reply's call: one "reply" call, no "slots" call."""
    from agents.models import LLMCall
    from orchestrator.runtime import turn_run
    from sessions.services import session_create
    from tests.world import make_agent as world_agent

    settings.METRICS_TOKEN = "s3cret"
    booker = world_agent("booking", slug="booker")
    turn_run(session=session_create(user=alice, agent=booker), message="I want to fly from Lisbon to Oslo")
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret", REMOTE_ADDR=PUBLIC)
    families = _families(response.content.decode())

    reply = LLMCall.objects.get(agent=booker, purpose="reply")
    calls = families["agent_llm_calls_15m"]
    assert _value(calls, "agent_llm_calls_15m", agent="booker", purpose="reply") == 1
    assert not [s for s in calls.samples if s.labels == {"agent": "booker", "purpose": "slots"}]
    prompt = families["agent_llm_prompt_tokens_15m"]
    assert _value(prompt, "agent_llm_prompt_tokens_15m", agent="booker", purpose="reply") == reply.prompt_tokens > 0
    done = families["agent_llm_completion_tokens_15m"]
    assert _value(done, "agent_llm_completion_tokens_15m", agent="booker", purpose="reply") == reply.completion_tokens
