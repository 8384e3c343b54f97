"""How redundant a user's store is decides how far fusion corrects plain meaning (memory/retrieval/redundancy.py):
whole in a store of lookalikes (conversation turns), only for codes and a little hubness in a store of
independent facts. The vectors here are made by hand, so the shape of each store is exact."""

from __future__ import annotations

import struct
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.conf import settings
from django.utils import timezone

from memory.models import Memory
from memory.retrieval import memories_for_prompt, tuning, word_candidates
from memory.retrieval.redundancy import correction_scale, redundancy, store_redundancy
from memory.retrieval.words import is_code
from memory.services import content_hash_for

pytestmark = pytest.mark.django_db

DIM = int(settings.EMBEDDING_DIMENSIONS)


def _send(vector: np.ndarray) -> bytes:
    """A vector as pgvector's vector_send writes it: dimensions and a spare int16, then big-endian float4s."""
    return struct.pack(">hh", len(vector), 0) + np.asarray(vector, dtype=">f4").tobytes()


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(DIM)
    return v / np.linalg.norm(v)


def test_redundancy_is_the_mean_cosine_of_each_vector_to_its_nearest_fellows() -> None:
    basis = np.eye(4)
    assert redundancy([_send(v) for v in basis], k=2) == pytest.approx(0.0)  # nothing alike
    assert redundancy([_send(np.ones(4))] * 3, k=2) == pytest.approx(1.0)  # all the same
    # Two pairs, each alike within and orthogonal across: with k=1 each finds its twin (cosine 0.8).
    a, b = np.array([1.0, 0, 0, 0]), np.array([0.8, 0.6, 0, 0])
    c, d = np.array([0, 0, 1.0, 0]), np.array([0, 0, 0.8, 0.6])
    assert redundancy([_send(v) for v in (a, b, c, d)], k=1) == pytest.approx(0.8)
    assert redundancy([_send(v) for v in (a, b, c, d)], k=3) == pytest.approx(0.8 / 3)
    assert redundancy([_send(a)], k=10) == 0.0 and redundancy([], k=10) == 0.0
    assert redundancy([_send(a), _send(np.zeros(4))], k=10) == pytest.approx(0.0)  # a zero vector is like nothing


def test_the_corrections_ramp_from_the_floor_to_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning, "REDUNDANCY_FLOOR", 0.5)
    monkeypatch.setattr(tuning, "REDUNDANCY_FULL", 0.6)
    assert correction_scale(0.3) == 0.0 and correction_scale(0.5) == 0.0
    assert correction_scale(0.55) == pytest.approx(0.5)
    assert correction_scale(0.6) == 1.0 and correction_scale(0.9) == 1.0
    assert correction_scale(None) == 1.0  # not measured: as it always was
    monkeypatch.setattr(tuning, "REDUNDANCY_FLOOR", -1.0)
    monkeypatch.setattr(tuning, "REDUNDANCY_FULL", -1.0)
    assert correction_scale(0.0) == 1.0  # the switch that applies them everywhere


def test_a_word_with_a_digit_is_a_code() -> None:
    assert is_code("qx7731") and is_code("5528190") and is_code("a64") and is_code("3")
    assert not is_code("spain") and not is_code("kiełbasa")


def _store(user: Any, texts_and_vectors: list[tuple[str, np.ndarray]]) -> dict[str, Memory]:
    now = timezone.now()
    rows = Memory.objects.bulk_create(
        Memory(
            user=user,
            kind="semantic",
            text=text,
            embedding=vector.tolist(),
            embedding_model="hand-made",
            content_hash=content_hash_for(f"{text}#{i}"),
            occurred_at=now,
            valid_from=now,
        )
        for i, (text, vector) in enumerate(texts_and_vectors)
    )
    return {m.text: m for m in rows}


PET = "The user's cat Biscuit is fed by the neighbour Mrs Okafor."
TRIP = "The user spent a week in Spain in May, mostly in Seville."
CODE = "The user's customer number with the pump supplier is 5528190."
QUERY = "Who looks after my pet while we're away in Spain?"


def _two_stores(user: Any, *, alike: bool) -> tuple[dict[str, Memory], np.ndarray, np.ndarray]:
    """40 filler memories, a pet, a trip and a code; ``alike``: every vector near one direction (a store of
    lookalikes), else each in its own direction (independent facts). Meaning puts the pet first for QUERY,
    by a little; the trip shares its one word "Spain". Returns the rows, QUERY's vector and a code query's."""
    rng = np.random.default_rng(7)
    base = _unit(rng)

    def vector() -> np.ndarray:
        v = 0.85 * base + 0.15 * _unit(rng) if alike else _unit(rng)
        return v / np.linalg.norm(v)

    pet, trip, code = vector(), vector(), vector()
    fillers = [(f"Filler memory number {word} about nothing in particular.", vector()) for word in _words(40)]
    rows = _store(user, [(PET, pet), (TRIP, trip), (CODE, code), *fillers])
    query = 0.75 * pet + 0.25 * trip + 0.2 * base
    # What an embedder makes of a bare number: a vague query, nearer to other memories than to the code's.
    vague = 0.6 * pet + 0.35 * code + 0.2 * base
    return rows, query / np.linalg.norm(query), vague / np.linalg.norm(vague)


