from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from memory.models import Memory, MemoryReview
from memory.services import memory_create

pytestmark = pytest.mark.django_db

TRY_URL = "admin:memory_memory_try_retrieval"


def test_try_retrieval_as_bob_never_shows_alice(staff_client: Client, alice: Any, bob: Any) -> None:
    memory_create(user=alice, kind="episodic", text="User: my locker code is 4471", pinned=True)
    memory_create(user=bob, kind="episodic", text="User: my locker is on floor two")

    response = staff_client.get(
        reverse(TRY_URL),
        {"user": bob.pk, "query": "locker code 4471", "budget_tokens": 2000, "relevance_threshold": 0.0},
    )

    body = response.content.decode()
    assert response.status_code == 200
    assert "floor two" in body
    assert "4471</td>" not in body and "locker code is 4471" not in body


def test_try_retrieval_shows_tiers_and_escapes_text(staff_client: Client, alice: Any) -> None:
    memory_create(user=alice, kind="episodic", text="User: <script>alert('x')</script> likes sailing", pinned=True)

    response = staff_client.get(
        reverse(TRY_URL), {"user": alice.pk, "query": "sailing", "budget_tokens": 500, "relevance_threshold": 0.5}
    )

    body = response.content.decode()
    assert "<script>alert" not in body
    assert "&lt;script&gt;alert(" in body
    assert "pinned" in body and "Filter: <strong>threshold</strong>" in body


def test_try_retrieval_is_staff_only(client: Client, alice: Any) -> None:
    client.force_login(alice)
    response = client.get(reverse(TRY_URL), {"user": alice.pk, "query": "x", "budget_tokens": 10})
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_changelist_text_and_semantic_search(staff_client: Client, alice: Any, bob: Any) -> None:
    memory_create(user=alice, kind="episodic", text="User: I keep a sourdough starter called Clint")
    memory_create(user=bob, kind="episodic", text="User: my bike needs new brakes")
    url = reverse("admin:memory_memory_changelist")

    words = staff_client.get(url, {"q": "sourdough"}).content.decode()
    assert "sourdough starter" in words and "new brakes" not in words

    semantic = staff_client.get(url, {"q": "~bike brakes", "user__id__exact": bob.pk}).content.decode()
    assert "new brakes" in semantic and "sourdough" not in semantic


