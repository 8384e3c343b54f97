"""Retrieval quality on fixed corpora: the default pipeline must not fall below plain dense retrieval (on
`people`, by more than one turn: SLACK_QUERIES below says why).

The corpora were written by hand for this project (``bench/memory_corpora.py``):
- ``persona`` (``bench/corpora/persona.json``): one invented person's independent memories and short
  conversational turns labelled with the memories a reply needs;
- ``life_dialogues`` (``bench/corpora/life_dialogues.json``): one person's 160 independent episodes; each query
  is his side of a conversation so far (several utterances, 80-170 tokens: everyday asides that share words
  with unrelated memories, around one call-back to an event in other words);
- ``people`` (``bench/corpora/people_*.json``): two invented people's 120 independent memories each and 96
  short turns each, two in five of them saying their need in other words while sharing an incidental word
  with an unrelated memory.

Memories go in with the real embedder; the queries go through ``GET /api/memories/search/`` with nothing but
``q``, as a client would send them. Plain dense is the same embedder's cosine top-k over the same memories.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np
import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from bench.memory_corpora import Corpus, life_dialogues, people, persona
from bench.memory_eval import recall_at
from memory.embedding import get_embedder
from memory.models import Memory
from memory.services import content_hash_for

pytestmark = [pytest.mark.django_db, pytest.mark.real_embedder]


def _recalls(django_user_model: Any, corpus: Corpus) -> dict[str, dict[int, float]]:
    # The corpus is written as of its own "now": moved to today, so the test means the same on any date
    # (recency is part of the ranking).
    shift = timezone.now() - corpus.queries[0].now
    embedder = get_embedder()
    people: dict[str, tuple[APIClient, np.ndarray, list[str], dict[int, str]]] = {}
    for key, specs in corpus.memories.items():  # one user a person of the corpus
        user = django_user_model.objects.create_user(username=f"quality-{key}")
        vectors = np.asarray(embedder.embed([m.text for m in specs]), dtype=np.float32)
        rows = Memory.objects.bulk_create(
            Memory(
                user=user,
                kind=spec.kind,
                text=spec.text,
                embedding=vectors[i].tolist(),
                embedding_model=embedder.name,
                content_hash=content_hash_for(spec.text),
                occurred_at=spec.occurred_at + shift,
                valid_from=spec.occurred_at + shift,
            )
            for i, spec in enumerate(specs)
        )
        client = APIClient()
        client.force_authenticate(user)
        people[key] = (client, vectors, [s.label for s in specs], {m.id: specs[i].label for i, m in enumerate(rows)})
    found: dict[str, dict[int, list[float]]] = {"dense": {}, "api": {}}
    for q in corpus.queries:
        client, vectors, labels, label = people[q.user]
        order = np.argsort(-(vectors @ np.asarray(embedder.embed_query(q.text))), kind="stable")
        response = client.get(reverse("api-memory-search"), {"q": q.text})
        assert response.status_code == 200, response.content
        ranked = {
            "dense": [labels[j] for j in order],
            "api": [label[hit["memory"]["id"]] for hit in response.json()["items"]],
        }
        for name, labels in ranked.items():
            for k in (5, 10):
                found[name].setdefault(k, []).append(recall_at(labels, q.relevant, k))
    return {name: {k: statistics.fmean(v) for k, v in by_k.items()} for name, by_k in found.items()}


# The least the defaults must recall at 10 on each (a floor under today's figures, so a starving filter or a
# broken arm fails even where dense fails with it): persona's filter of old kept 0.44 of it.
FLOOR_AT_10 = {"persona": 0.85, "life_dialogues": 0.5, "people": 0.85}
# How many queries' worth the defaults may recall below dense, a corpus: none on the two fixed corpora of issue
# 35. On `people`, one: its stores are of independent facts, where fusion keeps a light hubness correction
# (HUB_DIVERSE_SHARE), and among its 192 turns one ("My little mutt won't stop pawing at the side of his
# face…") has four memories within 0.01 of each other by cosine at places 3 to 6, and the correction moves its
# answer from 3rd to 6th (in memory_eval over all 192 turns: that turn loses one at 5, another gains half a
# turn at 5, a third gains one at 10). Before the store's redundancy weighed the corrections, `people` was
# about 18 turns' worth below dense at 5.
SLACK_QUERIES = {"persona": 0, "life_dialogues": 0, "people": 1}


@pytest.mark.parametrize("build", [persona, life_dialogues, people], ids=["persona", "life_dialogues", "people"])
def test_default_search_recalls_at_least_what_plain_dense_does(django_user_model: Any, build: Any) -> None:
    corpus = build()
    recalls = _recalls(django_user_model, corpus)

    slack = SLACK_QUERIES[corpus.name] / len(corpus.queries)
    for k in (5, 10):
        assert recalls["api"][k] >= recalls["dense"][k] - slack, (k, recalls)
    assert recalls["api"][10] >= FLOOR_AT_10[corpus.name], recalls
