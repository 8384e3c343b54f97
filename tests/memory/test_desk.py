"""The curation desk: one user's memories for staff, with search, history, edit in place and confirmed bulk
actions; reads need the view permission, changes the change permission."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from memory.models import Memory
from memory.services import memory_create

pytestmark = pytest.mark.django_db


def desk(user: Any) -> str:
    return f"/admin/memory/memory/desk/{user.pk}/"


def test_the_desk_shows_one_users_timeline_and_each_facts_earlier_values(
    staff_client: Client, alice: Any, bob: Any
) -> None:
    old = memory_create(user=alice, kind="semantic", text="The user lives in Lisbon.", fact_key="home_city")
    Memory.objects.filter(pk=old.pk).update(valid_to=timezone.now() - timedelta(days=1))
    memory_create(user=alice, kind="semantic", text="The user lives in Porto.", fact_key="home_city")
    memory_create(user=alice, kind="episodic", text="User: we talked about trains.")
    memory_create(user=bob, kind="semantic", text="Bob's secret fact.")
    page = staff_client.get(desk(alice)).content.decode()
    assert "The user lives in Porto." in page and "User: we talked about trains." in page
    assert "Earlier values:" in page and "“The user lives in Lisbon.” until" in page
    assert "Bob&#x27;s secret fact." not in page and "Bob's secret fact." not in page
    # By name from the index page.
    response = staff_client.get("/admin/memory/memory/desk/", {"username": "alice"})
    assert response.status_code == 302 and response["Location"] == desk(alice)


def test_word_and_semantic_search_the_semantic_one_with_the_retrievers_reasons(
    staff_client: Client, alice: Any
) -> None:
    memory_create(user=alice, kind="semantic", text="The user is allergic to peanuts.")
    memory_create(user=alice, kind="semantic", text="The user prefers aisle seats.")
    words = staff_client.get(desk(alice), {"q": "peanuts", "mode": "words"}).content.decode()
    assert "allergic to peanuts" in words and "aisle seats" not in words
    meaning = staff_client.get(desk(alice), {"q": "food allergy peanuts", "mode": "semantic"}).content.decode()
    assert "allergic to peanuts" in meaning and 'class="why"' in meaning


def test_edit_in_place_re_embeds(staff_client: Client, alice: Any) -> None:
    memory = memory_create(user=alice, kind="semantic", text="The user likes tea.")
    before = memory.content_hash
    staff_client.post(desk(alice), {"single": f"edit:{memory.pk}", f"text-{memory.pk}": "The user likes green tea."})
    memory.refresh_from_db()
    assert memory.text == "The user likes green tea." and memory.content_hash != before


def test_bulk_actions_list_what_will_change_and_wait_for_the_confirmation(staff_client: Client, alice: Any) -> None:
    a = memory_create(user=alice, kind="semantic", text="Fact one.")
    b = memory_create(user=alice, kind="semantic", text="Fact two.")
    ask = staff_client.post(desk(alice), {"action": "archive", "ids": [a.pk, b.pk]})
    assert ask.status_code == 200 and "Archive these 2 memories" in ask.content.decode()
    assert not Memory.objects.filter(archived=True).exists()
    staff_client.post(desk(alice), {"action": "archive", "ids": [a.pk, b.pk], "confirmed": "yes"}, follow=True)
    assert Memory.objects.filter(pk__in=[a.pk, b.pk], archived=True).count() == 2


def test_merge_on_the_desk_is_within_one_kind_and_previews_the_text(staff_client: Client, alice: Any) -> None:
    fact = memory_create(user=alice, kind="semantic", text="The user likes tea.", importance=0.9)
    other = memory_create(user=alice, kind="semantic", text="The user drinks tea daily.")
    episode = memory_create(user=alice, kind="episodic", text="User: tea please")
    refused = staff_client.post(desk(alice), {"action": "merge", "ids": [fact.pk, episode.pk]}, follow=True)
    assert "cannot be merged" in refused.content.decode()
    preview = staff_client.post(desk(alice), {"action": "merge", "ids": [fact.pk, other.pk]}).content.decode()
    # The texts one to a line, in a box to edit before confirming.
    assert '<textarea name="combined"' in preview
    assert "The user likes tea.\nThe user drinks tea daily.</textarea>" in preview
    assert not Memory.objects.filter(archived=True).exists()
    staff_client.post(
        desk(alice),
        {"action": "merge", "ids": [fact.pk, other.pk], "confirmed": "yes", "combined": "The user drinks tea daily."},
    )
    fact.refresh_from_db()
    other.refresh_from_db()
    assert fact.text == "The user drinks tea daily." and not fact.archived and other.archived


def test_staff_need_the_permissions_and_users_cannot_see_it(
    viewer_staff: Any, alice: Any, django_user_model: Any
) -> None:
    memory = memory_create(user=alice, kind="semantic", text="The user likes tea.")
    viewer = Client()
    viewer.force_login(viewer_staff)
    page = viewer.get(desk(alice))
    assert page.status_code == 200 and "The user likes tea." in page.content.decode()
    assert 'name="single"' not in page.content.decode()  # no buttons for one who may only look
    assert viewer.post(desk(alice), {"single": f"archive:{memory.pk}"}).status_code == 403
    bare = django_user_model.objects.create_user(username="bare", password="x-pass-123", is_staff=True)
    nobody = Client()
    nobody.force_login(bare)
    assert nobody.get(desk(alice)).status_code == 403
    user = Client()
    user.force_login(alice)
    assert user.get(desk(alice)).status_code == 302  # to the admin's sign-in
    memory.refresh_from_db()
    assert not memory.archived


def test_a_word_search_puts_the_statement_it_names_above_a_long_junk_message(staff_client: Client, alice: Any) -> None:
    """Issue 36: a 20,000-character pasted message that happens to hold the word ranked above the short
    statement about it (Postgres' ts_rank grows with every occurrence and ignores the length)."""
    statement = memory_create(user=alice, kind="semantic", text="The user is allergic to peanuts.")
    Memory.objects.filter(pk=statement.pk).update(occurred_at=timezone.now() - timedelta(days=3))
    filler = "lorem ipsum dolor sit amet peanuts consectetur adipiscing elit sed do eiusmod tempor " * 230
    junk = memory_create(user=alice, kind="episodic", text=f"User: {filler}"[:20_000])
    page = staff_client.get(desk(alice), {"q": "peanuts", "mode": "words"}).content.decode()
    assert f'id="memory-{statement.pk}"' in page and f'id="memory-{junk.pk}"' in page
    assert page.index(f'id="memory-{statement.pk}"') < page.index(f'id="memory-{junk.pk}"')
