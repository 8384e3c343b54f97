from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conftest import wait_for
from llm.base import LLMServerError
from memory.models import Memory, MemoryReview
from memory.schemas import ExtractedFacts, Fact
from memory.services import (
    memories_merge,
    memory_create,
    memory_update,
    memory_writes_enqueue,
    review_apply,
    review_reject,
    turn_memories_write,
)


def _facts(*facts: tuple[str, str, float]) -> ExtractedFacts:
    return ExtractedFacts(facts=[Fact(key=k, text=t, confidence=c) for k, t, c in facts])


@pytest.mark.django_db
def test_write_twice_writes_once(alice: Any, make_turn: Any, scripted: Any) -> None:
    turn = make_turn(alice, "My home airport is LIS", "Got it.")
    scripted.add(_facts(("home_airport", "The user's home airport is LIS.", 0.95)))
    scripted.add(_facts(("home_airport", "The user's home airport is LIS.", 0.95)))

    first = turn_memories_write(turn_id=turn.id)
    second = turn_memories_write(turn_id=turn.id)

    assert first.written and not second.written
    assert Memory.objects.filter(source_turn=turn, kind="episodic").count() == 1
    assert Memory.objects.filter(user=alice, kind="semantic").count() == 1
    episode = Memory.objects.get(source_turn=turn, kind="episodic")
    assert episode.embedding is not None and episode.text.startswith("User: My home airport is LIS")
    # The second run stopped before calling the model again.
    assert len(scripted.requests) == 1 and scripted.requests[0].purpose == "extract"


