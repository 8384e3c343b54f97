from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import LLMCall
from observability.services import alerts_evaluate
from tests.observability.builders import build_death_spiral, build_healthy_run, make_agent

pytestmark = pytest.mark.django_db


def test_anonymous_is_sent_to_login_and_non_staff_is_refused(client: Client, alice: Any) -> None:
    response = client.get("/ops/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=/ops/")
    client.force_login(alice)
    assert client.get("/ops/").status_code == 403
    assert client.get(f"/ops/sessions/{uuid.uuid4()}/").status_code == 403


def test_staff_need_the_view_permissions_on_sessions_and_turns(client: Client, django_user_model: Any) -> None:
    from django.contrib.auth.models import Permission

    bare = django_user_model.objects.create_user(username="bare-staff", password="x-pass-123", is_staff=True)
    client.force_login(bare)
    assert client.get("/ops/").status_code == 403  # staff, but may not read sessions: not their owners either
    assert client.get(f"/ops/sessions/{uuid.uuid4()}/").status_code == 403
    bare.user_permissions.set(Permission.objects.filter(codename="view_chatsession"))
    bare = django_user_model.objects.get(pk=bare.pk)  # permissions are cached on the instance
    client.force_login(bare)
    assert client.get("/ops/").status_code == 403  # sessions without turns is not enough
    bare.user_permissions.add(Permission.objects.get(codename="view_turn"))
    client.force_login(django_user_model.objects.get(pk=bare.pk))
    assert client.get("/ops/").status_code == 200


def test_dashboard_shows_charts_figures_and_open_alerts(client: Client, staff: Any, alice: Any) -> None:
    now = timezone.now()
    spiral = make_agent("spiral")
    session = build_death_spiral(user=alice, agent=spiral, now=now)
    alerts_evaluate(now=now)
    client.force_login(staff)

    response = client.get("/ops/?window=6h")
    assert response.status_code == 200
    html = response.content.decode()
    # Twelve inline SVG charts, drawn on the server: no script, nothing loaded from elsewhere.
    assert html.count("<svg") == 12
    assert html.count("<polyline") >= 8
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["']https?://""", html)
    assert "Retry rate above 10% over 15 minutes" in html
    assert html.count('class="alert-open"') == response.context["open_alerts"].__len__() > 0
    assert response.context["current"].resets == 7
    assert response.context["trends"]["tokens"].change > 0.3
    # The spiralling session is listed, with a link to its health page.
    assert f"/ops/sessions/{session.id}/" in html

    filtered = client.get("/ops/?window=1h&agent=spiral")
    assert filtered.status_code == 200
    assert filtered.context["agent"] == spiral
    start, end = filtered.context["start"], filtered.context["end"]
    assert end - start == dt.timedelta(hours=1) and start <= now - dt.timedelta(minutes=55) and end > now
    in_window = LLMCall.objects.filter(agent=spiral, created_at__gte=start, created_at__lt=end).count()
    assert filtered.context["current"].calls == in_window > 40


def test_dashboard_with_no_data(client: Client, staff: Any) -> None:
    client.force_login(staff)
    response = client.get("/ops/?window=nonsense")
    assert response.status_code == 200
    assert response.context["window_key"] == "6h"
    assert "No open alerts." in response.content.decode()
    # Rates and percentiles have no value without calls; counts are a flat zero line.
    charts = {c.title: c for c in response.context["charts"]}
    assert charts["Retry rate"].empty and charts["Time to first token p95"].empty
    assert not charts["FSM resets"].empty and charts["FSM resets"].latest == 0
    assert response.content.decode().count("no data") == 7


def test_session_health_names_the_spiral(client: Client, staff: Any, alice: Any) -> None:
    now = timezone.now()
    session = build_death_spiral(user=alice, agent=make_agent("spiral"), now=now)
    (healthy, *_) = build_healthy_run(user=alice, agent=make_agent("calm"), now=now, sessions=1)
    client.force_login(staff)

    response = client.get(f"/ops/sessions/{session.id}/")
    assert response.status_code == 200
    health = response.context["health"]
    assert health.verdict == "spiralling"
    assert health.resets == 7
    assert health.state_revisits == 3
    html = response.content.decode()
    assert "Verdict: spiralling" in html
    assert "FSM reset" in html and "re-entered earlier states" in html and "step limit" in html

    calm = client.get(f"/ops/sessions/{healthy.id}/")
    assert calm.context["health"].verdict == "healthy"
    assert "Verdict: healthy" in calm.content.decode()

    assert client.get(f"/ops/sessions/{uuid.uuid4()}/").status_code == 404


def test_the_dashboard_says_how_each_agent_decides_and_what_its_turns_cost(
    client: Client, staff: Any, alice: Any
) -> None:
    """Issue 54: /ops/ shows which path each agent runs (the decision inside the reply: one call; a routing or
    workflow call first: two) and the model calls its turns made, measured from the turns run here."""
    from orchestrator.runtime import turn_run
    from sessions.services import session_create
    from tests.world import make_agent as world_agent

    helper = world_agent("memory", slug="helper")  # tools, on the demo model: decides in the reply
    booker = world_agent("booking", slug="booker")
    chat = world_agent("chat", slug="plain")
    for agent in (helper, helper, booker):
        turn_run(session=session_create(user=alice, agent=agent), message="Hello there, what can you do?")
    client.force_login(staff)
    response = client.get("/ops/?window=1h")
    rows = {row["agent"].slug: row for row in response.context["decisions"]}
    assert (rows["helper"]["path"], rows["booker"]["path"], rows["plain"]["path"]) == (
        "in_reply",
        "workflow_in_reply",
        "none",
    )
    assert rows["helper"]["turns"] == 2 and rows["helper"]["turn_calls_per_turn"] == 1.0
    assert rows["booker"]["turn_calls_per_turn"] == 1.0  # the workflow's decision inside the reply's call
    assert "turns" not in rows["plain"] and chat.slug == "plain"
    html = response.content.decode()
    assert 'data-path="in_reply"' in html and "one call when no tool is needed" in html
    assert 'data-path="workflow_in_reply"' in html and "the reply streamed after it" in html
