"""Taking one's data out and bringing it back: JSON Lines through the API, the admin and the commands; an
import writes nothing of a file with a bad line (and names the line), is idempotent, reports what it skipped;
Mem0's export comes in; export, erase, import gives the same retrieval results."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from agents.models import Agent
from memory.models import Memory
from memory.retrieval import memories_for_prompt
from memory.services import memory_create
from orchestrator.runtime import turn_run
from people.erasure import person_erase
from people.portability import person_export
from sessions.models import ChatSession, Turn
from sessions.services import session_create

pytestmark = pytest.mark.django_db


def _life(user: Any, agent: Agent) -> None:
    session = session_create(user=user, agent=agent, title="Trip planning")
    turn_run(session=session, message="I am planning a trip to Lisbon in May.")
    turn_run(session=session, message="I prefer aisle seats.")
    old = memory_create(user=user, kind="semantic", text="The user lives in Porto.", fact_key="home_city")
    Memory.objects.filter(pk=old.pk).update(valid_to=timezone.now() - timedelta(days=3))
    memory_create(user=user, kind="semantic", text="The user lives in Lisbon.", fact_key="home_city", pinned=True)
    memory_create(user=user, kind="semantic", text="The user is allergic to peanuts.", importance=0.9)
    archived = memory_create(user=user, kind="semantic", text="The user liked jazz once.")
    Memory.objects.filter(pk=archived.pk).update(archived=True)
    memory_create(user=user, kind="episodic", text="User: we talked about trains to Madrid.")


def _retrieved(user: Any, query: str) -> list[str]:
    result = memories_for_prompt(user=user, query=query, budget_tokens=2000, touch=False)
    return [item.memory.text for item in result.items]


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


QUERIES = ["where does the user live", "food allergies", "seats on the plane", "trains"]


def test_export_erase_import_gives_back_the_same_retrieval(alice: Any, chat_agent: Agent) -> None:
    _life(alice, chat_agent)
    before = {q: _retrieved(alice, q) for q in QUERIES}
    assert any(before.values())
    exported = b"".join(_api(alice).get("/api/me/export/").streaming_content).decode()
    header = json.loads(exported.splitlines()[0])
    assert header["format"] == "agents-runtime-export" and header["version"] == 1
    person_erase(user=alice)
    assert not Memory.objects.filter(user=alice).exists()

    response = _api(alice).post("/api/me/import/", exported, content_type="application/x-ndjson")
    assert response.status_code == 200, response.content
    report = response.json()
    assert report["created"]["sessions"] == 1 and report["created"]["turns"] == 2
    assert report["created"]["memories"] == Memory.objects.filter(user=alice).count() >= 5
    assert {q: _retrieved(alice, q) for q in QUERIES} == before
    # History, pins and archives came back as they were.
    assert Memory.objects.get(user=alice, text="The user lives in Porto.").valid_to is not None
    assert Memory.objects.get(user=alice, text="The user lives in Lisbon.").pinned
    assert Memory.objects.get(user=alice, text="The user liked jazz once.").archived
    session = ChatSession.objects.get(user=alice)
    assert session.title == "Trip planning" and session.turns.count() == 2

    # Importing the same file again writes nothing, and says why for each line.
    again = _api(alice).post("/api/me/import/", exported, content_type="application/x-ndjson").json()
    assert again["created"] == {"sessions": 0, "turns": 0, "memories": 0}
    assert len(again["skipped"]) == len(exported.splitlines()) - 1
    assert {s["reason"] for s in again["skipped"]} >= {"this session is already there", "this memory is already there"}


def test_a_bad_line_is_named_and_nothing_is_written(alice: Any, bob: Any, chat_agent: Agent) -> None:
    _life(bob, chat_agent)
    lines = list(person_export(user=bob))
    lines.insert(4, '{"type": "memory", "kind": "semantic", "text": ""}\n')  # line 5: empty text
    response = _api(alice).post("/api/me/import/", "".join(lines), content_type="application/x-ndjson")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_import" and error["details"]["line"] == 5 and "text" in error["message"]
    assert not Memory.objects.filter(user=alice).exists() and not ChatSession.objects.filter(user=alice).exists()
    broken = "".join(lines[:3]) + "{not json\n"
    response = _api(alice).post("/api/me/import/", broken, content_type="application/x-ndjson")
    assert response.json()["error"]["details"]["line"] == 4
    headless = _api(alice).post("/api/me/import/", "".join(lines[1:3]), content_type="application/x-ndjson")
    assert headless.status_code == 400 and "header" in headless.json()["error"]["message"]


def test_someone_elses_export_comes_in_as_mine_without_touching_theirs(alice: Any, bob: Any, chat_agent: Agent) -> None:
    _life(bob, chat_agent)
    theirs = ChatSession.objects.get(user=bob)
    exported = "".join(person_export(user=bob))
    report = _api(alice).post("/api/me/import/", exported, content_type="application/x-ndjson").json()
    assert report["created"]["sessions"] == 1
    mine = ChatSession.objects.get(user=alice)
    assert mine.pk != theirs.pk and ChatSession.objects.get(pk=theirs.pk).user == bob  # a new id; theirs stays


def test_a_mem0_export_comes_in(alice: Any) -> None:
    mem0 = {
        "results": [
            {"id": "a1", "memory": "Prefers window seats", "created_at": "2026-03-01T10:00:00+00:00", "metadata": {}},
            {
                "id": "a2",
                "memory": "Vegetarian",
                "created_at": "2026-04-01T10:00:00+00:00",
                "metadata": {"importance": 0.8},
            },
        ]
    }
    response = _api(alice).post("/api/me/import/?source=mem0", json.dumps(mem0), content_type="application/json")
    assert response.status_code == 200 and response.json()["created"]["memories"] == 2
    veg = Memory.objects.get(user=alice, text="Vegetarian")
    assert veg.kind == "semantic" and veg.importance == 0.8 and veg.occurred_at.month == 4
    bad = _api(alice).post("/api/me/import/?source=mem0", '{"results": [{"id": "x"}]}', content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["details"]["line"] == 1


def test_the_commands_and_the_admin_action(alice: Any, bob: Any, staff: Any, chat_agent: Agent, tmp_path: Path) -> None:
    _life(alice, chat_agent)
    path = tmp_path / "alice.jsonl"
    call_command("export_person", "--user", "alice", "--output", str(path))
    assert json.loads(path.read_text().splitlines()[0])["format"] == "agents-runtime-export"
    call_command("import_person", str(path), "--user", "bob")
    assert Memory.objects.filter(user=bob, text="The user is allergic to peanuts.").exists()
    assert Turn.objects.filter(session__user=bob).count() == 2
    client = Client()
    client.force_login(staff)
    download = client.post("/admin/auth/user/", {"action": "export_person", "_selected_action": [alice.pk]})
    assert download["Content-Type"] == "application/x-ndjson"
    body = b"".join(download.streaming_content).decode()
    assert "The user is allergic to peanuts." in body and "Trip planning" in body


def test_importing_someone_elses_export_twice_writes_once(alice: Any, bob: Any, chat_agent: Agent) -> None:
    _life(bob, chat_agent)
    exported = "".join(person_export(user=bob))
    _api(alice).post("/api/me/import/", exported, content_type="application/x-ndjson")
    again = _api(alice).post("/api/me/import/", exported, content_type="application/x-ndjson").json()
    assert again["created"] == {"sessions": 0, "turns": 0, "memories": 0}
    assert ChatSession.objects.filter(user=alice).count() == 1


def test_an_imported_session_is_put_in_a_state_its_workflow_allows(alice: Any) -> None:
    from agents.services import default_agents_ensure

    default_agents_ensure()
    header = '{"format": "agents-runtime-export", "version": 1}\n'
    crafted = {
        "type": "session",
        "id": "3f0b7c1e-1111-4b6e-9a7a-2b5b9e0c0d01",
        "agent": "flight-booking",
        "workflow": "flight_booking",
        "state": "BOOKING",  # would run the booking tool on the next message
        "data": {"origin": "London", "destination": "Paris", "passengers": 250},
    }
    fact_old = memory_create(user=alice, kind="semantic", text="The user lives in Rome.", fact_key="home_city")
    fact = {"type": "memory", "kind": "semantic", "text": "The user lives in Paris.", "fact_key": "home_city"}
    body = header + json.dumps(crafted) + "\n" + json.dumps(fact) + "\n"
    assert _api(alice).post("/api/me/import/", body, content_type="application/x-ndjson").status_code == 200
    session = ChatSession.objects.get(user=alice)
    assert session.state == "IDLE" and session.data == {}
    fact_old.refresh_from_db()
    assert fact_old.valid_to is not None  # the imported fact replaced it: one current value per key
    current = Memory.objects.filter(user=alice, fact_key="home_city", valid_to__isnull=True)
    assert list(current.values_list("text", flat=True)) == ["The user lives in Paris."]


def test_mem0_duplicates_that_differ_by_case_come_in_once(alice: Any) -> None:
    mem0 = [{"memory": "Likes tea"}, {"memory": "likes  TEA"}, {"memory": "Owns a cat"}]
    response = _api(alice).post("/api/me/import/?source=mem0", json.dumps(mem0), content_type="application/json")
    assert response.status_code == 200, response.content
    assert response.json()["created"]["memories"] == 2


def test_an_import_may_be_bigger_than_other_requests(alice: Any, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    settings.LARGE_BODY_PATHS = {"/api/me/import/": 1024 * 1024}
    lines = ['{"format": "agents-runtime-export", "version": 1}']
    lines += [
        json.dumps({"type": "memory", "kind": "semantic", "text": f"Fact number {i} about the user."})
        for i in range(80)
    ]
    body = "\n".join(lines) + "\n"
    assert len(body.encode()) > 2048
    response = _api(alice).post("/api/me/import/", body, content_type="application/x-ndjson")
    assert response.status_code == 200 and response.json()["created"]["memories"] == 80
    assert (
        _api(alice).post("/api/memories/", {"kind": "semantic", "text": "x" * 3000}, format="json").status_code == 413
    )


HEADER = '{"format": "agents-runtime-export", "version": 1}\n'
SESSION = {
    "type": "session",
    "id": "3f0b7c1e-2222-4b6e-9a7a-2b5b9e0c0d01",
    "agent": "chat",
    "workflow": "free_chat",
    "state": "CHATTING",
}
TURN = {"type": "turn", "session": SESSION["id"], "seq": 1, "user_message": "Hello", "status": "completed"}
MEMORY = {"type": "memory", "kind": "semantic", "text": "The user likes figs."}


@pytest.mark.parametrize(
    ("record", "field"),
    [
        # 1 BC once in UTC: PostgreSQL stored it, and no Python could read it back.
        ({**SESSION, "created_at": "0001-01-01T00:00:00+14:00"}, "created_at"),
        ({**MEMORY, "occurred_at": "9999-12-31T23:59:59-14:00"}, "occurred_at"),
        ({**MEMORY, "valid_to": "0001-01-01T00:00:00Z"}, "valid_to"),
        ({**TURN, "completed_at": "9999-12-31T23:59:59Z"}, "completed_at"),
        ({**TURN, "seq": 10**20}, "seq"),
        ({**SESSION, "summary_through_seq": 10**20}, "summary_through_seq"),
        ({**TURN, "user_message": "Hello \ud800"}, "user_message"),
        ({**SESSION, "data": {"city": "Lis\udc00bon"}}, "data"),
    ],
)
def test_a_value_that_cannot_be_stored_is_refused_by_name_and_nothing_is_written(
    alice: Any, chat_agent: Agent, record: dict[str, Any], field: str
) -> None:
    lines = [SESSION, MEMORY] if record["type"] != "session" else [MEMORY]
    body = HEADER + "".join(json.dumps(r) + "\n" for r in [*lines, record])  # the bad record on the last line
    response = _api(alice).post("/api/me/import/", body, content_type="application/x-ndjson")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_import" and error["details"]["line"] == len(lines) + 2
    assert error["message"].startswith(f"line {len(lines) + 2}: {field}: ")
    assert "Value error" not in error["message"]  # what is wrong, not how pydantic files it
    assert not Memory.objects.filter(user=alice).exists() and not ChatSession.objects.filter(user=alice).exists()


def test_a_mem0_date_that_cannot_be_stored_names_its_item(alice: Any) -> None:
    mem0 = [{"memory": "Likes tea"}, {"memory": "Owns a cat", "created_at": "0001-01-01T00:00:00+14:00"}]
    response = _api(alice).post("/api/me/import/?source=mem0", json.dumps(mem0), content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["details"]["line"] == 2 and "occurred_at" in error["message"]
    assert not Memory.objects.filter(user=alice).exists()


def test_the_dates_at_the_edges_come_in(alice: Any, chat_agent: Agent) -> None:
    records = [
        {**SESSION, "created_at": "0001-01-02T00:00:00Z"},
        {**MEMORY, "occurred_at": "9999-12-30T23:59:59Z", "valid_from": "0001-01-02T00:00:00+00:00"},
    ]
    body = HEADER + "".join(json.dumps(r) + "\n" for r in records)
    response = _api(alice).post("/api/me/import/", body, content_type="application/x-ndjson")
    assert response.status_code == 200, response.content
    assert ChatSession.objects.get(user=alice).created_at.year == 1
    assert Memory.objects.get(user=alice).occurred_at.year == 9999
    assert _api(alice).get("/api/sessions/").status_code == 200
    assert _api(alice).get("/api/memories/").status_code == 200