@pytest.mark.django_db
def test_a_copy_that_called_the_model_while_another_wrote_the_turn_writes_nothing(
    alice: Any, make_turn: Any, scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory.services import turns

    turn = make_turn(alice, "I collect vintage maps", "Nice.")
    scripted.add(_facts())
    extract = turns.extract_facts
    calls: list[int] = []

    def slow_model(*, turn: Any, known_keys: list[str]) -> Any:
        calls.append(turn.pk)
        if len(calls) > 1:
            return extract(turn=turn, known_keys=known_keys)
        # While this copy waits for the model, another copy (a requeue) writes the turn, and its user
        # deletes the episode it wrote.
        assert turn_memories_write(turn_id=turn.pk).written
        Memory.objects.filter(source_turn_id=turn.pk, kind="episodic").delete()
        return [], ""

    monkeypatch.setattr(turns, "extract_facts", slow_model)
    result = turn_memories_write(turn_id=turn.pk)

    assert len(calls) == 2 and not result.written
    # The deleted episode stays deleted: the turn was written once.
    assert not Memory.objects.filter(source_turn=turn, kind="episodic").exists()


@pytest.mark.django_db
def test_the_write_counts_the_access_of_the_memories_the_turn_used_once(
    alice: Any, bob: Any, make_turn: Any, scripted: Any
) -> None:
    used = memory_create(user=alice, kind="episodic", text="User: I collect vintage maps")
    unused = memory_create(user=alice, kind="episodic", text="User: I like tea")
    bobs = memory_create(user=bob, kind="episodic", text="User: Bob's secret")
    turn = make_turn(alice, "Tell me about maps", "You collect them.")
    # The runtime saves which memories went into the prompt; a forged id of Bob's must not be counted.
    turn.retrieval = {"items": [{"id": used.id, "tier": 2}, {"id": bobs.id, "tier": 2}]}
    turn.save(update_fields=["retrieval"])
    scripted.add(_facts())
    scripted.add(_facts())

    turn_memories_write(turn_id=turn.id)
    turn_memories_write(turn_id=turn.id)  # a retried task: the access is not counted again

    for memory in (used, unused, bobs):
        memory.refresh_from_db()
    assert (used.access_count, unused.access_count, bobs.access_count) == (1, 0, 0)
    assert used.last_accessed_at == (turn.started_at or turn.created_at)


@pytest.mark.django_db
def test_contradicting_fact_supersedes_old(alice: Any, make_turn: Any, scripted: Any) -> None:
    scripted.add(_facts(("home_city", "The user lives in Lisbon.", 0.95)))
    turn_memories_write(turn_id=make_turn(alice, "I live in Lisbon").id)
    scripted.add(_facts(("home_city", "The user lives in Porto.", 0.9)))
    result = turn_memories_write(turn_id=make_turn(alice, "I moved, I live in Porto now").id)

    old = Memory.objects.get(user=alice, text="The user lives in Lisbon.")
    new = Memory.objects.get(user=alice, text="The user lives in Porto.")
    assert old.valid_to is not None and not old.is_current
    assert new.valid_to is None and new.is_current
    assert result.facts_superseded == [old.id] and result.facts_added == [new.id]
    # The extractor was told which keys exist, so it can reuse them.
    assert "home_city" in scripted.requests[1].messages[-1]["content"]


@pytest.mark.django_db
def test_low_confidence_contradiction_goes_to_review(alice: Any, make_turn: Any, scripted: Any, staff: Any) -> None:
    scripted.add(_facts(("home_city", "The user lives in Lisbon.", 0.95)))
    turn_memories_write(turn_id=make_turn(alice, "I live in Lisbon").id)
    scripted.add(_facts(("home_city", "The user lives in Madrid.", 0.4)))
    result = turn_memories_write(turn_id=make_turn(alice, "maybe I'll be living in Madrid, who knows").id)

    current = Memory.objects.get(user=alice, text="The user lives in Lisbon.")
    assert current.valid_to is None and current.needs_review
    assert not Memory.objects.filter(text="The user lives in Madrid.").exists()
    review = MemoryReview.objects.get()
    assert result.reviews == [review.id]
    assert (review.existing_id, review.proposed_text, review.status) == (
        current.id,
        "The user lives in Madrid.",
        "pending",
    )

    applied = review_apply(review=review, actor=staff)
    current.refresh_from_db()
    review.refresh_from_db()
    assert current.valid_to is not None and applied.is_current and applied.fact_key == "home_city"
    assert review.status == "applied" and review.resolved_by == staff
    with pytest.raises(ValueError, match="already applied"):
        review_reject(review=review, actor=staff)


@pytest.mark.django_db
def test_review_reject_keeps_existing(alice: Any, make_turn: Any, scripted: Any, staff: Any) -> None:
    scripted.add(_facts(("employer", "The user works at Acme.", 1.0)))
    turn_memories_write(turn_id=make_turn(alice, "I work at Acme").id)
    scripted.add(_facts(("employer", "The user works at Globex.", 0.3)))
    turn_memories_write(turn_id=make_turn(alice, "thinking about Globex").id)

    review_reject(review=MemoryReview.objects.get(), actor=staff)

    existing = Memory.objects.get(text="The user works at Acme.")
    assert existing.is_current and not existing.needs_review
    assert MemoryReview.objects.get().status == "rejected"


@pytest.mark.django_db
def test_extraction_failure_still_writes_episode(alice: Any, make_turn: Any, scripted: Any) -> None:
    scripted.add(LLMServerError("503"), LLMServerError("503"), LLMServerError("503"), LLMServerError("503"))
    result = turn_memories_write(turn_id=make_turn(alice, "I live in Oslo").id)
    assert result.written and result.episodic_id and "LLMServerError" in result.extraction_error
    assert not Memory.objects.filter(kind="semantic").exists()


@pytest.mark.django_db
def test_demo_model_extracts_simple_facts(alice: Any, make_turn: Any) -> None:
    # No LLM configured: the demo model's registered handler extracts explicit statements.
    turn = make_turn(alice, "Hi! My name is Ana and I live in Lisbon. My home airport is LIS.")
    result = turn_memories_write(turn_id=turn.id)
    texts = set(Memory.objects.filter(user=alice, kind="semantic").values_list("text", flat=True))
    assert texts == {"The user's name is Ana.", "The user lives in Lisbon.", "The user's home airport is LIS."}
    assert len(result.facts_added) == 3


@pytest.mark.django_db
def test_near_duplicate_fact_is_not_added(alice: Any, make_turn: Any, scripted: Any) -> None:
    scripted.add(_facts(("", "The user prefers aisle seats.", 0.9)))
    turn_memories_write(turn_id=make_turn(alice, "I prefer aisle seats").id)
    scripted.add(_facts(("", "the user prefers aisle seats", 0.9)))
    result = turn_memories_write(turn_id=make_turn(alice, "aisle seats please").id)
    assert result.facts_added == [] and result.facts_unchanged == 1


@pytest.mark.django_db
def test_update_reembeds_on_text_change(alice: Any) -> None:
    memory = memory_create(user=alice, kind="semantic", text="The user likes tea.")
    memory.refresh_from_db()  # the vector as stored (float4), which memory_update hands back
    before = list(memory.embedding)
    memory_update(memory=memory, importance=0.9)
    assert list(memory.embedding) == before and memory.importance == 0.9
    memory_update(memory=memory, text="The user likes coffee.")
    memory.refresh_from_db()
    assert list(memory.embedding) != before and memory.text == "The user likes coffee."
    with pytest.raises(ValueError, match="not editable: user_id"):
        memory_update(memory=memory, user_id=123)


@pytest.mark.django_db
def test_merge_keeps_one_and_refuses_across_users(alice: Any, bob: Any) -> None:
    a = memory_create(user=alice, kind="episodic", text="User: I love Lisbon", importance=0.2)
    b = memory_create(user=alice, kind="episodic", text="User: I love Lisbon!", importance=0.8, pinned=True)
    kept = memories_merge(memories=[a, b])
    a.refresh_from_db()
    assert kept.id == b.id and a.archived and kept.importance == 0.8
    c = memory_create(user=bob, kind="episodic", text="User: I love Lisbon")
    with pytest.raises(ValueError, match="different users"):
        memories_merge(memories=[kept, c])


@pytest.mark.django_db(transaction=True)
def test_enqueue_runs_after_commit_on_a_real_worker(
    celery_worker: Any, alice: Any, make_turn: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from django.db import transaction

    with transaction.atomic():
        turn = make_turn(alice, "My name is Ana")  # the worker cannot see it before the commit
        with django_capture_on_commit_callbacks() as callbacks:
            memory_writes_enqueue(turn=turn)
        # Nothing is sent yet: the enqueue waits for the commit (a task sent now would find no turn).
        assert len(callbacks) == 1
        assert not Memory.objects.filter(source_turn=turn).exists()
    wait_for(lambda: Memory.objects.filter(source_turn=turn, kind="episodic").exists(), message="episode written")
    # Enqueue again (a retried turn): still one episode and one name fact.
    memory_writes_enqueue(turn=turn)
    memory_writes_enqueue(turn=turn)
    wait_for(lambda: Memory.objects.filter(user=alice, kind="semantic").exists(), message="fact written")

    def finished_runs() -> int:
        return sum(
            1
            for line in celery_worker.log_text().splitlines()
            if "write_turn_memories" in line and "succeeded" in line and f"'turn_id': {turn.id}," in line
        )

    wait_for(lambda: finished_runs() >= 3, message="the duplicate tasks to finish")
    assert Memory.objects.filter(source_turn=turn, kind="episodic").count() == 1
    assert list(Memory.objects.filter(user=alice, kind="semantic").values_list("text", flat=True)) == [
        "The user's name is Ana."
    ]


@pytest.mark.django_db
def test_selector_query_count_is_bounded(alice: Any) -> None:
    from memory.retrieval import memories_for_prompt

    for i in range(10):
        memory_create(user=alice, kind="episodic", text=f"User: note {i} about gardening tomatoes")
    with CaptureQueriesContext(connection) as ctx:
        memories_for_prompt(user=alice, query="tomatoes", budget_tokens=2000, use_model_filter=False)
    # Independent of the number of memories: tier-1 lookups, two search arms, one load, one touch.
    assert len(ctx.captured_queries) <= 14


@pytest.mark.django_db
def test_a_fact_said_again_after_it_was_archived_stays_archived_and_the_turn_is_written(
    alice: Any, make_turn: Any, scripted: Any
) -> None:
    """The user (or an operator) archived a fact; the user says it again with something new. The archive
    stands, and the turn's episode and its new fact are written (the duplicate once failed the whole write)."""
    fact = memory_create(user=alice, kind="semantic", text="The user lives in Lisbon.", fact_key="home_city")
    memory_update(memory=fact, archived=True)
    turn = make_turn(alice, "I live in Lisbon. My name is Ana.", "Hello Ana.")
    scripted.add(_facts(("home_city", "The user lives in Lisbon.", 0.95), ("name", "The user's name is Ana.", 0.95)))

    result = turn_memories_write(turn_id=turn.id)

    assert result.written and result.facts_unchanged == 1
    assert Memory.objects.filter(source_turn=turn, kind="episodic").exists()
    assert Memory.objects.get(user=alice, fact_key="name").text == "The user's name is Ana."
    fact.refresh_from_db()
    assert fact.archived and fact.valid_to is None
    assert Memory.objects.filter(user=alice, text="The user lives in Lisbon.").count() == 1


@pytest.mark.django_db
def test_review_apply_onto_an_archived_text_restores_it_in_one_step(alice: Any, staff: Any) -> None:
    current = memory_create(user=alice, kind="semantic", text="The user lives in Lisbon.", fact_key="home_city")
    madrid = memory_create(user=alice, kind="semantic", text="The user lives in Madrid.")
    memory_update(memory=madrid, archived=True)
    review = MemoryReview.objects.create(
        user=alice,
        existing=current,
        proposed_text="The user lives in Madrid.",
        proposed_key="home_city",
        confidence=0.5,
    )

    applied = review_apply(review=review, actor=staff)

    assert applied.pk == madrid.pk and not Memory.objects.get(pk=madrid.pk).archived
    assert Memory.objects.get(pk=madrid.pk).fact_key == "home_city"  # the review's key, not the old row's
    current.refresh_from_db()
    review.refresh_from_db()
    assert current.valid_to is not None and review.status == MemoryReview.Status.APPLIED


@pytest.mark.django_db
def test_review_apply_that_fails_changes_nothing(
    alice: Any, staff: Any, settings: Any, fake_openai: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedder (a remote endpoint here, the fake server) refuses the proposed text: the old fact stays in
    force and the review stays pending (it had closed the old fact first, and left the user with none)."""
    import dataclasses

    import openai

    from memory.embedding import registry
    from tests.fakes.openai_server import EMBEDDINGS_PATH, error

    current = memory_create(user=alice, kind="semantic", text="The user lives in Lisbon.", fact_key="home_city")
    review = MemoryReview.objects.create(
        user=alice, existing=current, proposed_text="The user lives in Rome.", proposed_key="home_city", confidence=0.5
    )
    settings.EMBEDDING_BACKEND, settings.EMBEDDING_BASE_URL = "openai", fake_openai.base_url
    settings.EMBEDDING_MODEL = "fake-embedding"
    monkeypatch.delitem(registry._instances, "openai", raising=False)  # built again, for this server
    fake_openai.enqueue(dataclasses.replace(error(400, "input refused"), path=EMBEDDINGS_PATH))

    with pytest.raises(openai.BadRequestError, match="input refused"):
        review_apply(review=review, actor=staff)

    current.refresh_from_db()
    review.refresh_from_db()
    assert current.valid_to is None and review.status == MemoryReview.Status.PENDING
    assert not Memory.objects.filter(user=alice, text="The user lives in Rome.").exists()


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    from django.db import connection

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("writer", ["turn memory write", "API create", "API edit"])
def test_writes_of_one_users_memories_wait_for_each_other(
    alice: Any, bob: Any, make_turn: Any, scripted: Any, writer: str
) -> None:
    """Two writers of one user's memories both passed the duplicate checks before either inserted: the same
    fact from two turns at once lost one turn's whole write (episode included) for good, and one key got two
    current values. A writer now waits for the other's commit; another user's writes do not wait."""
    from django.db import transaction

    from memory.services import lock_user_memories

    edited = memory_create(user=alice, kind="semantic", text="The user likes tea.")
    turn = make_turn(alice, "I live in Paris.")
    scripted.add(_facts(("home_city", "The user lives in Paris.", 0.95)))
    write = {
        "turn memory write": lambda: turn_memories_write(turn_id=turn.id),
        "API create": lambda: memory_create(user=alice, kind="semantic", text="The user lives in Paris."),
        "API edit": lambda: memory_update(memory=edited, text="The user likes green tea."),
    }[writer]
    holding, release = threading.Event(), threading.Event()

    def hold_alices_lock() -> None:
        with transaction.atomic():
            lock_user_memories(alice.pk)
            holding.set()
            assert release.wait(30)

    holder, held = _in_thread(hold_alices_lock)
    assert holding.wait(30)
    waiting, box = _in_thread(write)
    waiting.join(1.0)
    assert waiting.is_alive(), "the write did not wait for the other writer of alice's memories"
    bobs, bobs_box = _in_thread(lambda: memory_create(user=bob, kind="semantic", text="Bob likes tea."))
    bobs.join(5.0)
    assert not bobs.is_alive() and "error" not in bobs_box, "bob's write waited for alice's lock"
    release.set()
    holder.join(30)
    waiting.join(30)
    assert "error" not in held and "error" not in box, (held.get("error"), box.get("error"))
    current = set(
        Memory.objects.filter(user=alice, valid_to__isnull=True, kind="semantic").values_list("text", flat=True)
    )
    expected = (
        {"The user likes green tea."} if writer == "API edit" else {"The user likes tea.", "The user lives in Paris."}
    )
    assert current == expected


@pytest.mark.django_db
def test_restoring_an_archived_fact_by_key_supersedes_the_current_one(
    alice: Any, make_turn: Any, scripted: Any
) -> None:
    paris = memory_create(user=alice, kind="semantic", text="The user lives in Paris.", fact_key="home_city")
    memory_update(memory=paris, archived=True)
    turn = make_turn(alice, "I moved to Berlin.")
    scripted.add(_facts(("home_city", "The user lives in Berlin.", 0.95)))
    turn_memories_write(turn_id=turn.id)  # Berlin becomes the current home_city; archived Paris is left alone

    again = memory_create(user=alice, kind="semantic", text="The user lives in Paris.", fact_key="home_city")

    assert again.pk == paris.pk and not again.archived
    current = Memory.objects.filter(user=alice, fact_key="home_city", valid_to__isnull=True)
    assert list(current.values_list("text", flat=True)) == ["The user lives in Paris."]


@pytest.mark.django_db
def test_an_edit_from_a_stale_copy_never_brings_a_superseded_fact_back(alice: Any) -> None:
    london = memory_create(user=alice, kind="semantic", text="The user lives in Londn.", fact_key="home_city")
    stale = Memory.objects.get(pk=london.pk)  # what an API request read before the write task ran
    memory_create(user=alice, kind="semantic", text="The user lives in Paris.", fact_key="home_city")

    with pytest.raises(ValueError, match="replaced by a newer one"):
        memory_update(memory=stale, text="The user lives in London.")
    memory_update(memory=stale, importance=0.9)  # another field: written alone

    london.refresh_from_db()
    assert london.valid_to is not None and london.importance == 0.9 and london.text == "The user lives in Londn."
    current = Memory.objects.filter(user=alice, fact_key="home_city", valid_to__isnull=True)
    assert list(current.values_list("text", flat=True)) == ["The user lives in Paris."]


@pytest.mark.django_db(transaction=True)
def test_applying_a_review_while_a_turn_writes_the_same_users_memories_does_not_deadlock(
    alice: Any, staff: Any
) -> None:
    """The write holds the user's lock and then wants the old fact's row; applying the review locked that row
    and then wanted the user's lock: PostgreSQL aborted one of them. Both now take the user's lock first."""
    from django.db import transaction

    from memory.services import lock_user_memories

    current = memory_create(user=alice, kind="semantic", text="The user lives in Lisbon.", fact_key="home_city")
    review = MemoryReview.objects.create(
        user=alice, existing=current, proposed_text="The user lives in Rome.", proposed_key="home_city", confidence=0.5
    )
    holding, go_on = threading.Event(), threading.Event()

    def a_turns_write() -> None:
        with transaction.atomic():
            lock_user_memories(alice.pk)
            holding.set()
            assert go_on.wait(30)
            list(Memory.objects.select_for_update().filter(pk=current.pk))  # as _fact_apply locks same-key facts

    writer, written = _in_thread(a_turns_write)
    assert holding.wait(30)
    applier, applied = _in_thread(lambda: review_apply(review=review, actor=staff))
    applier.join(1.0)  # let it take whatever it takes first
    go_on.set()
    writer.join(30)
    applier.join(30)

    assert "error" not in written and "error" not in applied, (written.get("error"), applied.get("error"))
    review.refresh_from_db()
    assert review.status == MemoryReview.Status.APPLIED
    assert list(
        Memory.objects.filter(user=alice, fact_key="home_city", valid_to__isnull=True).values_list("text", flat=True)
    ) == ["The user lives in Rome."]


@pytest.mark.django_db
def test_the_proof_of_a_write_commits_with_it(alice: Any, make_turn: Any, scripted: Any) -> None:
    """``memories_written_at`` is set by the write's own transaction: a write that fails leaves it unset (the
    sweep sends it again), one that commits sets it, and a later run writes nothing even without the episode."""
    turn = make_turn(alice, "My home airport is LIS", "Got it.")
    scripted.add(_facts(("home_airport", "The user's home airport is LIS.", 0.95)))
    turn_memories_write(turn_id=turn.id)
    turn.refresh_from_db()
    assert turn.memories_written_at is not None

    Memory.objects.filter(source_turn=turn).delete()  # the user deletes what was written
    again = turn_memories_write(turn_id=turn.id)
    assert not again.written and not Memory.objects.filter(source_turn=turn).exists()


@pytest.mark.django_db
def test_the_migration_marks_the_writes_that_ran_before_the_proof_existed(
    alice: Any, make_turn: Any, scripted: Any
) -> None:
    import importlib

    from django.apps import apps

    from agents.models import LLMCall

    with_episode, with_extraction, never = (make_turn(alice, f"message {i}") for i in range(3))
    scripted.add(_facts())
    turn_memories_write(turn_id=with_episode.id)
    LLMCall.objects.create(turn=with_extraction, purpose="extract", provider="demo", model="x", outcome="ok")
    Turn = type(never)
    Turn.objects.update(memories_written_at=None)  # as every row was before the field existed

    importlib.import_module("sessions.migrations.0002_turn_memories_written_at").mark_written(apps, None)

    marked = set(Turn.objects.filter(memories_written_at__isnull=False).values_list("pk", flat=True))
    assert marked == {with_episode.pk, with_extraction.pk}


@pytest.mark.django_db
def test_get_or_create_says_whether_the_memory_is_new(alice: Any) -> None:
    """The API answers 201 or 200 on this flag (a timestamp comparison took a concurrent twin for new)."""
    from memory.services import memory_get_or_create

    first, created = memory_get_or_create(user=alice, kind="semantic", text="Likes green tea.")
    again, created_again = memory_get_or_create(user=alice, kind="semantic", text="likes  GREEN tea.")
    assert created and not created_again and again.pk == first.pk


@pytest.mark.django_db
def test_a_turns_memories_happened_when_the_turn_did(alice: Any, make_turn: Any, scripted: Any) -> None:
    """occurred_at is the turn's time (for recency and the prompt); created_at is the row's own."""
    from datetime import timedelta

    from django.utils import timezone

    from sessions.models import Turn

    turn = make_turn(alice, "My home airport is LIS", "Got it.")
    said = timezone.now() - timedelta(hours=5)
    Turn.objects.filter(pk=turn.pk).update(created_at=said)
    scripted.add(_facts(("home_airport", "The user's home airport is LIS.", 0.95)))

    turn_memories_write(turn_id=turn.id)

    written = list(Memory.objects.filter(source_turn=turn))
    assert {m.kind for m in written} == {"episodic", "semantic"}
    assert all(m.occurred_at == said and m.created_at > said + timedelta(hours=4) for m in written)


@pytest.mark.django_db
def test_merging_near_duplicates_works_and_keeps_one_in_force(alice: Any) -> None:
    a = memory_create(user=alice, kind="semantic", text="The user likes tea")
    b = memory_create(user=alice, kind="semantic", text="The user likes tea.")
    archived = memory_create(user=alice, kind="semantic", text="The user likes tea!")
    Memory.objects.filter(pk=archived.pk).update(archived=True)
    archived.refresh_from_db()
    kept = memories_merge(memories=[archived, a, b])
    kept.refresh_from_db()
    assert kept.pk != archived.pk and not kept.archived and kept.valid_to is None  # one in force is kept
    assert kept.text == "The user likes tea." or kept.text == "The user likes tea"
    current = Memory.objects.filter(user=alice, archived=False, valid_to__isnull=True)
    assert list(current.values_list("pk", flat=True)) == [kept.pk]


@pytest.mark.django_db
def test_a_merge_proposes_each_text_once_as_it_ends(alice: Any) -> None:
    """A text that ends a sentence inside brackets or quotes gets no second full stop (the desk proposed
    "…or tell me what to change.)."); one without an end gets one; the same sentence twice is proposed once."""
    from memory.services import merge_plan

    asked = memory_create(
        user=alice,
        kind="episodic",
        text="Assistant: Shall I book it? (Say yes, or tell me what to change.)",
        importance=1,
    )
    quoted = memory_create(user=alice, kind="episodic", text='User said "book it!"', importance=0.8)
    bare = memory_create(user=alice, kind="episodic", text="User: to Paris", importance=0.6)
    again = memory_create(user=alice, kind="episodic", text="User: to Paris.", importance=0.4)
    _keeper, _others, combined = merge_plan([asked, quoted, bare, again])
    assert combined == (
        'Assistant: Shall I book it? (Say yes, or tell me what to change.)\nUser said "book it!"\nUser: to Paris.'
    )
