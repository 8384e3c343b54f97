"""Workflows as data: declared in the admin, checked on save, versioned; a session keeps its version."""

from __future__ import annotations

import copy
import datetime as dt
import html
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

import agents.workflows as agents_workflows
from agents.models import Agent, WorkflowDefinition, WorkflowVersion
from agents.tools.registry import tool_names
from agents.workflows import get_workflow, workflow_choices
from agents.workflows.spec import WorkflowSpecError, workflow_from_spec
from llm.scripted import ScriptedProvider
from sessions.models import ChatSession
from tests.api.conftest import token_client
from tests.world import make_agent
from web.admin.agents import EXAMPLE_DECLARATION
from web.admin.lists import workflow_states


def declaration(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(EXAMPLE_DECLARATION)
    spec.update(changes)
    return spec


def problems(spec: dict[str, Any], tools: list[str] | None = None) -> str:
    with pytest.raises(WorkflowSpecError) as caught:
        workflow_from_spec("callback", spec, tools=tools)
    return " | ".join(caught.value.problems)


def test_the_example_declaration_is_a_workflow_with_a_generated_decision() -> None:
    workflow = workflow_from_spec("callback", EXAMPLE_DECLARATION, tools=[])
    assert workflow.states == ("ASKING_PHONE", "ASKING_TOPIC", "DONE") and workflow.title == "Callback request"
    assert workflow.decision_schema.__name__ == "CallbackDecision"
    merged, errors = workflow.merge_slots({}, {"phone": "call me maybe", "topic": "my invoice"})
    assert merged == {"topic": "my invoice"} and errors and errors[0].startswith("phone:")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"transitions": {"ASKING_PHONE": ["NOWHERE"]}}, "transitions of ASKING_PHONE names unknown state 'NOWHERE'"),
        ({"transitions": {"ASKING_PHONE": ["ASKING_TOPIC"]}}, "no transition reaches DONE from ASKING_PHONE"),
        ({"initial_state": "START"}, "initial_state names unknown state 'START'"),
        ({"slots": {"phone": {"type": "string"}}}, "state ASKING_TOPIC collects unknown slot 'topic'"),
        ({"slots": {"phone": {"type": "colour"}}}, "slots.phone.type"),
        ({"states": []}, "states: List should have at least 1 item"),
        ({"colour": "blue"}, "colour: Extra inputs are not permitted"),
        (
            {"actions": {"DONE": {"tool": "send_fax", "success": "DONE", "failure": "DONE"}}},
            "the action of DONE uses tool 'send_fax', which is not registered",
        ),
        ({"slots": {"phone": {"pattern": "("}, "topic": {}}}, "pattern"),
    ],
)
def test_what_cannot_run_is_refused_with_a_message_that_names_it(change: dict[str, Any], expected: str) -> None:
    assert expected in problems(declaration(**change), tools=["search_memory"])


def _admin_post(client: Client, url: str, *, name: str, spec: Any, is_active: bool = True) -> Any:
    data = {
        "name": name,
        "spec": json.dumps(spec) if not isinstance(spec, str) else spec,
        "versions-TOTAL_FORMS": "0",
        "versions-INITIAL_FORMS": "0",
        "versions-MIN_NUM_FORMS": "0",
        "versions-MAX_NUM_FORMS": "1000",
    }
    if is_active:
        data["is_active"] = "on"
    return client.post(url, data)


@pytest.mark.django_db
def test_the_admin_refuses_a_broken_declaration_and_says_why(staff_client: Client) -> None:
    add = reverse("admin:agents_workflowdefinition_add")
    assert '"initial_state": "ASKING_PHONE"' in html.unescape(staff_client.get(add).content.decode())  # the example
    response = _admin_post(staff_client, add, name="callback", spec=declaration(initial_state="<b>START</b>"))
    page = response.content.decode()
    assert response.status_code == 200 and "initial_state names unknown state" in page
    assert "<b>START</b>" not in page and "&lt;b&gt;START&lt;/b&gt;" in page  # escaped
    response = _admin_post(staff_client, add, name="flight_booking", spec=declaration())
    assert response.status_code == 200 and "a workflow of the code" in response.content.decode()
    assert _admin_post(staff_client, add, name="callback", spec="{not json").status_code == 200
    assert not WorkflowDefinition.objects.exists()


def say(client: Any, session_id: str, message: str) -> dict[str, Any]:
    response = client.post(f"/api/sessions/{session_id}/messages/", {"message": message}, format="json")
    assert response.status_code == 201, response.content
    return dict(response.json())


