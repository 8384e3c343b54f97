"""Retrieval latency at scale: N synthetic memories over U users (one of them with a big history).

Built once into its own database (``bench_scale``) and reused: users, then a COPY (binary) of random
unit vectors and synthetic text, every user's rows interleaved as real writes are, then the HNSW and GIN
indexes built after the load with ``maintenance_work_mem`` raised, and a VACUUM. Then what the app's daily
task does (``memory.services.user_indexes_sync``: an HNSW index of their own for users past
``MEMORY_EXACT_SEARCH_MAX``), and the table and its indexes loaded into PostgreSQL's buffer cache
(``pg_prewarm``), as on a server in steady state. Then queries as random users (half of them as the big
user) through the selector as a turn calls it, and the p50/p95/p99 of:
- tiers 1-2 (exact lookups + vector and full-text candidates and their fusion), query vector given,
  with the same figures for each part;
- the whole retrieval without the model filter, query vector given;
- the whole retrieval including embedding the query with the configured embedder.

Run alone: ``python -m bench memory_scale -- --memories 1000000 --users 1000 --big-user 100000``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DATABASE = "bench_scale"
DIMS = 384
VOCABULARY = 5000
CHUNK = 20_000  # rows generated at a time
COLUMNS = (
    "user_id, kind, text, fact_key, trigger, workflow, embedding, embedding_model, importance, pinned, archived, "
    "needs_review, valid_from, occurred_at, created_at, updated_at, content_hash, access_count"
)


def _vocabulary(rng: np.random.Generator) -> list[str]:
    syllables = ["ka", "lo", "mi", "ra", "te", "su", "no", "vi", "da", "pe", "zu", "gor", "lin", "tam", "bri", "sel"]
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(syllables, size=int(rng.integers(2, 5)))))
    return sorted(words)


def _zipf_words(rng: np.random.Generator, vocab: list[str], n: int) -> list[str]:
    ranks = np.minimum(rng.zipf(1.3, size=n), len(vocab)) - 1
    return [vocab[i] for i in ranks]


def _plan(memories: int, users: int, big_user: int) -> list[int]:
    rest = max(0, memories - big_user)
    per = [rest // (users - 1)] * (users - 1)
    for i in range(rest - sum(per)):
        per[i] += 1
    return [big_user, *per]


def build(*, memories: int, users: int, big_user: int, seed: int = 7) -> dict[str, Any]:
    """Load the synthetic data unless the database already holds exactly this size."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from pgvector.psycopg import register_vector

    from memory.models import Memory

    User = get_user_model()
    have_users = User.objects.filter(username__startswith="scale-").count()
    if have_users == users and Memory.objects.count() == memories:
        return {"reused": True}
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE memory_memoryreview, memory_memory RESTART IDENTITY CASCADE")
        cursor.execute("DROP INDEX IF EXISTS memory_embedding_hnsw")
        cursor.execute("DROP INDEX IF EXISTS memory_search_gin")
    User.objects.filter(username__startswith="scale-").delete()
    created = User.objects.bulk_create([User(username=f"scale-{i:05d}") for i in range(users)], batch_size=1000)
    user_ids = [u.pk for u in created]
    plan = _plan(memories, users, big_user)
    now = datetime.now(UTC)
    raw = connection.connection  # the psycopg connection under Django's
    register_vector(raw)
    loaded = 0
    progress = tqdm(total=memories, unit=" memories", desc="loading", mininterval=2.0)
    with progress, raw.cursor() as cur:
        with cur.copy(f"COPY memory_memory ({COLUMNS}) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(
                [
                    "int4", "varchar", "text", "varchar", "varchar", "varchar", "vector", "varchar", "float8",
                    "bool", "bool", "bool", "timestamptz", "timestamptz", "timestamptz", "timestamptz", "varchar",
                    "int4",
                ]
            )  # fmt: skip
            # Rows of all users interleave, as they do when memories are written over time (a per-user
            # block would flatter every scan that follows the user index to the heap).
            owners = np.repeat(np.arange(users), plan)
            rng.shuffle(owners)
            per_user = [0] * users
            for chunk_start in range(0, len(owners), CHUNK):
                chunk = owners[chunk_start : chunk_start + CHUNK]
                count = len(chunk)
                vectors = rng.standard_normal((count, DIMS), dtype=np.float32)
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                words = _zipf_words(rng, vocab, count * 12)
                kinds = rng.random(count)
                ages = rng.random(count) * 365
                for j in range(count):
                    owner = int(chunk[j])
                    user_id = user_ids[owner]
                    i = per_user[owner]
                    per_user[owner] += 1
                    text = " ".join(words[j * 12 : (j + 1) * 12])
                    semantic = kinds[j] < 0.08
                    created_at = now - timedelta(days=float(ages[j]))
                    copy.write_row(
                        (
                            user_id,
                            "semantic" if semantic else "episodic",
                            f"{text} #{i}" if semantic else text,
                            f"attr_{i % 7}" if semantic and i % 50 == 0 else "",
                            "",
                            "",
                            vectors[j],
                            "random-unit-vectors",
                            0.5,
                            bool(kinds[j] > 0.995),
                            False,
                            False,
                            created_at,
                            created_at,
                            created_at,
                            created_at,
                            f"{user_id}-{i}",
                            0,
                        )
                    )
                loaded += count
                progress.update(count)
    # The generated fact keys can repeat per user; a current fact per key is the app's invariant.
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    with connection.cursor() as cursor, _index_progress("HNSW index"):
        cursor.execute("SET maintenance_work_mem = '3GB'")
        cursor.execute("SET max_parallel_maintenance_workers = 2")
        cursor.execute(
            "CREATE INDEX memory_embedding_hnsw ON memory_memory USING hnsw (embedding vector_cosine_ops) "
            "WITH (m = 16, ef_construction = 64)"
        )
    hnsw_s = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("CREATE INDEX memory_search_gin ON memory_memory USING gin (search_vector)")
        # VACUUM too, as autovacuum would: it sets the visibility map that index-only scans need.
        cursor.execute("VACUUM (ANALYZE) memory_memory")
    return {
        "reused": False,
        "load_seconds": round(load_s, 1),
        "hnsw_build_seconds": round(hnsw_s, 1),
        "index_seconds": round(time.perf_counter() - started, 1),
        "loaded": loaded,
    }


