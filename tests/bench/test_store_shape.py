"""The store-shape part's measures on stores built to have a known shape (the run itself: bench/store_shape.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.store_shape import adjacency_lift, store_figures, summary
from memory.retrieval import redundancy as redundancy_module
from memory.retrieval import tuning


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _topics_in_runs(n: int, topics: int, seed: int = 0) -> np.ndarray:
    """A conversation-like store: runs of memories near one topic each, the topics one after another."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(topics, 64))
    return _unit(np.repeat(centres, n // topics, axis=0) + 0.6 * rng.normal(size=(n, 64)))


def test_adjacency_lift_is_high_for_runs_of_a_topic_and_none_for_shuffled_ones() -> None:
    store = _topics_in_runs(120, 6)
    shuffled = store[np.random.default_rng(1).permutation(len(store))]
    assert adjacency_lift(store) > 0.3
    assert abs(adjacency_lift(shuffled)) < 0.05


def test_store_figures_measure_as_the_app_and_by_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning, "REDUNDANCY_SAMPLE", 100)
    store = _topics_in_runs(120, 6)
    figures = store_figures(store)
    assert figures["memories"] == 120
    # The app's measure: the newest REDUNDANCY_SAMPLE rows, each one's mean cosine to its REDUNDANCY_K nearest.
    newest = store[-100:]
    sims = newest @ newest.T
    np.fill_diagonal(sims, -np.inf)
    expected = float(np.sort(sims, axis=1)[:, -tuning.REDUNDANCY_K :].mean())
    assert abs(figures["redundancy"] - expected) < 1e-3
    assert figures["corrections"] == round(redundancy_module.correction_scale(figures["redundancy"]), 3)
    # Windows only up to the store's size; a young window of a topic-run store is as redundant as the store.
    assert set(figures["by_size"]["first"]) == {"32", "64"}
    assert figures["by_size"]["first"]["32"] > 0.5
    before = store.copy()
    store_figures(store)
    assert np.array_equal(store, before)  # the caller's vectors are not normalised in place


def test_a_store_too_small_to_measure_gets_the_corrections_whole_as_the_app_gives_them() -> None:
    figures = store_figures(_topics_in_runs(tuning.REDUNDANCY_MIN_MEMORIES - 2, 2))
    assert figures["redundancy"] is None
    assert figures["corrections"] == 1.0


def test_summary_gives_each_corpus_its_rows() -> None:
    facts = _unit(np.random.default_rng(2).normal(size=(64, 64)))
    corpora = {
        "locomo_turns": {"stores": {"a": store_figures(_topics_in_runs(64, 4))}},
        "people": {"stores": {"b": store_figures(facts)}},
    }
    rows = summary(corpora)
    assert any(row.startswith("| locomo_turns | newest |") and "1 store," in row for row in rows)
    assert any(row.startswith("| people | first |") for row in rows)
