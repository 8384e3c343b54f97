"""Memories through the API: create, list, retrieve, update (re-embedding), delete, search."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from memory.models import Memory
from memory.selectors import memories_in_force
from tests.api.conftest import assert_error


@pytest.mark.django_db
def test_memory_lifecycle(alice: Any, alice_client: APIClient) -> None:
    created = alice_client.post(
        "/api/memories/",
        {"kind": "semantic", "text": "Home airport is Oslo Gardermoen.", "fact_key": "home_airport"},
        format="json",
    )
    assert created.status_code == 201
    memory_id = created.json()["id"]
    stored = Memory.objects.get(pk=memory_id)
    assert stored.user == alice and stored.embedding is not None and stored.fact_key == "home_airport"
    assert "embedding" not in created.json() and "content_hash" not in created.json()

    assert alice_client.get(f"/api/memories/{memory_id}/").json()["text"] == "Home airport is Oslo Gardermoen."
    # The same text again is the same memory, not a new one: 200, not 201.
    again = alice_client.post(
        "/api/memories/", {"kind": "semantic", "text": "Home airport is Oslo Gardermoen."}, format="json"
    )
    assert again.status_code == 200 and again.json()["id"] == memory_id
    assert [m["id"] for m in alice_client.get("/api/memories/").json()["results"]] == [memory_id]

    old_vector = list(stored.embedding)
    patched = alice_client.patch(
        f"/api/memories/{memory_id}/", {"text": "Home airport is Bergen.", "pinned": True}, format="json"
    )
    assert patched.status_code == 200 and patched.json()["pinned"] is True
    stored.refresh_from_db()
    assert stored.text == "Home airport is Bergen." and list(stored.embedding) != old_vector

    assert alice_client.delete(f"/api/memories/{memory_id}/").status_code == 204
    assert not Memory.objects.filter(pk=memory_id).exists()
    assert_error(alice_client.get(f"/api/memories/{memory_id}/"), 404, "not_found")


@pytest.mark.django_db
def test_list_filters_by_kind_and_hides_archived(alice_client: APIClient) -> None:
    ids = {}
    for kind, text in [
        ("semantic", "Vegetarian meals."),
        ("episodic", "Booked Paris in May."),
        ("procedural", "Ask before booking."),
    ]:
        ids[kind] = alice_client.post("/api/memories/", {"kind": kind, "text": text}, format="json").json()["id"]
    assert [m["id"] for m in alice_client.get("/api/memories/", {"kind": "episodic"}).json()["results"]] == [
        ids["episodic"]
    ]
    assert_error(alice_client.get("/api/memories/", {"kind": "dream"}), 400, "invalid")
    alice_client.patch(f"/api/memories/{ids['semantic']}/", {"archived": True}, format="json")
    visible = {m["id"] for m in alice_client.get("/api/memories/").json()["results"]}
    assert visible == {ids["episodic"], ids["procedural"]}
    everything = {m["id"] for m in alice_client.get("/api/memories/", {"archived": "true"}).json()["results"]}
    assert everything == set(ids.values())


@pytest.mark.django_db
def test_list_omits_expired_memories_like_every_other_door(alice: Any, alice_client: APIClient) -> None:
    """The list shows the memories in force (``memory.selectors.memories_in_force``), as MCP's
    ``list_memories`` and the retriever do: an expired, superseded or not-yet-valid memory is left out;
    ``?archived=true`` still lists all of one's memories."""
    ids = {
        name: alice_client.post("/api/memories/", {"kind": "semantic", "text": text}, format="json").json()["id"]
        for name, text in [
            ("kept", "Likes window seats."),
            ("expired", "Is in Lisbon this week."),
            ("superseded", "Lives in Oslo."),
            ("later", "Will live in Bergen."),
        ]
    }
    now = timezone.now()
    Memory.objects.filter(pk=ids["expired"]).update(expires_at=now - timedelta(minutes=1))
    Memory.objects.filter(pk=ids["superseded"]).update(valid_to=now - timedelta(minutes=1))
    Memory.objects.filter(pk=ids["later"]).update(valid_from=now + timedelta(days=1))
    listed = [m["id"] for m in alice_client.get("/api/memories/").json()["results"]]
    assert listed == [ids["kept"]]
    assert [m.pk for m in memories_in_force(user=alice)] == listed
    everything = {m["id"] for m in alice_client.get("/api/memories/", {"archived": "true"}).json()["results"]}
    assert everything == set(ids.values())


@pytest.mark.django_db
def test_search_uses_the_retriever_and_explains_itself(alice_client: APIClient) -> None:
    wanted = alice_client.post(
        "/api/memories/", {"kind": "semantic", "text": "Prefers window seats on flights."}, format="json"
    ).json()["id"]
    alice_client.post("/api/memories/", {"kind": "semantic", "text": "Allergic to peanuts."}, format="json")
    body = alice_client.get("/api/memories/search/", {"q": "window seats on flights", "budget_tokens": 500}).json()
    assert body["query"] == "window seats on flights"
    assert body["items"] and body["items"][0]["memory"]["id"] == wanted
    assert body["total_tokens"] == sum(item["tokens"] for item in body["items"]) <= 500
    reported = {c["id"]: c for c in body["report"]["candidates"]}
    assert reported[wanted]["kept"] is True and reported[wanted]["reason"]
    assert_error(alice_client.get("/api/memories/search/"), 400, "invalid")