def test_edit_reembeds_and_actions(staff_client: Client, alice: Any) -> None:
    memory = memory_create(user=alice, kind="semantic", text="The user likes tea.")
    before = list(memory.embedding)
    change = reverse("admin:memory_memory_change", args=[memory.pk])
    response = staff_client.post(
        change,
        {
            "user": alice.pk,
            "kind": "semantic",
            "text": "The user likes green tea.",
            "fact_key": "",
            "trigger": "",
            "workflow": "",
            "importance": 0.5,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    memory.refresh_from_db()
    assert memory.text == "The user likes green tea." and list(memory.embedding) != before

    changelist = reverse("admin:memory_memory_changelist")
    staff_client.post(changelist, {"action": "pin", "_selected_action": [memory.pk]})
    memory.refresh_from_db()
    assert memory.pinned
    staff_client.post(changelist, {"action": "archive", "_selected_action": [memory.pk]})
    memory.refresh_from_db()
    assert memory.archived


def test_review_queue_apply_action(staff_client: Client, alice: Any) -> None:
    current = memory_create(user=alice, kind="semantic", text="The user lives in Lisbon.", fact_key="home_city")
    review = MemoryReview.objects.create(
        user=alice, existing=current, proposed_text="The user lives in Rome.", proposed_key="home_city", confidence=0.4
    )
    staff_client.post(
        reverse("admin:memory_memoryreview_changelist"), {"action": "apply", "_selected_action": [review.pk]}
    )
    review.refresh_from_db()
    current.refresh_from_db()
    assert review.status == "applied" and current.valid_to is not None
    assert Memory.objects.get(text="The user lives in Rome.").is_current


def test_view_only_staff_cannot_run_changing_actions(client: Client, viewer_staff: Any, alice: Any) -> None:
    """The admin's actions change memories and reviews: staff who may only view get none of them."""
    from django.contrib.auth.models import Permission
    from django.utils import timezone

    from observability.models import Alert, AlertRule

    memory = memory_create(user=alice, kind="semantic", text="The user lives in Lisbon.", fact_key="home_city")
    review = MemoryReview.objects.create(
        user=alice, existing=memory, proposed_text="The user lives in Rome.", proposed_key="home_city", confidence=0.4
    )
    rule = AlertRule.objects.create(name="Any retries", metric="retry_rate", threshold=0.5)
    alert = Alert.objects.create(
        rule=rule, value=1.0, last_value=1.0, threshold=0.5, window_minutes=5, fired_at=timezone.now()
    )
    client.force_login(viewer_staff)
    changelist = reverse("admin:memory_memory_changelist")
    assert client.get(changelist).status_code == 200  # may look

    for action in ("pin", "archive", "reembed"):
        client.post(changelist, {"action": action, "_selected_action": [memory.pk]})
    client.post(reverse("admin:memory_memoryreview_changelist"), {"action": "apply", "_selected_action": [review.pk]})
    client.post(
        reverse("admin:observability_alert_changelist"), {"action": "resolve_now", "_selected_action": [alert.pk]}
    )

    memory.refresh_from_db()
    review.refresh_from_db()
    alert.refresh_from_db()
    assert not memory.pinned and not memory.archived and memory.valid_to is None
    assert review.status == MemoryReview.Status.PENDING
    assert alert.resolved_at is None
    # With the change permission the same request does it (the refusal above was the permission's).
    viewer_staff.user_permissions.add(Permission.objects.get(codename="change_memory"))
    client.post(changelist, {"action": "archive", "_selected_action": [memory.pk]})
    memory.refresh_from_db()
    assert memory.archived


def test_try_retrieval_leaves_the_users_access_counts(staff_client: Client, alice: Any) -> None:
    memory = memory_create(user=alice, kind="episodic", text="User: I sail on Sundays", pinned=True)

    response = staff_client.get(
        reverse(TRY_URL), {"user": alice.pk, "query": "sailing", "budget_tokens": 500, "relevance_threshold": 0.0}
    )

    assert response.status_code == 200 and "I sail on Sundays" in response.content.decode()
    memory.refresh_from_db()
    assert memory.access_count == 0 and memory.last_accessed_at is None


def test_an_admin_edit_onto_another_memorys_text_is_a_form_error(staff_client: Client, alice: Any) -> None:
    alpha = memory_create(user=alice, kind="semantic", text="Alpha.")
    beta = memory_create(user=alice, kind="semantic", text="Beta.")
    form = {"user": alice.pk, "kind": "semantic", "text": "Alpha.", "importance": "0.5"}

    response = staff_client.post(reverse("admin:memory_memory_change", args=[beta.pk]), form)

    assert response.status_code == 200
    assert f"Memory #{alpha.pk} has this text already" in response.content.decode()
    beta.refresh_from_db()
    assert beta.text == "Beta."


@pytest.mark.parametrize(
    "path",
    [
        "/admin/chat_sessions/chatsession/?status=a%00b",
        "/admin/chat_sessions/chatsession/?state=a%00b",
        "/admin/memory/memory/?kind=a%00b",
        "/ops/?agent=%00",
    ],
)
def test_a_nul_in_a_page_address_is_a_400(staff_client: Client, path: str) -> None:
    response = staff_client.get(path)
    assert response.status_code == 400 and "NUL" in response.content.decode()


def test_try_retrieval_the_api_and_a_chat_turn_make_the_same_decisions(
    staff_client: Client, alice: Any, agent: Any
) -> None:
    """One retriever behind three doors: with its cut-off left blank, Try retrieval filters as the chosen agent
    does (calibrated here), as the API's search does, and keeps the same memories."""
    import re

    from rest_framework.test import APIClient

    for text in ("Alice sails on the lake", "Alice's boat is called Gaivota", "Alice bakes rye bread"):
        memory_create(user=alice, kind="semantic", text=text)
    query = "sailing the boat on the lake"

    page = staff_client.get(
        reverse(TRY_URL), {"user": alice.pk, "query": query, "agent": agent.pk, "budget_tokens": 2000}
    ).content.decode()
    api = APIClient()
    api.force_authenticate(alice)
    body = api.get("/api/memories/search/", {"q": query}).json()

    assert "Filter: <strong>calibrated</strong>" in page and body["report"]["filter_mode"] == "calibrated"
    kept_on_page = {int(i) for i in re.findall(r'<tr class="kept">\s*<td><a href="[^"]+">(\d+)</a>', page)}
    assert kept_on_page and kept_on_page == {item["memory"]["id"] for item in body["items"]}
    agent.relevance_threshold = 0.99
    agent.save()
    strict = staff_client.get(
        reverse(TRY_URL), {"user": alice.pk, "query": query, "agent": agent.pk, "budget_tokens": 2000}
    ).content.decode()
    assert "Filter: <strong>threshold</strong>" in strict  # the agent's own cut-off, when it names one


def _merge(client: Client, memories: list[Memory], **extra: str) -> Any:
    return client.post(
        reverse("admin:memory_memory_changelist"),
        {"action": "merge_duplicates", "_selected_action": [m.pk for m in memories], **extra},
        follow=True,
    )


def test_merge_refuses_memories_of_different_kinds(staff_client: Client, alice: Any) -> None:
    episode = memory_create(user=alice, kind="episodic", text="User: we talked about Lisbon")
    fact = memory_create(user=alice, kind="semantic", text="The user is allergic to peanuts.")
    page = _merge(staff_client, [episode, fact]).content.decode()
    assert "different kinds (episodic, semantic) cannot be merged" in page
    assert not Memory.objects.filter(archived=True).exists()


def test_merge_asks_first_with_the_combined_text_to_edit_then_merges_the_edited_text(
    staff_client: Client, alice: Any
) -> None:
    a = memory_create(user=alice, kind="semantic", text="The user likes tea", importance=0.9)
    b = memory_create(user=alice, kind="semantic", text="The user drinks green tea every morning.", importance=0.3)
    first = _merge(staff_client, [a, b])
    page = first.content.decode()
    assert first.status_code == 200 and "Merge these memories?" in page
    # Each text on a line of its own, in a box staff can edit before they confirm (not glued into one line).
    assert '<textarea name="combined"' in page
    assert "The user likes tea.\nThe user drinks green tea every morning.</textarea>" in page
    assert not Memory.objects.filter(archived=True).exists()  # nothing changed yet

    edited = "The user likes tea, green tea every morning."
    _merge(staff_client, [a, b], confirmed="yes", combined=edited)
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.text == edited and not a.archived
    assert b.archived


def test_try_retrieval_shows_what_each_fused_score_is_made_of(staff_client: Client, alice: Any) -> None:
    """Cosine, crowding (the hubness discount) and word share per candidate: an operator can see why one
    memory outranks another."""
    from django.template.defaultfilters import floatformat

    from memory.retrieval import memories_for_prompt

    for text in ("User: I sail on Sundays", "User: my boat is called Wren", "User: I bake bread"):
        memory_create(user=alice, kind="episodic", text=text)
    result = memories_for_prompt(user=alice, query="sailing boat", budget_tokens=500, use_model_filter=False)
    scored = [c.as_dict() for c in result.candidates]
    assert scored and all(isinstance(c["cosine"], float) and isinstance(c["crowding"], float) for c in scored)
    assert all(c["word_share"] is not None for c in scored)

    body = staff_client.get(reverse(TRY_URL), {"user": alice.pk, "query": "sailing boat", "budget_tokens": 500})
    html = body.content.decode()
    assert ">cosine</th>" in html and ">crowding</th>" in html and ">words</th>" in html
    assert f"<td>{floatformat(scored[0]['cosine'], 3)}</td>" in html
    # The store's line: three memories are too few to measure, so the corrections apply whole.
    assert result.redundancy is None and result.corrections == 1.0
    assert "too few memories to measure how alike they are" in html and "corrections <strong>1.00</strong>" in html


@pytest.mark.parametrize("field", ["occurred_at", "expires_at", "valid_to"])
def test_an_admin_date_outside_what_every_door_takes_is_a_form_error(
    staff_client: Client, alice: Any, field: str
) -> None:
    memory = memory_create(user=alice, kind="semantic", text="Alpha.")
    form = {"user": alice.pk, "kind": "semantic", "text": "Alpha.", "importance": "0.5"}
    form |= {f"{field}_0": "0001-01-01", f"{field}_1": "00:00:00"}

    response = staff_client.post(reverse("admin:memory_memory_change", args=[memory.pk]), form)

    assert response.status_code == 200
    assert "the date must lie between 0001-01-02 and 9999-12-30 (UTC)" in response.content.decode()
    memory.refresh_from_db()
    assert memory.occurred_at.year > 1 and memory.expires_at is None and memory.valid_to is None