@pytest.mark.django_db
def test_an_admin_defined_workflow_runs_and_an_edit_leaves_running_sessions_on_their_version(
    staff_client: Client, alice: Any, use_provider: Any
) -> None:
    add = reverse("admin:agents_workflowdefinition_add")
    assert _admin_post(staff_client, add, name="callback", spec=declaration()).status_code == 302
    definition = WorkflowDefinition.objects.get(name="callback")
    assert definition.version == 1 and ("callback", "Callback request") in workflow_choices()
    assert "ASKING_PHONE" in workflow_states()  # the admin's filters by state offer its states
    agent = Agent(name="Callbacks", slug="callbacks", system_prompt="You arrange callbacks.", workflow="callback")
    agent.full_clean()
    agent.save()

    model = ScriptedProvider()
    use_provider(model)
    client = token_client(alice)
    running = client.post("/api/sessions/", {"agent": "callbacks"}, format="json").json()
    assert running["state"] == "ASKING_PHONE"
    model.add({"next_state": "ASKING_TOPIC", "slots": {"phone": "+44 20 7946 0000"}}, "What is it about?")
    say(client, running["id"], "call me on +44 20 7946 0000")

    # The operator rewrites the workflow: the topic question becomes a subject question, in another state.
    edited = declaration()
    edited["states"][1] = {
        "name": "ASKING_SUBJECT",
        "instruction": "Find out the subject.",
        "collects": ["topic"],
        "requires": ["phone"],
        "question": "Which subject?",
    }
    edited["transitions"] = {
        "ASKING_PHONE": ["ASKING_SUBJECT"],
        "ASKING_SUBJECT": ["DONE"],
        "DONE": ["ASKING_PHONE"],
    }
    change = reverse("admin:agents_workflowdefinition_change", args=[definition.pk])
    assert _admin_post(staff_client, change, name="callback", spec=edited).status_code == 302
    definition.refresh_from_db()
    assert definition.version == 2 and WorkflowVersion.objects.filter(definition=definition).count() == 2
    assert _admin_post(staff_client, change, name="callback", spec=edited).status_code == 302
    definition.refresh_from_db()
    assert definition.version == 2  # saving the same declaration again is not a new version

    # The running session goes on in version 1: its state, its transitions, its questions.
    model.add({"next_state": "DONE", "slots": {"topic": "my invoice"}}, "We will call you.")
    say(client, running["id"], "about my invoice")
    session = ChatSession.objects.get(pk=running["id"])
    assert session.workflow_version == 1 and session.state == "DONE"
    assert session.data == {"phone": "+44 20 7946 0000", "topic": "my invoice"}
    decision_prompt = model.requests[-2].messages[0]["content"]
    assert "ALLOWED_NEXT_STATES: ASKING_PHONE, ASKING_TOPIC, DONE" in decision_prompt

    # A new session starts on version 2.
    fresh = client.post("/api/sessions/", {"agent": "callbacks"}, format="json").json()
    model.add({"next_state": "ASKING_SUBJECT", "slots": {"phone": "+44 20 7946 0001"}}, "Which subject?")
    say(client, fresh["id"], "+44 20 7946 0001")
    session = ChatSession.objects.get(pk=fresh["id"])
    assert session.workflow_version == 2 and session.state == "ASKING_SUBJECT"
    assert get_workflow("callback").version == 2 and get_workflow("callback", 1).states[1] == "ASKING_TOPIC"

    # A workflow a session runs on cannot be deleted (switch it off instead).
    delete = reverse("admin:agents_workflowdefinition_delete", args=[definition.pk])
    assert staff_client.post(delete, {"post": "yes"}).status_code == 403
    assert WorkflowDefinition.objects.filter(pk=definition.pk).exists()


def test_the_tools_an_action_may_use_are_the_registered_ones() -> None:
    spec = declaration(actions={"DONE": {"tool": "search_memory", "success": "DONE", "failure": "DONE"}})
    assert "search_memory" in tool_names()
    assert workflow_from_spec("callback", spec, tools=tool_names()).action_states == {"DONE": "search_memory"}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"slots": {"phone": {"type": "integer", "max_length": 5}, "topic": {}}},
            "max_length does not apply to a integer",
        ),
        ({"slots": {"phone": {"type": "date", "pattern": "x"}, "topic": {}}}, "pattern does not apply to a date"),
        ({"slots": {"phone": {"type": "string", "minimum": 1}, "topic": {}}}, "minimum does not apply to a string"),
    ],
)
def test_a_limit_that_does_not_fit_its_slot_type_is_refused(change: dict[str, Any], expected: str) -> None:
    assert expected in problems(declaration(**change))


