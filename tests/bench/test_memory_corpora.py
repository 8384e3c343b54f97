"""The young-conversation corpus is built as its docs say: whole first sessions, questions answerable there."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bench.memory_corpora import LOCOMO, YOUNG_TURNS, locomo_turns, locomo_young

pytestmark = pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo data not found beside the repository")


def test_locomo_young_keeps_whole_first_sessions_and_the_questions_they_answer() -> None:
    full, young = locomo_turns(), locomo_young()
    assert set(young.memories) == set(full.memories)
    for user, kept in young.memories.items():
        grown = full.memories[user]
        sessions = list(dict.fromkeys(m.session for m in grown))
        first = [m for m in grown if m.session == sessions[0]]
        assert 0 < len(kept) <= max(YOUNG_TURNS, len(first))  # a first session longer than the cap is kept whole
        assert kept == grown[: len(kept)]  # the first turns, in order
        if len(kept) < len(grown):
            assert kept[-1].session != grown[len(kept)].session  # cut at a session's end...
            following = [m for m in grown if m.session == grown[len(kept)].session]
            assert len(kept) + len(following) > YOUNG_TURNS  # ...as late as the cap allows
        asked = {q.now for q in young.queries if q.user == user}
        assert asked <= {kept[-1].occurred_at + timedelta(days=1)}  # the day after the young store's last turn
    labels = {user: {m.label for m in kept} for user, kept in young.memories.items()}
    assert young.queries
    assert all(q.relevant <= labels[q.user] for q in young.queries)
    # Every question of the grown conversation whose evidence lies in the young one is asked.
    answerable = [q for q in full.queries if q.relevant <= labels[q.user]]
    assert [q.text for q in young.queries] == [q.text for q in answerable]