@pytest.mark.django_db
def test_patch_validates(alice_client: APIClient) -> None:
    memory_id = alice_client.post("/api/memories/", {"kind": "semantic", "text": "Likes tea."}, format="json").json()[
        "id"
    ]
    error = assert_error(
        alice_client.patch(f"/api/memories/{memory_id}/", {"importance": 7}, format="json"), 400, "invalid"
    )
    assert "importance" in error["details"]["fields"]
    assert Memory.objects.get(pk=memory_id).importance == 0.5


@pytest.mark.django_db
def test_the_same_text_again_after_archiving_restores_the_memory(alice_client: APIClient) -> None:
    body = {"kind": "semantic", "text": "Lives in Lisbon."}
    first = alice_client.post("/api/memories/", body, format="json").json()
    assert alice_client.patch(f"/api/memories/{first['id']}/", {"archived": True}, format="json").status_code == 200

    again = alice_client.post("/api/memories/", {**body, "text": "lives in  LISBON."}, format="json")

    assert again.status_code == 200 and again.json()["id"] == first["id"] and again.json()["archived"] is False
    assert Memory.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("archived", [False, True])
@pytest.mark.parametrize("change", ["text", "kind"])
def test_an_edit_onto_another_memorys_text_is_a_409(alice_client: APIClient, archived: bool, change: str) -> None:
    """One row per current text and kind (the database's rule, archived rows included): the edit that would
    break it is refused, saying which memory has the text, and changes nothing."""
    tea = alice_client.post("/api/memories/", {"kind": "semantic", "text": "Likes tea."}, format="json").json()
    alice_client.patch(f"/api/memories/{tea['id']}/", {"archived": archived}, format="json")
    other_kind = "procedural" if change == "kind" else "semantic"
    other_text = "Likes tea." if change == "kind" else "Likes coffee."
    other = alice_client.post("/api/memories/", {"kind": other_kind, "text": other_text}, format="json").json()

    edit = {"kind": "semantic"} if change == "kind" else {"text": "Likes tea."}
    error = assert_error(
        alice_client.patch(f"/api/memories/{other['id']}/", edit, format="json"), 409, "memory_conflict"
    )

    assert f"#{tea['id']}" in error["message"] and ("archived" in error["message"]) == archived
    stored = Memory.objects.get(pk=other["id"])
    assert (stored.kind, stored.text) == (other_kind, other_text)


@pytest.mark.django_db
def test_occurred_at_is_taken_shown_to_the_model_and_editable(alice_client: APIClient) -> None:
    """When it happened is the client's to say (an import of old events); the row keeps its own created_at."""
    created = alice_client.post(
        "/api/memories/",
        {"kind": "episodic", "text": "Ran the Porto half marathon.", "occurred_at": "2025-09-27T09:00:00Z"},
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["occurred_at"].startswith("2025-09-27T09:00:00") and not body["created_at"].startswith("2025-09-27")
    found = alice_client.get("/api/memories/search/", {"q": "half marathon"}).json()
    assert found["items"][0]["memory"]["id"] == body["id"]
    stored = Memory.objects.get(pk=body["id"])
    from memory.retrieval import prompt_text

    assert prompt_text(stored) == "(2025-09-27) Ran the Porto half marathon."

    patched = alice_client.patch(f"/api/memories/{body['id']}/", {"occurred_at": "2025-09-28T10:00:00Z"}, format="json")
    assert patched.status_code == 200 and patched.json()["occurred_at"].startswith("2025-09-28")
    error = assert_error(
        alice_client.post("/api/memories/", {"kind": "episodic", "text": "x", "occurred_at": "soon"}, format="json"),
        400,
        "invalid",
    )
    assert "occurred_at" in error["details"]["fields"]
    assert Memory.objects.count() == 1


@pytest.mark.django_db
def test_search_uses_the_calibrated_filter_by_default(alice_client: APIClient) -> None:
    """With nothing but q, the search filters as a chat turn does: on the query's own scale, where the best
    candidate of each arm has relevance 1."""
    for text in ("Adopted a grey rescue cat called Biscoito.", "Bought a second-hand road bike."):
        alice_client.post("/api/memories/", {"kind": "episodic", "text": text}, format="json")
    body = alice_client.get("/api/memories/search/", {"q": "Biscoito the cat is sneezing"}).json()
    assert body["report"]["filter_mode"] == "calibrated"
    assert max(c["relevance"] for c in body["report"]["candidates"]) == 1.0
    assert body["items"][0]["memory"]["text"].startswith("Adopted a grey rescue cat")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("occurred_at", "0001-01-01T00:00:00Z"),  # Python holds it; a day earlier in any time zone, it does not
        ("occurred_at", "0001-01-01T00:00:00+14:00"),
        ("expires_at", "9999-12-31T23:59:59-14:00"),
    ],
)
def test_a_date_outside_what_every_door_takes_is_a_400(alice_client: APIClient, field: str, value: str) -> None:
    first = alice_client.post("/api/memories/", {"kind": "semantic", "text": "Likes figs."}, format="json")
    memory_id = first.json()["id"]
    if field == "occurred_at":
        created = alice_client.post(
            "/api/memories/", {"kind": "semantic", "text": "Likes dates.", field: value}, format="json"
        )
        assert "between 0001-01-02 and 9999-12-30" in str(assert_error(created, 400, "invalid"))
    patched = alice_client.patch(f"/api/memories/{memory_id}/", {field: value}, format="json")
    assert "between 0001-01-02 and 9999-12-30" in str(assert_error(patched, 400, "invalid"))
    assert Memory.objects.count() == 1
