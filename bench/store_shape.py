"""How much each store of the memory_eval corpora looks alike, by size (``python -m bench store_shape``).

Fusion weighs its corrections (the word arm, the hubness discount) by a store's redundancy
(memory/retrieval/redundancy.py): each of the newest REDUNDANCY_SAMPLE memories' mean cosine to its
REDUNDANCY_K nearest among them. The measure grows with a store's size below the sample (a memory's nearest
fellows come closer as fellows are added), so this part measures every store of the corpora at the sizes a
store passes through, on windows of its memories in time order: the ``first`` m (the store when it was
young) and the ``newest`` m (what the app samples). It also measures the store as the app does (its newest
REDUNDANCY_SAMPLE, or all of it) with the corrections that earns, and the time-adjacency lift: the mean cosine
of each memory to the next one in time less the mean cosine of any two (conversation turns follow a topic;
independent facts do not). No database: the corpora's vectors come from the bench's embedding cache. "Newest"
is by the memories' time (occurred_at); the app samples by created_at, which is the same for a store written as
it happened (turns) and arbitrary for one written at once (memory_eval's other stores; those of more than 256,
some of locomo_callbacks', are sampled differently there).
Results in ``bench/results/store_shape.json``; bench/README.md reads them.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.memory_corpora import BUILDERS, LOCOMO, NEEDS_LOCOMO

RESULTS = Path(__file__).resolve().parent / "results" / "store_shape.json"
SIZES = (32, 64, 128, 256)
WINDOWS = ("first", "newest")


def adjacency_lift(matrix: np.ndarray) -> float:
    """The mean cosine of each row to the next less the mean cosine of two different rows (normalised rows)."""
    n = len(matrix)
    if n < 3:
        return 0.0
    sims = matrix @ matrix.T
    pairs = (sims.sum() - np.trace(sims)) / (n * (n - 1))
    return float(np.mean(np.sum(matrix[:-1] * matrix[1:], axis=1)) - pairs)


def store_figures(matrix: np.ndarray) -> dict[str, Any]:
    """One store's figures (rows in time order, oldest first)."""
    from memory.retrieval import tuning
    from memory.retrieval.redundancy import correction_scale, is_measurable
    from memory.retrieval.vector import matrix_nearest_mean_cosines

    def redundancy(rows: np.ndarray) -> float:
        return round(float(matrix_nearest_mean_cosines(rows, tuning.REDUNDANCY_K).mean()), 4)

    sampled = matrix[-tuning.REDUNDANCY_SAMPLE :]
    measured = redundancy(sampled) if is_measurable(len(sampled)) else None
    by_size = {
        window: {
            str(m): redundancy(matrix[:m] if window == "first" else matrix[-m:]) for m in SIZES if m <= len(matrix)
        }
        for window in WINDOWS
    }
    return {
        "memories": len(matrix),
        "redundancy": measured,
        "corrections": round(correction_scale(measured), 3),
        "by_size": by_size,
        "adjacency_lift": round(adjacency_lift(sampled), 4),
    }


def measure(names: list[str]) -> dict[str, Any]:
    from bench.memory_cache import cached_embed
    from memory.embedding import get_embedder

    embedder = get_embedder()
    corpora: dict[str, Any] = {}
    for name in names:
        corpus = BUILDERS[name]()
        stores: dict[str, Any] = {}
        for key, specs in corpus.memories.items():
            ordered = sorted(specs, key=lambda spec: spec.occurred_at)
            matrix = cached_embed(embedder, [spec.text for spec in ordered]).astype(np.float32)
            matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
            stores[key] = store_figures(matrix)
        corpora[name] = {"stores": stores}
    return corpora


def summary(corpora: dict[str, Any]) -> list[str]:
    """Rows of the table: per corpus, size and window, the range of its stores' redundancy; then its stores as
    the app measures them."""
    lines = [
        "| stores | window | " + " | ".join(str(m) for m in SIZES) + " | as sampled | corrections | adjacency lift |"
    ]
    lines.append("|---" * (len(SIZES) + 5) + "|")
    groups = {name: list(corpus["stores"].values()) for name, corpus in corpora.items()}

    def span(values: list[float]) -> str:
        if not values:
            return ""
        low, high = min(values), max(values)
        return f"{low:.3f}" if len(values) == 1 or low == high else f"{low:.3f}–{high:.3f}"

    def sizes(stores: list[dict[str, Any]]) -> str:
        low, high = min(s["memories"] for s in stores), max(s["memories"] for s in stores)
        return f"{low:,}" if low == high else f"{low:,}–{high:,}"

    for group, stores in groups.items():
        for window in WINDOWS:
            cells = [
                span([s["by_size"][window][str(m)] for s in stores if str(m) in s["by_size"][window]]) for m in SIZES
            ]
            tail = ["", "", ""]
            if window == "newest":
                sampled = [s["redundancy"] for s in stores if s["redundancy"] is not None]
                tail = [
                    span(sampled)
                    + f" ({len(stores)} {'store' if len(stores) == 1 else 'stores'}, {sizes(stores)} memories)"
                    if sampled
                    else "",
                    span([s["corrections"] for s in stores]),
                    span([s["adjacency_lift"] for s in stores]),
                ]
            lines.append(f"| {group} | {window} | " + " | ".join(cells) + " | " + " | ".join(tail) + " |")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench store_shape", description=__doc__)
    parser.add_argument("--corpora", default=",".join(BUILDERS))
    parser.add_argument("--no-write", action="store_true")
    args, _ = parser.parse_known_args(argv)  # options after "--" are shared by every part
    from django.conf import settings

    settings.EMBEDDING_BACKEND = os.environ.get("BENCH_EMBEDDING_BACKEND", "sentence-transformers")
    names = [n for n in args.corpora.split(",") if n]
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        print(f"unknown corpora: {', '.join(unknown)}; known: {', '.join(BUILDERS)}")
        return 2
    if not LOCOMO.exists():
        names = [n for n in names if n not in NEEDS_LOCOMO]
        print(f"LoCoMo data not found at {LOCOMO}; measuring {', '.join(names)} only")
    corpora = measure(names)
    print("\n".join(summary(corpora)))
    # The file of record holds every corpus: a run of a few (or without LoCoMo) prints only.
    if not args.no_write and set(names) == set(BUILDERS):
        report = {
            "benchmark": "how much each store's memories look alike, by size (bench/store_shape.py)",
            "embedder": settings.EMBEDDING_BACKEND,
            "sizes": list(SIZES),
            "corpora": corpora,
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=1) + "\n")
        print(f"written to {RESULTS}")
    return 0