def _words(n: int) -> list[str]:
    """n distinct plain words (no digits: the fillers must not match a code)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [letters[i % 26] + letters[(i // 26) % 26] + "ward" for i in range(n)]


def _search(user: Any, query: str, vector: np.ndarray) -> Any:
    return memories_for_prompt(
        user=user,
        query=query,
        query_vector=vector.tolist(),
        budget_tokens=2000,
        use_model_filter=False,
        relevance_threshold=0.0,
        touch=False,
    )


def test_a_store_of_lookalikes_lets_a_shared_word_decide(alice: Any) -> None:
    rows, query, _ = _two_stores(alice, alike=True)

    found = _search(alice, QUERY, query)

    report = found.as_report()
    assert report["redundancy"] > tuning.REDUNDANCY_FULL and report["corrections"] == 1.0
    assert report["word_weight"] == pytest.approx(1.0 - tuning.VECTOR_SHARE)
    assert found.items[0].memory.id == rows[TRIP].id  # its word outweighs the little meaning it lacks


def test_a_store_of_independent_facts_leaves_plain_words_to_meaning_but_finds_a_code_by_its_word(bob: Any) -> None:
    rows, query, vague = _two_stores(bob, alike=False)

    found = _search(bob, QUERY, query)

    report = found.as_report()
    assert report["redundancy"] < tuning.REDUNDANCY_FLOOR and report["corrections"] == 0.0
    assert report["word_weight"] == 0.0  # "Spain" in an unrelated memory does not move it
    assert found.items[0].memory.id == rows[PET].id
    vectors = np.array([m.embedding for m in Memory.objects.filter(user=bob)], dtype=np.float64)
    assert report["redundancy"] == pytest.approx(redundancy([_send(v) for v in vectors], tuning.REDUNDANCY_K), abs=1e-4)

    # A number the embedder cannot read: meaning puts another memory first, its word still finds it.
    found = _search(bob, "what is 5528190 for?", vague)
    by_meaning = max(found.candidates, key=lambda c: c.cosine or -1.0)
    assert by_meaning.id == rows[PET].id
    assert found.as_report()["word_weight"] == pytest.approx(1.0 - tuning.VECTOR_SHARE)
    assert found.items[0].memory.id == rows[CODE].id
    # Plain words beside the code, even the code memory's own, do not water it down.
    found = _search(bob, "the customer number with the pump supplier, 5528190?", vague)
    assert found.as_report()["word_weight"] == pytest.approx(1.0 - tuning.VECTOR_SHARE)
    assert found.items[0].memory.id == rows[CODE].id


def test_in_a_store_of_independent_facts_the_word_arm_returns_only_memories_sharing_a_code(bob: Any) -> None:
    rows, _, _ = _two_stores(bob, alike=False)
    now = timezone.now()

    everything = word_candidates(user_id=bob.pk, query="Spain and 5528190", now=now)
    codes_only = word_candidates(user_id=bob.pk, query="Spain and 5528190", now=now, corrections=0.0)
    halfway = dict(word_candidates(user_id=bob.pk, query="Spain and 5528190", now=now, corrections=0.5))

    assert {i for i, _ in everything} == {rows[TRIP].id, rows[CODE].id}
    assert [i for i, _ in codes_only] == [rows[CODE].id]
    assert 0 < halfway[rows[TRIP].id] < dict(everything)[rows[TRIP].id]


def test_a_query_with_no_code_reads_no_words_in_a_store_of_facts(bob: Any, django_assert_num_queries: Any) -> None:
    _two_stores(bob, alike=False)
    with django_assert_num_queries(0):
        assert word_candidates(user_id=bob.pk, query="Spain in May", now=timezone.now(), corrections=0.0) == []


def test_plain_words_cannot_crowd_an_old_code_out_of_the_word_arms_pool(
    bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, _, _ = _two_stores(bob, alike=False)
    rng = np.random.default_rng(5)
    later = timezone.now() + timedelta(minutes=1)
    Memory.objects.bulk_create(
        Memory(
            user=bob,
            kind="semantic",
            text=f"Another trip to Spain, number {word}.",
            embedding=_unit(rng).tolist(),
            content_hash=content_hash_for(f"spain-{word}"),
            occurred_at=later,
            valid_from=timezone.now(),
            created_at=later,
        )
        for word in _words(10)
    )
    monkeypatch.setattr(tuning, "TEXT_POOL", 5)  # the newest five matches of any word: all "Spain"

    assert word_candidates(user_id=bob.pk, query="Spain 5528190", now=later, corrections=1.0)[0][0] != rows[CODE].id
    assert [i for i, _ in word_candidates(user_id=bob.pk, query="Spain 5528190", now=later, corrections=0.0)] == [
        rows[CODE].id
    ]


def test_the_hubness_discount_follows_the_corrections(bob: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, query, _ = _two_stores(bob, alike=False)
    measured = store_redundancy(bob.pk)
    assert measured is not None

    def hub_weight(floor: float, full: float) -> float:
        monkeypatch.setattr(tuning, "REDUNDANCY_FLOOR", floor)
        monkeypatch.setattr(tuning, "REDUNDANCY_FULL", full)
        return float(_search(bob, QUERY, query).as_report()["hub_weight"])

    assert hub_weight(measured + 0.1, measured + 0.2) == pytest.approx(tuning.HUB_WEIGHT * tuning.HUB_DIVERSE_SHARE)
    half = tuning.HUB_WEIGHT * (tuning.HUB_DIVERSE_SHARE + (1 - tuning.HUB_DIVERSE_SHARE) / 2)
    assert hub_weight(measured - 0.1, measured + 0.1) == pytest.approx(half, abs=1e-4)
    assert hub_weight(measured - 0.2, measured - 0.1) == pytest.approx(tuning.HUB_WEIGHT)


def test_a_store_too_small_to_measure_keeps_the_corrections_whole(alice: Any) -> None:
    rng = np.random.default_rng(3)
    rows = _store(alice, [(PET, _unit(rng)), (TRIP, _unit(rng))])

    found = _search(alice, QUERY, _unit(rng))

    report = found.as_report()
    assert report["redundancy"] is None and report["corrections"] == 1.0
    assert rows[TRIP].id in {c.id for c in found.candidates if c.word_share and c.word_share > 0}


def test_the_calibrated_filter_keeps_the_first_candidates_when_one_memory_stands_far_above_the_rest(
    alice: Any, settings: Any
) -> None:
    """A relative cut-off alone drops every memory but the standout one; the best CALIBRATED_KEEP_AT_LEAST by
    fused score pass it whatever their share, and only the rest are dropped."""
    settings.MEMORY_RECENT_ACTIONS = 0
    rng = np.random.default_rng(11)
    standout = _unit(rng)
    rows = _store(alice, [(f"Memory {word}.", _unit(rng)) for word in _words(tuning.CALIBRATED_KEEP_AT_LEAST + 5)])
    first = _store(alice, [("The one that matters.", standout)])["The one that matters."]

    found = memories_for_prompt(
        user=alice, query="zzz", query_vector=standout.tolist(), budget_tokens=4000, use_model_filter=False, touch=False
    )

    assert found.filter_mode == "calibrated" and found.items[0].memory.id == first.id
    assert len(found.items) == tuning.CALIBRATED_KEEP_AT_LEAST
    dropped = [c for c in found.candidates if not c.kept]
    assert len(dropped) == len(rows) + 1 - tuning.CALIBRATED_KEEP_AT_LEAST
    assert all(c.reason.startswith("below the calibrated relevance cut-off") for c in dropped)
    assert all(c.relevance is not None and c.relevance < tuning.RELATIVE_KEEP for c in dropped)
    floor_kept = [
        c for c in found.candidates if c.kept and c.relevance is not None and c.relevance < tuning.RELATIVE_KEEP
    ]
    assert floor_kept and all(c.reason.startswith("among the first") for c in floor_kept)


def test_with_no_vector_every_word_counts_in_a_store_of_independent_facts(bob: Any, monkeypatch: Any) -> None:
    """The embedder down: there is no meaning to leave plain words to, so the word arm counts them all."""
    import concurrent.futures

    import memory.retrieval.query as query_module

    rows, _, _ = _two_stores(bob, alike=False)

    def down(text: str, backend: str | None = None) -> concurrent.futures.Future[list[float]]:
        future: concurrent.futures.Future[list[float]] = concurrent.futures.Future()
        future.set_exception(TimeoutError("embedding endpoint too slow"))
        return future

    monkeypatch.setattr(query_module, "embed_query_soon", down)
    found = memories_for_prompt(
        user=bob, query="that week in Spain", budget_tokens=2000, use_model_filter=False, touch=False
    )

    report = found.as_report()
    assert report["degraded"].startswith("words only") and report["redundancy"] < tuning.REDUNDANCY_FLOOR
    assert report["corrections"] == 1.0
    assert [i.memory.id for i in found.items] == [rows[TRIP].id]


def test_the_admins_try_retrieval_shows_what_the_store_measured_and_earned(staff_client: Any, bob: Any) -> None:
    from django.template.defaultfilters import floatformat
    from django.urls import reverse

    _two_stores(bob, alike=False)
    found = memories_for_prompt(user=bob, query=QUERY, budget_tokens=500, use_model_filter=False, touch=False)

    page = staff_client.get(
        reverse("admin:memory_memory_try_retrieval"), {"user": bob.pk, "query": QUERY, "budget_tokens": 500}
    ).content.decode()

    assert found.redundancy is not None and found.corrections == 0.0
    assert f"redundancy <strong>{floatformat(found.redundancy, 3)}</strong>" in page
    assert (
        "corrections <strong>0.00</strong> (plain words count 0.00 of their share, words with a digit all of it)"
        in page
    )
    assert f"crowding × {floatformat(tuning.HUB_WEIGHT * tuning.HUB_DIVERSE_SHARE, 3)}" in page