def test_names_are_whole_words_short_enough_for_a_schema_name() -> None:
    with pytest.raises(WorkflowSpecError, match="a letter, then letters"):
        workflow_from_spec("callback\n", EXAMPLE_DECLARATION)
    with pytest.raises(WorkflowSpecError, match="at most 48"):
        workflow_from_spec("c" * 49, EXAMPLE_DECLARATION)
    assert len(workflow_from_spec("c" * 48, EXAMPLE_DECLARATION).decision_schema.__name__) <= 64


def test_a_value_of_the_wrong_json_type_is_dropped_alone_not_the_whole_decision() -> None:
    workflow = workflow_from_spec("callback", declaration(slots={"phone": {}, "topic": {"type": "integer"}}))
    decision = workflow.decision_schema.model_validate(
        {"next_state": "ASKING_TOPIC", "slots": {"phone": 5551234567, "topic": 2.5}}
    )
    merged, errors = workflow.merge_slots({}, decision.slots)
    assert merged == {} and [e.split(":")[0] for e in errors] == ["phone", "topic"]
    # A tool's structured output as JSON would carry it (a date as its text), checked by the slots.
    assert workflow.action_slots({"phone": dt.date(2026, 12, 1), "other": 1}) == {"phone": "2026-12-01"}


@pytest.mark.django_db
def test_a_session_on_a_stored_version_keeps_it_when_the_code_registers_the_same_name(staff_client: Client) -> None:
    add = reverse("admin:agents_workflowdefinition_add")
    assert _admin_post(staff_client, add, name="callback", spec=declaration()).status_code == 302
    impostor = workflow_from_spec("callback", declaration(title="Another", initial_state="DONE"))
    registry = agents_workflows._registry()
    registry["callback"] = impostor
    try:
        assert get_workflow("callback", 1).title == "Callback request"
        assert get_workflow("callback").title == "Another"  # a new session: the code's, by name
    finally:
        registry.pop("callback")


@pytest.mark.django_db
def test_two_operators_editing_at_once_the_later_save_is_refused_not_lost(staff_client: Client) -> None:
    add = reverse("admin:agents_workflowdefinition_add")
    assert _admin_post(staff_client, add, name="callback", spec=declaration()).status_code == 302
    definition = WorkflowDefinition.objects.get(name="callback")
    change = reverse("admin:agents_workflowdefinition_change", args=[definition.pk])
    first_version = definition.versions.get().pk  # the page both operators opened lists version 1

    def save(title: str, loaded: int) -> Any:
        data = {
            "name": "callback",
            "is_active": "on",
            "spec": json.dumps(declaration(title=title)),
            "loaded_version": str(loaded),
            "versions-TOTAL_FORMS": "1",
            "versions-INITIAL_FORMS": "1",
            "versions-MIN_NUM_FORMS": "0",
            "versions-MAX_NUM_FORMS": "1000",
            "versions-0-id": str(first_version),
            "versions-0-definition": str(definition.pk),
        }
        return staff_client.post(change, data)

    assert save("First operator's", loaded=1).status_code == 302
    refused = save("Second operator's", loaded=1)
    assert refused.status_code == 200 and "Someone saved this workflow since you opened it" in refused.content.decode()
    definition.refresh_from_db()
    assert definition.version == 2 and definition.spec["title"] == "First operator's"


@pytest.mark.django_db
def test_an_agent_keeps_a_switched_off_workflow_and_the_demo_model_stays_in_its_state(
    staff_client: Client, alice: Any
) -> None:
    add = reverse("admin:agents_workflowdefinition_add")
    assert _admin_post(staff_client, add, name="callback", spec=declaration()).status_code == 302
    agent = make_agent("chat", slug="callbacks", name="Callbacks", system_prompt="Callbacks.", workflow="callback")
    client = token_client(alice)
    session = client.post("/api/sessions/", {"agent": "callbacks"}, format="json").json()
    body = say(client, session["id"], "hello")  # the demo model: no script for this workflow
    assert body["turn"]["status"] == "completed" and body["session"]["state"] == "ASKING_PHONE"

    definition = WorkflowDefinition.objects.get(name="callback")
    change = reverse("admin:agents_workflowdefinition_change", args=[definition.pk])
    delete = reverse("admin:agents_workflowdefinition_delete", args=[definition.pk])
    assert staff_client.post(delete, {"post": "yes"}).status_code == 403  # an agent and a session use it
    WorkflowDefinition.objects.filter(pk=definition.pk).update(is_active=False)
    assert "callback" not in dict(workflow_choices())
    agent.is_active = False
    agent.full_clean()  # the agent can still be saved (switched off) on the workflow it has
    assert change  # the definition's page stays reachable


@pytest.mark.django_db
def test_the_shipped_agents_are_seeded_only_for_workflows_that_are_plugged_in(settings: Any) -> None:
    from agents.services import default_agents_ensure
    from agents.workflows import registry_reset

    settings.AGENT_WORKFLOWS = []
    registry_reset()
    try:
        assert [a.slug for a in default_agents_ensure()] == ["assistant"]
    finally:
        registry_reset()