@contextmanager
def _index_progress(label: str) -> Iterator[None]:
    """A progress bar for a CREATE INDEX running on this connection, read from another one."""
    import threading

    import psycopg
    from django.db import connection

    from bench.turn_overhead import _conninfo

    stop = threading.Event()

    def poll() -> None:
        with (
            psycopg.connect(_conninfo(connection.settings_dict["NAME"]), autocommit=True) as conn,
            tqdm(total=100, desc=label, unit="%", bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}") as bar,
        ):
            while not stop.wait(5.0):
                row = conn.execute(
                    "SELECT phase, blocks_done, blocks_total FROM pg_stat_progress_create_index "
                    "WHERE datname = current_database()"
                ).fetchone()
                if row and row[2]:
                    bar.n = round(100 * row[1] / row[2], 1)
                    bar.set_postfix_str(row[0])

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def prewarm() -> dict[str, Any]:
    """Load the memories table and its indexes into PostgreSQL's buffer cache (pg_prewarm), as a server
    in steady state holds its working set; returns what fits and how long it took."""
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        cursor.execute("SHOW shared_buffers")
        shared_buffers = str(cursor.fetchone()[0])
        cursor.execute(
            "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c "
            "WHERE c.oid = 'memory_memory'::regclass "
            "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'memory_memory'::regclass) "
            "ORDER BY pg_relation_size(c.oid) DESC"
        )
        relations = cursor.fetchall()
        total = sum(size for _, size in relations)
        for name, _size in tqdm(relations, desc="pg_prewarm", unit=" relations"):
            cursor.execute("SELECT pg_prewarm(%s::regclass)", [name])
    return {
        "shared_buffers": shared_buffers,
        "relations_mb": round(total / 2**20),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _percentiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {
        "p50": round(statistics.median(values), 2),
        "p95": round(q[94], 2),
        "p99": round(q[98], 2),
        "n": len(values),
    }


def measure(*, queries: int, seed: int = 11) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from memory.embedding import get_embedder
    from memory.retrieval import memories_for_prompt

    rng = np.random.default_rng(seed)
    vocab = _vocabulary(np.random.default_rng(7))
    users = list(get_user_model().objects.filter(username__startswith="scale-").order_by("username"))
    big, normal = users[0], users[1:]
    embedder = get_embedder()
    embedder.embed_query("warm up the model")
    out: dict[str, Any] = {}
    parts = ("tier1", "history_size", "text_search", "exact_search", "vector_search", "neighbours_and_rows")
    for label, pick in (("big_user", lambda: big), ("normal_user", lambda: normal[int(rng.integers(len(normal)))])):
        series: dict[str, list[float]] = {"tiers_1_2": [], "retrieval_no_model": [], "retrieval_with_embedding": []}
        breakdown: dict[str, list[float]] = {part: [] for part in parts}
        for i in range(queries + 5):
            user = pick()
            query = " ".join(_zipf_words(rng, vocab, 6))
            vector = rng.standard_normal(DIMS).astype(np.float32)
            vector = (vector / np.linalg.norm(vector)).tolist()
            # The runtime's path: the selector as a turn calls it (access counts are left to the write task).
            started = time.perf_counter()
            result = memories_for_prompt(
                user=user, query=query, budget_tokens=2000, use_model_filter=False, query_vector=vector, touch=False
            )
            whole = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            memories_for_prompt(user=user, query=query, budget_tokens=2000, use_model_filter=False, touch=False)
            with_embedding = (time.perf_counter() - started) * 1000
            if i >= 5:  # the first few warm caches and connections
                timings = result.timings_ms
                series["tiers_1_2"].append(timings["tier1"] + timings["tier2"])
                series["retrieval_no_model"].append(whole)
                series["retrieval_with_embedding"].append(with_embedding)
                for part in parts:
                    if part in timings:  # small histories: exact_search; big ones: vector_search
                        breakdown[part].append(timings[part])
        out[label] = {name: _percentiles(values) for name, values in series.items()}
        out[label]["tiers_1_2_parts"] = {part: _percentiles(xs) for part, xs in breakdown.items() if len(xs) > 1}
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.memory_scale", description=__doc__)
    parser.add_argument("--memories", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--big-user", type=int, default=None, help="memories of the biggest user (default: 10%%)")
    parser.add_argument("--queries", type=int, default=200, help="per user group")
    parser.add_argument("--database", default=DATABASE)
    parser.add_argument("--no-write", action="store_true")
    args, _ = parser.parse_known_args(argv)  # options after "--" are shared by every part
    big_user = args.big_user if args.big_user is not None else args.memories // 10
    from django.conf import settings

    from bench.memory_db import use_database

    settings.EMBEDDING_BACKEND = os.environ.get("BENCH_EMBEDDING_BACKEND", "sentence-transformers")
    use_database(args.database)
    print(f"building {args.memories:,} memories over {args.users:,} users (biggest {big_user:,}) ...", flush=True)
    built = build(memories=args.memories, users=args.users, big_user=big_user)
    print(json.dumps(built), flush=True)
    from memory.services import user_indexes_sync

    started = time.perf_counter()
    synced = user_indexes_sync()  # what the daily task does: an HNSW index of their own for big histories
    built["user_indexes"] = {
        "created": synced.created,
        "kept": synced.kept,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps({"user_indexes": built["user_indexes"]}), flush=True)
    warmed = prewarm()
    print(json.dumps({"prewarm": warmed}), flush=True)
    figures = measure(queries=args.queries)
    report = {
        "benchmark": "memory retrieval latency at scale (memories_for_prompt, model filter off)",
        "size": {"memories": args.memories, "users": args.users, "biggest_user": big_user},
        "build": built,
        "buffer_cache": warmed,
        "hnsw": {
            "m": 16,
            "ef_construction": 64,
            "ef_search": settings.MEMORY_HNSW_EF_SEARCH,
            "iterative_scan": "relaxed_order",
        },
        "candidates_per_arm": settings.MEMORY_CANDIDATES,
        "embedder": settings.EMBEDDING_BACKEND,
        "latency_ms": figures,
        "goal": "p95 of tiers 1-2 <= 20 ms",
        "machine": f"{os.cpu_count()} cores (shared with other work while measured)",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print(json.dumps(report, indent=2))
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "memory_scale.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    raise SystemExit(main(sys.argv[1:]))
