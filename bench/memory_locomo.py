"""LoCoMo retrieval: recall of evidence turns at k = 5, 10, 25 through the real memory selector.

Each LoCoMo conversation is ingested as the episodic memories of one user (one memory per turn, dated by
its session), every question is asked through ``memories_for_prompt`` under a 2,000-token memory budget,
and the ranked memories are compared with the question's evidence turns. The data is read from
``../shared/eval/locomo10.json`` (CC BY-NC 4.0, evaluation only) and never copied into the repository.

Run alone: ``python -m bench.memory_locomo [--threshold 0.0] [--limit-questions N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.memory_corpora import parse_session_date, turn_text

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "eval" / "locomo10.json"
RESULTS = ROOT / "bench" / "results"
DATABASE = "bench_memory_locomo"
BUDGET_TOKENS = 2000
KS = (5, 10, 25)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
PAPER_DRAGON = {"5": 0.567, "10": 0.662, "25": 0.767}  # LoCoMo paper, Table 3, dialog turns
PLAIN_DENSE_MINILM = {"5": 0.334, "10": 0.428, "25": 0.550}  # ../shared/eval/README.md
EVIDENCE_ID = re.compile(r"D:?(\d+):0*(\d+)")
# RRF_K, TEXT_WEIGHT and NEIGHBOUR_WEIGHT (memory/retrieval/tuning.py) were chosen on every 4th question with
# evidence, counting from the first (index % 4 == 0). The other three quarters are the held-out figure.
TUNING_EVERY = 4


def load_conversations() -> list[dict[str, Any]]:
    """Conversations as {"id", "turns": [(dia_id, text, when)], "questions": [...]}."""
    raw = json.loads(DATA.read_text())
    out = []
    for sample in raw:
        conv = sample["conversation"]
        turns: list[tuple[str, str, datetime]] = []
        numbers = sorted(
            int(m.group(1))
            for key in conv
            if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(conv[key], list)
        )
        for n in numbers:
            when = parse_session_date(conv[f"session_{n}_date_time"])
            for i, turn in enumerate(conv[f"session_{n}"]):
                turns.append((turn["dia_id"], turn_text(turn), when + timedelta(seconds=i)))
        questions = []
        for qa in sample["qa"]:
            evidence = set()
            for item in qa.get("evidence", []):
                for m in EVIDENCE_ID.finditer(item):
                    evidence.add(f"D{int(m.group(1))}:{int(m.group(2))}")
            questions.append({"question": qa["question"], "category": qa["category"], "evidence": evidence})
        out.append({"id": sample["sample_id"], "turns": turns, "questions": questions})
    return out


def ingest(conversations: list[dict[str, Any]]) -> dict[str, tuple[Any, dict[int, str], datetime]]:
    """(user, memory id → dia_id, time after the last session) per conversation, with cached embeddings."""
    from django.contrib.auth import get_user_model

    from bench.memory_cache import cached_embed
    from memory.embedding import get_embedder
    from memory.models import Memory
    from memory.services import EPISODE_IMPORTANCE, content_hash_for

    embedder = get_embedder()
    all_texts = [t for c in conversations for _, t, _ in c["turns"]]
    vectors = cached_embed(embedder, all_texts)
    from agents.models import Agent
    from sessions.models import ChatSession

    User = get_user_model()
    Memory.objects.all().delete()
    ChatSession.objects.filter(user__username__startswith="locomo-").delete()
    User.objects.filter(username__startswith="locomo-").delete()
    agent, _ = Agent.objects.get_or_create(slug="bench-locomo", defaults={"name": "LoCoMo", "system_prompt": "-"})
    out = {}
    offset = 0
    for conv in conversations:
        user = User.objects.create(username=f"locomo-{conv['id']}")
        rows = []
        # Each LoCoMo session a chat session of its own, as the turns would have been written: the episodes
        # next to a match are its neighbours only within its session.
        sessions: dict[str, ChatSession] = {}
        for i, (dia_id, text, when) in enumerate(conv["turns"]):
            number = dia_id.split(":")[0]
            if number not in sessions:
                sessions[number] = ChatSession.objects.create(
                    user=user, agent=agent, workflow="free_chat", state="CHATTING", title=number
                )
            rows.append(
                Memory(
                    user=user,
                    kind=Memory.Kind.EPISODIC,
                    text=text,
                    importance=EPISODE_IMPORTANCE,
                    embedding=vectors[offset + i].tolist(),
                    embedding_model=embedder.name,
                    content_hash=content_hash_for(text),
                    source_session=sessions[number],
                    occurred_at=when,
                    created_at=when,
                    valid_from=when,
                )
            )
        created = Memory.objects.bulk_create(rows, batch_size=500)
        dia = {m.id: conv["turns"][i][0] for i, m in enumerate(created)}
        last = max(w for _, _, w in conv["turns"]) + timedelta(days=1)
        out[conv["id"]] = (user, dia, last)
        offset += len(conv["turns"])
    # As autovacuum would by the time anyone searches: a re-run deletes the last run's rows, and scans
    # over their dead tuples (and a stale visibility map) would be measured instead of retrieval.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) memory_memory")
    return out


def evaluate(
    conversations: list[dict[str, Any]],
    ingested: dict[str, tuple[Any, dict[int, str], datetime]],
    *,
    threshold: float,
    limit_questions: int | None,
) -> dict[str, Any]:
    from memory.retrieval import memories_for_prompt

    recalls: dict[int, list[float]] = {k: [] for k in KS}
    held_out: dict[int, list[float]] = {k: [] for k in KS}
    tuning: dict[int, list[float]] = {k: [] for k in KS}
    by_cat: dict[int, dict[int, list[float]]] = defaultdict(lambda: {k: [] for k in KS})
    tokens: list[int] = []
    tokens_top10: list[int] = []
    kept: list[int] = []
    kept_evidence = 0
    latency: list[float] = []
    asked = 0
    total = sum(1 for c in conversations for q in c["questions"] if q["evidence"])
    progress = tqdm(
        total=min(total, limit_questions or total), desc=f"questions (threshold {threshold:g})", mininterval=2
    )
    for conv in conversations:
        user, dia, now = ingested[conv["id"]]
        for q in conv["questions"]:
            if limit_questions is not None and asked >= limit_questions:
                break
            if not q["evidence"]:
                continue
            asked += 1
            progress.update(1)
            started = time.perf_counter()
            result = memories_for_prompt(
                user=user,
                query=q["question"],
                budget_tokens=BUDGET_TOKENS,
                relevance_threshold=threshold,
                use_model_filter=False,
                now=now,
                touch=False,  # as the runtime: access counts are written by the turn's memory task
            )
            latency.append((time.perf_counter() - started) * 1000)
            ranked = [dia.get(i.memory.id, "") for i in result.items]
            tokens.append(result.total_tokens)
            tokens_top10.append(sum(i.tokens for i in result.items[:10]))
            kept.append(len(ranked))
            kept_evidence += len(q["evidence"] & set(ranked))
            for k in KS:
                r = len(q["evidence"] & set(ranked[:k])) / len(q["evidence"])
                recalls[k].append(r)
                by_cat[q["category"]][k].append(r)
                (tuning if (asked - 1) % TUNING_EVERY == 0 else held_out)[k].append(r)

    progress.close()

    def mean(xs: list[float]) -> float:
        return round(statistics.fmean(xs), 4) if xs else 0.0

    return {
        "questions": asked,
        "relevance_threshold": threshold,
        "recall": {str(k): mean(recalls[k]) for k in KS},
        "recall_held_out": {str(k): mean(held_out[k]) for k in KS} | {"questions": len(held_out[KS[0]])},
        "recall_tuning_quarter": {str(k): mean(tuning[k]) for k in KS} | {"questions": len(tuning[KS[0]])},
        "recall_by_category": {
            CATEGORIES[c]: {str(k): mean(v[k]) for k in KS} | {"questions": len(v[KS[0]])}
            for c, v in sorted(by_cat.items())
        },
        "memory_tokens_per_query": {"mean": round(statistics.fmean(tokens), 1), "max": max(tokens)},
        "memory_tokens_top10_mean": round(statistics.fmean(tokens_top10), 1),
        # The noise the relevance filter lets through: memories kept a question, and how many of all the
        # kept ones are evidence turns (an evidence turn kept twice counts once).
        "memories_kept_per_query": round(statistics.fmean(kept), 2),
        "evidence_share_of_kept": round(kept_evidence / max(1, sum(kept)), 4),
        "retrieval_ms": {
            "p50": round(statistics.median(latency), 2),
            "p95": round(statistics.quantiles(latency, n=20)[18], 2),
        },
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.memory_locomo", description=__doc__)
    parser.add_argument("--threshold", type=float, action="append", help="relevance thresholds (default 0 and 0.5)")
    parser.add_argument("--limit-questions", type=int, default=None)
    parser.add_argument("--no-write", action="store_true", help="print only; do not write bench/results")
    args, _ = parser.parse_known_args(argv)  # options after "--" are shared by every part
    if not DATA.exists():
        print(f"LoCoMo data not found at {DATA}; skipping", file=sys.stderr)
        return 0
    from django.conf import settings

    from bench.memory_db import use_database

    # The real embedder: the point is retrieval quality, not the store.
    settings.EMBEDDING_BACKEND = os.environ.get("BENCH_EMBEDDING_BACKEND", "sentence-transformers")
    # LoCoMo has no "actions": the last turns of the last session would take 3 of the top-k slots of every
    # question. In the app they are the newest turns, which the prompt's recent window shows anyway.
    settings.MEMORY_RECENT_ACTIONS = 0
    use_database(DATABASE)
    conversations = load_conversations()
    started = time.perf_counter()
    ingested = ingest(conversations)
    ingest_s = time.perf_counter() - started
    runs = [
        evaluate(conversations, ingested, threshold=t, limit_questions=args.limit_questions)
        for t in (args.threshold or [0.0, 0.5])
    ]
    report = {
        "benchmark": "LoCoMo retrieval (evidence-turn recall) through memory.retrieval.memories_for_prompt",
        "data": "../shared/eval/locomo10.json (10 conversations, 5,882 turns; questions with evidence)",
        "embedder": settings.EMBEDDING_BACKEND,
        "memory_budget_tokens": BUDGET_TOKENS,
        "model_filter": "off (no LLM in the bench): the threshold fallback ranks and filters",
        "recent_actions": 0,
        "ingest_seconds": round(ingest_s, 1),
        "runs": runs,
        "reference": {"locomo_paper_dragon_dialog_turns": PAPER_DRAGON, "plain_dense_minilm": PLAIN_DENSE_MINILM},
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print(json.dumps(report, indent=2))
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "memory_locomo.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    raise SystemExit(main(sys.argv[1:]))