def test_a_bad_plug_in_setting_stops_the_process_at_start_up_naming_it(tmp_path: Any) -> None:
    env = {**os.environ, "AGENT_EXTRA_TOOLS": "shop.tools.nowhere", "DATABASE_URL": "postgres://x@127.0.0.1:1/none"}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=settings_module_root(),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and "cannot import 'shop.tools.nowhere'" in done.stderr


def settings_module_root() -> str:
    return str(Path(__file__).resolve().parents[2])


@pytest.mark.django_db
def test_a_declared_state_label_is_what_people_read_in_the_chat(staff_client: Client, alice: Any) -> None:
    spec = declaration()
    spec["states"][0]["label"] = "Your phone number"
    workflow = workflow_from_spec("callback", spec, tools=[])
    assert workflow.state_label("ASKING_PHONE") == "Your phone number"
    assert workflow.state_label("ASKING_TOPIC") == "Asking topic"  # no label: the name in words
    too_long = declaration()
    too_long["states"][0]["label"] = "x" * 61
    assert "label" in problems(too_long)

    add = reverse("admin:agents_workflowdefinition_add")
    assert _admin_post(staff_client, add, name="callback", spec=spec).status_code == 302
    make_agent("chat", slug="callbacks", name="Callbacks", system_prompt="You arrange callbacks.", workflow="callback")
    web = Client()
    web.force_login(alice)
    agent = Agent.objects.get(slug="callbacks")
    response = web.post(reverse("chat-new"), {"agent": agent.pk})
    assert response.status_code == 302
    page = web.get(response["Location"]).content.decode()
    assert ">Your phone number</strong>" in page and ">Asking topic</li>" in page


@pytest.mark.django_db
def test_a_declared_workflow_runs_on_the_demo_model_and_hands_off_when_asked(
    staff_client: Client, alice: Any, caplog: Any
) -> None:
    """The demo model has no script for a workflow of yours: it stays in the state and reads no slots, and
    hands the chat to a person when asked. Its decision used to be built with an empty ``BaseModel()``, which
    pydantic refuses: every turn logged an error and asking for a person did nothing (the walk of 2026-12-03)."""
    add = reverse("admin:agents_workflowdefinition_add")
    assert _admin_post(staff_client, add, name="callback", spec=declaration()).status_code == 302
    make_agent("chat", slug="callbacks", name="Callbacks", system_prompt="You arrange callbacks.", workflow="callback")
    client = token_client(alice)
    session = client.post("/api/sessions/", {"agent": "callbacks"}, format="json").json()

    with caplog.at_level("WARNING"):
        say(client, session["id"], "Hello, I would like a callback.")
        assert ChatSession.objects.get(pk=session["id"]).state == "ASKING_PHONE"
        say(client, session["id"], "I want to talk to a human please")
    assert ChatSession.objects.get(pk=session["id"]).status == ChatSession.Status.NEEDS_HUMAN
    assert [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []


@pytest.mark.django_db
def test_the_admin_shows_a_declaration_as_indented_json_and_saves_it_as_before(staff_client: Client) -> None:
    """One key a line, indented, on the add form, on the change form and back after an error (it was one long
    line); what is typed is read and checked as before."""
    add = reverse("admin:agents_workflowdefinition_add")

    def box(page: Any) -> str:
        text = html.unescape(page.content.decode())
        return text.split('name="spec"', 1)[1].split(">", 1)[1].split("</textarea>", 1)[0]

    shown = box(staff_client.get(add))
    assert shown.strip() == json.dumps(EXAMPLE_DECLARATION, ensure_ascii=False, indent=2)
    assert '\n  "initial_state": "ASKING_PHONE",\n' in shown
    refused = _admin_post(staff_client, add, name="callback", spec=declaration(initial_state="NOWHERE"))
    assert '\n  "initial_state": "NOWHERE",\n' in box(refused)
    assert _admin_post(staff_client, add, name="callback", spec="{not json").status_code == 200
    assert box(_admin_post(staff_client, add, name="callback", spec="{not json")).strip() == "{not json"
    # Pretty or on one line, the same declaration saves.
    pretty = json.dumps(declaration(title="Call me"), indent=2)
    assert _admin_post(staff_client, add, name="callback", spec=pretty).status_code == 302
    definition = WorkflowDefinition.objects.get(name="callback")
    assert definition.spec["title"] == "Call me"
    change = reverse("admin:agents_workflowdefinition_change", args=[definition.pk])
    assert '\n  "title": "Call me",\n' in box(staff_client.get(change))
