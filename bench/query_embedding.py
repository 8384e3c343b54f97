"""Query embeddings under concurrency: several turns embedding their queries at once, batched or one by one.

``memory.embedding.embed_query_soon`` hands a query to the embedder's query thread, which takes every query
waiting when it comes free and embeds them in one forward pass (``QUERY_BATCH_MAX``). This part runs the
real MiniLM model with C callers, each asking for distinct queries back to back (LoCoMo-like questions,
never cached), and reports queries per second and the latency a caller sees, p50 / p95, for:

- ``batched``: the code as it runs (``QUERY_BATCH_MAX`` = 16);
- ``one_by_one``: the same thread with batches of one (``QUERY_BATCH_MAX`` = 1);
- ``pool``: what came before: a pool of 4 threads, each embedding one query at a time with one torch thread.

Run: ``python -m bench query_embedding [-- --seconds 10 --concurrency 1,8,32]``; writes
``bench/results/query_embedding.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import statistics
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SUBJECTS = ["flight", "sister", "marathon", "pottery class", "new job", "dog", "trip to Porto", "book club"]
ASKS = ["When did I last talk about my {}?", "What did I say about the {} last week?", "Remind me how the {} went"]


def _queries() -> Any:
    for n in itertools.count():
        subject = SUBJECTS[n % len(SUBJECTS)]
        yield ASKS[n % len(ASKS)].format(subject) + f" (#{n})"  # distinct: the process cache never answers


def _run(mode: str, concurrency: int, seconds: float, embedder: Any) -> dict[str, Any]:
    import memory.embedding as embedding
    from memory.embedding import queries

    embedding.query_vectors_forget()  # every mode asks the same queries: none may find another's vectors
    texts = _queries()
    lock = threading.Lock()
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    pool: concurrent.futures.ThreadPoolExecutor | None = None
    if mode == "pool":
        local = threading.local()

        def single(text: str) -> list[float]:
            if not getattr(local, "ready", False):
                embedder.prepare_query_thread()
                local.ready = True
            return list(embedder.embed_query(text))

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
    else:
        queries.QUERY_BATCH_MAX = 16 if mode == "batched" else 1

    def caller() -> None:
        while time.perf_counter() < stop:
            with lock:
                text = next(texts)
            started = time.perf_counter()
            if pool is not None:
                pool.submit(single, text).result()
            else:
                embedding.embed_query_soon(text).result()
            with lock:
                latencies.append((time.perf_counter() - started) * 1000)

    began = time.perf_counter()
    threads = [threading.Thread(target=caller) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    if pool is not None:
        pool.shutdown()
    return {
        "queries_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies), 1),
        "p95_ms": round(statistics.quantiles(latencies, n=20)[18], 1) if len(latencies) >= 20 else None,
        "queries": len(latencies),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.query_embedding", description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--no-write", action="store_true")
    args, _ = parser.parse_known_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import memory.embedding as embedding
    from memory.embedding import queries

    embedder = embedding.get_embedder("sentence-transformers")
    from django.conf import settings

    settings.EMBEDDING_BACKEND = "sentence-transformers"
    embedder.embed_query("warm up")
    levels = [int(c) for c in args.concurrency.split(",") if c]
    report: dict[str, Any] = {
        "benchmark": "query embeddings under concurrency (bench/query_embedding.py)",
        "model": embedder.name,
        "cpus": os.cpu_count(),
        "seconds_per_level": args.seconds,
        "modes": {},
    }
    print(f"{'mode':11} {'callers':>7} {'queries/s':>9} {'p50 ms':>7} {'p95 ms':>7}")
    for mode in ("batched", "one_by_one", "pool"):
        for c in levels:
            figures = _run(mode, c, args.seconds, embedder)
            report["modes"].setdefault(mode, {})[str(c)] = figures
            print(f"{mode:11} {c:7} {figures['queries_per_s']:9.1f} {figures['p50_ms']:7.1f} {figures['p95_ms']!s:>7}")
    queries.QUERY_BATCH_MAX = 16
    report["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "query_embedding.json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {RESULTS / 'query_embedding.json'}")
    return 0
