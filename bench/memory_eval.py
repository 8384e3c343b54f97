"""Memory retrieval on corpora of several shapes, against plain dense retrieval measured in the same run.

For each corpus (``bench/memory_corpora.py``) three retrievers answer every query:
- ``dense``: plain dense retrieval, the floor: the same embedder, cosine top-k over the user's memories,
  no tiers, the query as it is;
- ``ranking``: the app's retrieval with its relevance filter off (``relevance_threshold=0``): what the
  tiers and the ranking alone find;
- ``defaults``: the app's retrieval exactly as ``GET /api/memories/search/`` runs it with no parameter but
  ``q`` (``memory.retrieval.memories_for_prompt`` with the API's defaults: a 2,000-token budget, no model
  filter, the default relevance filter).

Recall@k is the share of a query's labelled memories among the first k returned (k = 5, 10, 25), also by
kind of query where the corpus labels kinds (``by_kind``). What the defaults put in the prompt: memories and
tokens a query, the relevant share of them (pooled over the queries: ``relevant_share``, and of their tokens
``relevant_token_share``), the recall of everything kept (``recall_kept``) and the memories a query that one
memory answers gets (``one_answer_kept_per_query``). A
corpus's margin is the defaults' recall less plain dense's at each k; the worst margin is the lowest over
the corpora (the goal: never below 0, at recall@5 and recall@10). Every setting of the retriever was chosen
on the tuning split (every 4th query of each corpus, counting from the first); the table shows the held-out
rest, and ``bench/results/memory_eval.json`` has both.

Run: ``python -m bench memory_eval [-- --corpora persona,locomo_turns] [--split tuning|held_out|all]
[--set NAME=VALUE ...] [--no-write]``. ``--set`` changes a constant of ``memory.retrieval.tuning`` for the run
(a sweep on the tuning split; the figures it prints are not written unless ``--write-anyway``).
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

import numpy as np
from tqdm import tqdm

from bench.memory_corpora import BUILDERS, LOCOMO, NEEDS_LOCOMO, Corpus, label_hits

RESULTS = Path(__file__).resolve().parent / "results"
DATABASE = os.environ.get("BENCH_EVAL_DATABASE", "bench_memory_eval")
KS = (5, 10, 25)
TUNING_EVERY = 4
BUDGET_TOKENS = 2000  # the API's default budget_tokens (--budget: another, as a caller of the API may pass)
RETRIEVERS: tuple[str, ...] = ("dense", "ranking", "defaults")
# With --judge-url: a fourth retriever, "reranked", the defaults with the listwise reranker of that model
# (memory.retrieval.relevance, MEMORY_MODEL_JUDGE "rerank"), with its own time budget (--judge-timeout).
JUDGED: dict[str, Any] = {}
# The app's retrievers search what the chat would: a conversational query with the person's earlier
# messages (memory.retrieval.retrieval_query; no model here, so no rewrite). Dense searches the turn alone.
USE_CONTEXT = os.environ.get("BENCH_QUERY_CONTEXT", "1") != "0"
# Each query's first 25 of every retriever, a JSON line a query, when set (to read where two retrievers part).
DUMP = Path(os.environ["BENCH_EVAL_DUMP"]) if os.environ.get("BENCH_EVAL_DUMP") else None
DRAGON_OBSERVATIONS = {"recall@5": 0.562, "recall@10": 0.613, "recall@25": 0.675}  # LoCoMo paper, Table 3
DRAGON_TURNS = {"recall@5": 0.567, "recall@10": 0.662, "recall@25": 0.767}


def retrievers() -> tuple[str, ...]:
    return RETRIEVERS + (("reranked",) if JUDGED else ())


def split_of(index: int) -> str:
    return "tuning" if index % TUNING_EVERY == 0 else "held_out"


def ingest(corpus: Corpus) -> tuple[dict[str, Any], dict[int, str], dict[str, tuple[np.ndarray, list[str]]]]:
    """Write the corpus's users and memories (vectors from the bench cache); (users, memory id -> label,
    user key -> (matrix, labels) for plain dense retrieval)."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from agents.models import Agent
    from bench.memory_cache import cached_embed
    from memory.embedding import get_embedder
    from memory.models import Memory
    from memory.services import EPISODE_IMPORTANCE, content_hash_for
    from sessions.models import ChatSession

    embedder = get_embedder()
    User = get_user_model()
    prefix = f"eval-{corpus.name}-"
    Memory.objects.filter(user__username__startswith=prefix).delete()
    ChatSession.objects.filter(user__username__startswith=prefix).delete()
    User.objects.filter(username__startswith=prefix).delete()
    agent, _ = Agent.objects.get_or_create(
        slug="bench-eval", defaults={"name": "Bench eval", "system_prompt": "You remember."}
    )
    texts = [m.text for ms in corpus.memories.values() for m in ms]
    vectors = cached_embed(embedder, texts)
    users: dict[str, Any] = {}
    labels: dict[int, str] = {}
    dense: dict[str, tuple[np.ndarray, list[str]]] = {}
    offset = 0
    written_at = timezone.now()
    for key, specs in corpus.memories.items():
        user = User.objects.create(username=(prefix + key.replace("/", "-"))[:150])
        users[key] = user
        sessions: dict[str, ChatSession] = {}
        rows = []
        for i, spec in enumerate(specs):
            session = None
            if spec.session is not None:
                if spec.session not in sessions:
                    sessions[spec.session] = ChatSession.objects.create(
                        user=user, agent=agent, workflow="free_chat", state="CHATTING", title=spec.session
                    )
                session = sessions[spec.session]
            created = spec.occurred_at if corpus.turns_written_live else written_at
            rows.append(
                Memory(
                    user=user,
                    kind=spec.kind,
                    text=spec.text,
                    importance=EPISODE_IMPORTANCE if spec.kind == "episodic" else 0.5,
                    embedding=vectors[offset + i].tolist(),
                    embedding_model=embedder.name,
                    content_hash=content_hash_for(spec.text + f"#{i}"),  # repeated texts stay separate rows
                    source_session=session,
                    occurred_at=spec.occurred_at,
                    created_at=created,
                    valid_from=spec.occurred_at,  # known from when it happened (a query before then cannot see it)
                )
            )
        created_rows = Memory.objects.bulk_create(rows, batch_size=500)
        labels.update({m.id: specs[i].label for i, m in enumerate(created_rows)})
        dense[key] = (vectors[offset : offset + len(specs)], [s.label for s in specs])
        offset += len(specs)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) memory_memory")
    return users, labels, dense


def recall_at(ranked: list[str], relevant: frozenset[str], k: int) -> float:
    found: set[str] = set()
    for label in ranked[:k]:
        found |= label_hits(label) & relevant
    return len(found) / len(relevant)


def evaluate(corpus: Corpus, *, split: str, limit: int | None, sweep: list[dict[str, Any]] | None = None) -> Any:
    """The corpus's figures (or, with ``sweep``, a list of (overrides, figures), one per setting tried)."""
    ingested = ingest(corpus)
    if not sweep:
        return _evaluate(corpus, ingested, split=split, limit=limit)
    results = []
    for overrides in sweep:
        _apply_overrides([f"{k}={json.dumps(v)}" for k, v in overrides.items()])
        results.append((overrides, _evaluate(corpus, ingested, split=split, limit=limit, quiet=True)))
    return results


def _evaluate(corpus: Corpus, ingested: Any, *, split: str, limit: int | None, quiet: bool = False) -> dict[str, Any]:
    from bench.memory_cache import cached_embed
    from memory.embedding import get_embedder
    from memory.retrieval import memories_for_prompt, retrieval_query

    users, labels, dense = ingested
    chosen = [(i, q) for i, q in enumerate(corpus.queries) if split == "all" or split_of(i) == split]
    if limit:
        chosen = chosen[:limit]
    qvectors = cached_embed(get_embedder(), [q.text for _, q in chosen], progress=not quiet)
    # What the app searches for (the turn with the person's earlier messages), embedded once: the ranking
    # run and sweeps reuse the vector; the timed defaults run embeds its query as the API does.
    queries = [
        retrieval_query(message=q.text, earlier=list(q.earlier)).text if USE_CONTEXT else q.text for _, q in chosen
    ]
    app_vectors = cached_embed(get_embedder(), queries, progress=False)
    per: dict[str, dict[str, dict[str, list[float]]]] = {
        s: {r: {f"recall@{k}": [] for k in KS} for r in retrievers()} for s in ("tuning", "held_out")
    }
    stats: dict[str, dict[str, list[float]]] = {
        s: {
            "tokens": [],
            "kept": [],
            "ms": [],
            "empty": [],
            "judge_ms": [],
            "judged": [],
            "relevant_kept": [],
            "relevant_tokens": [],
            "recall_kept": [],
            "one_answer_kept": [],
        }
        for s in per
    }
    # Where the corpus labels its queries' kinds: each retriever's recall by kind, per split.
    by_kind: dict[str, dict[str, dict[str, dict[str, list[float]]]]] = {s: {} for s in per}
    for n, (i, q) in enumerate(tqdm(chosen, desc=corpus.name, mininterval=2, disable=quiet)):
        s = split_of(i)
        matrix, dense_labels = dense[q.user]
        order = np.argsort(-(matrix @ qvectors[n]), kind="stable")
        rankings = {"dense": [dense_labels[j] for j in order if dense_labels[j] not in q.hidden]}
        kept_found: Any = None
        runs = [("ranking", 0.0), ("defaults", None)] + ([("reranked", None)] if JUDGED else [])
        for name, threshold in runs:
            started = time.perf_counter()
            found = memories_for_prompt(
                user=users[q.user],
                query=queries[n],
                query_vector=app_vectors[n].tolist() if quiet or name != "defaults" else None,
                budget_tokens=BUDGET_TOKENS,
                use_model_filter=name == "reranked",
                now=q.now,
                touch=False,
                relevance_threshold=threshold,  # None: the default, as the API passes it
            )
            elapsed = (time.perf_counter() - started) * 1000
            rankings[name] = [labels[it.memory.id] for it in found.items if labels.get(it.memory.id) not in q.hidden]
            if name == "defaults":
                kept_found = found
            if name == "reranked":
                stats[s]["judge_ms"].append(elapsed)
                stats[s]["judged"].append(float(found.filter_mode == "rerank"))
            if name == "defaults":
                stats[s]["ms"].append(elapsed)
                stats[s]["tokens"].append(found.total_tokens)
                stats[s]["kept"].append(len(found.items))
                stats[s]["empty"].append(float(not found.items))
                _precision(stats[s], found, labels, q)
        kind = by_kind[s].setdefault(q.kind, {r: {f"recall@{k}": [] for k in KS} for r in rankings}) if q.kind else None
        for name, ranked in rankings.items():
            for k in KS:
                recall = recall_at(ranked, q.relevant, k)
                per[s][name][f"recall@{k}"].append(recall)
                if kind is not None:
                    kind[name][f"recall@{k}"].append(recall)
        if DUMP:
            with DUMP.open("a") as out_file:
                top = {name: ranked[: max(KS)] for name, ranked in rankings.items()}
                row = {"corpus": corpus.name, "query": i, "split": s, "relevant": sorted(q.relevant), "top": top}
                row["candidates"] = _dump_candidates(kept_found, labels)
                out_file.write(json.dumps(row) + "\n")
    out: dict[str, Any] = {"about": corpus.about, "memories": len(labels), "queries": len(chosen)}
    for s, by_retriever in per.items():
        if not stats[s]["ms"]:
            continue
        block: dict[str, Any] = {
            r: {key: round(statistics.fmean(v), 4) for key, v in recalls.items()} for r, recalls in by_retriever.items()
        }
        block["queries"] = len(stats[s]["ms"])
        block["tokens_per_query"] = round(statistics.fmean(stats[s]["tokens"]), 1)
        block["kept_per_query"] = round(statistics.fmean(stats[s]["kept"]), 2)
        block["queries_with_no_memory"] = int(sum(stats[s]["empty"]))
        block.update(_precision_block(stats[s]))
        ms = stats[s]["ms"]
        block["latency_ms"] = {
            "p50": round(statistics.median(ms), 2),
            "p95": round(statistics.quantiles(ms, n=20)[18], 2) if len(ms) >= 20 else round(max(ms), 2),
        }
        block["margin"] = margins(block)
        if by_kind[s]:
            block["by_kind"] = {
                kind: {
                    "queries": len(recalls["dense"]["recall@5"]),
                    **{r: {key: round(statistics.fmean(v), 4) for key, v in rs.items()} for r, rs in recalls.items()},
                }
                for kind, recalls in sorted(by_kind[s].items())
            }
        if stats[s]["judge_ms"]:
            judge_ms = stats[s]["judge_ms"]
            block["reranked_latency_ms"] = {
                "p50": round(statistics.median(judge_ms), 1),
                "p95": round(statistics.quantiles(judge_ms, n=20)[18], 1)
                if len(judge_ms) >= 20
                else round(max(judge_ms), 1),
            }
            block["reranked_share"] = round(statistics.fmean(stats[s]["judged"]), 3)  # the rest fell back
        out[s] = block
    # The figures of record: the held-out split (the tuning split when only that one ran).
    main_split = out.get("held_out") or out.get("tuning") or {}
    for key in (
        *retrievers(),
        "margin",
        "by_kind",
        "tokens_per_query",
        "kept_per_query",
        "relevant_share",
        "relevant_token_share",
        "recall_kept",
        "one_answer_kept_per_query",
        "latency_ms",
        "reranked_latency_ms",
        "reranked_share",
    ):
        if key in main_split:
            out[key] = main_split[key]
    return out


def _relevant(label: str | None, q: Any) -> bool:
    return label is not None and bool(label_hits(label) & q.relevant)


def _precision(stats: dict[str, list[float]], found: Any, labels: dict[int, str], q: Any) -> None:
    """What the defaults put in the prompt for one query: how much of it is relevant, and how much of the
    relevant it holds (recall over everything kept, not only the first k)."""
    items = [it for it in found.items if labels.get(it.memory.id) not in q.hidden]
    relevant = [it for it in items if _relevant(labels.get(it.memory.id), q)]
    stats["relevant_kept"].append(len(relevant))
    stats["relevant_tokens"].append(sum(it.tokens for it in relevant))
    stats["recall_kept"].append(recall_at([labels.get(it.memory.id, "") for it in items], q.relevant, len(items)))
    if len(q.relevant) == 1:  # a query whose answer is one memory: how many memories it gets
        stats["one_answer_kept"].append(len(found.items))


def _precision_block(stats: dict[str, list[float]]) -> dict[str, Any]:
    """The prompt's memory per query and the share of it that is relevant (pooled over the queries)."""
    kept, tokens = sum(stats["kept"]), sum(stats["tokens"])
    block: dict[str, Any] = {
        "relevant_share": round(sum(stats["relevant_kept"]) / kept, 4) if kept else 0.0,
        "relevant_token_share": round(sum(stats["relevant_tokens"]) / tokens, 4) if tokens else 0.0,
        "recall_kept": round(statistics.fmean(stats["recall_kept"]), 4),
    }
    if stats["one_answer_kept"]:
        block["one_answer_kept_per_query"] = round(statistics.fmean(stats["one_answer_kept"]), 2)
    return block


def _dump_candidates(found: Any, labels: dict[int, str]) -> list[list[Any]]:
    """Every candidate of the defaults' report (label, relevance, fused, cosine, word share, kept), to try cuts
    offline."""
    return [
        [labels.get(c.id, ""), c.relevance, round(c.fused_score, 5), c.cosine, c.word_share, c.kept, c.tier]
        for c in found.candidates
    ]


def margins(figures: dict[str, Any]) -> dict[str, float]:
    """The defaults' recall less plain dense's, at each k."""
    return {f"recall@{k}": round(figures["defaults"][f"recall@{k}"] - figures["dense"][f"recall@{k}"], 4) for k in KS}


def worst_margins(corpora: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """At each k, the lowest margin over the corpora and the corpus it belongs to."""
    out: dict[str, dict[str, Any]] = {}
    for k in KS:
        key = f"recall@{k}"
        scored = [(c["margin"][key], name) for name, c in corpora.items() if "margin" in c]
        if scored:
            value, name = min(scored)
            out[key] = {"margin": value, "corpus": name}
    return out


def _apply_overrides(pairs: list[str]) -> dict[str, Any]:
    from django.conf import settings

    from memory.retrieval import tuning

    applied = {}
    for pair in pairs:
        name, _, raw = pair.partition("=")
        target: Any = tuning if hasattr(tuning, name) else settings if name.startswith("MEMORY_") else None
        if target is None:
            raise SystemExit(f"memory.retrieval.tuning has no {name} (and it is no MEMORY_ setting)")
        value = type(getattr(target, name))(json.loads(raw))
        setattr(target, name, value)
        applied[name] = value
    return applied


def table(report: dict[str, Any]) -> str:
    head = (
        "| corpus | retriever | R@5 | R@10 | R@25 | vs dense @5 / @10 / @25 | tokens/query | kept/query "
        "| relevant share (tokens) | R@kept | p50 / p95 ms |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for name, c in report["corpora"].items():
        for r in retrievers():
            if r not in c:
                continue
            rec = c[r]
            extra = (
                " / ".join(f"{c['margin'][f'recall@{k}']:+.3f}" for k in KS) + " | "
                f"{c['tokens_per_query']:.0f} | {c['kept_per_query']:.1f} | "
                f"{c['relevant_share']:.3f} ({c['relevant_token_share']:.3f}) | {c['recall_kept']:.3f} | "
                f"{c['latency_ms']['p50']:.1f} / {c['latency_ms']['p95']:.1f}"
                if r == "defaults"
                else (
                    f" | | | | | {c['reranked_latency_ms']['p50']:.0f} / {c['reranked_latency_ms']['p95']:.0f}"
                    f" ({c['reranked_share']:.0%} reranked)"
                )
                if r == "reranked"
                else " | | | | | "
            )
            lines.append(
                f"| {name} | {r} | {rec['recall@5']:.3f} | {rec['recall@10']:.3f} | {rec['recall@25']:.3f} | {extra} |"
            )
    for name, c in report["corpora"].items():
        for kind, figures in (c.get("by_kind") or {}).items():
            lines.append(
                f"| {name}: {kind} ({figures['queries']}) | dense / defaults | "
                + " | ".join(
                    f"{figures['dense'][f'recall@{k}']:.3f} / {figures['defaults'][f'recall@{k}']:.3f}" for k in KS
                )
                + " | | | | | | |"
            )
    worst = report.get("worst_margin") or worst_margins(report["corpora"])
    if worst:
        lines.append("")
        lines.append(
            "worst margin vs dense (defaults less dense): "
            + ", ".join(f"{key} {w['margin']:+.3f} ({w['corpus']})" for key, w in worst.items())
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.memory_eval", description=__doc__)
    parser.add_argument("--corpora", default=",".join(BUILDERS))
    parser.add_argument("--split", choices=("tuning", "held_out", "all"), default="all")
    parser.add_argument("--limit", type=int, default=None, help="at most this many queries a corpus")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="try every combination of these memory.retrieval.tuning constants (after one ingest a corpus); prints only",
    )
    parser.add_argument("--judge-url", help="an OpenAI-compatible endpoint: adds the 'reranked' retriever")
    parser.add_argument("--judge-model", default="", help="its model name")
    parser.add_argument("--judge-timeout", type=float, default=4.0, help="the reranker's budget (s)")
    parser.add_argument("--budget", type=int, default=None, help="memory tokens a query (default: the API's 2000)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--write-anyway", action="store_true", help="write results even with --set or --limit")
    args, _ = parser.parse_known_args(argv)
    global BUDGET_TOKENS
    if args.budget is not None:
        if args.budget <= 0:
            parser.error("--budget must be a positive number of tokens")
        BUDGET_TOKENS = args.budget
    from django.conf import settings

    from bench.memory_db import use_database

    names = [n for n in args.corpora.split(",") if n]
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        print(f"unknown corpora: {', '.join(unknown)}; known: {', '.join(BUILDERS)}", file=sys.stderr)
        return 2
    if not LOCOMO.exists():
        skipped = [n for n in names if n in NEEDS_LOCOMO]
        if skipped:
            print(f"LoCoMo data not found at {LOCOMO}; skipping {', '.join(skipped)}", file=sys.stderr)
        names = [n for n in names if n not in NEEDS_LOCOMO]
    settings.EMBEDDING_BACKEND = os.environ.get("BENCH_EMBEDDING_BACKEND", "sentence-transformers")
    overrides = _apply_overrides(args.set)
    if args.judge_url:
        profile = {"base_url": args.judge_url, "model": args.judge_model, "cheap_model": args.judge_model}
        settings.LLM_PROFILES = {"default": {**profile, "api_key_env": "", "max_retries": 0, "read_timeout": 600.0}}
        settings.MEMORY_RELEVANCE_TIMEOUT = args.judge_timeout
        settings.MEMORY_MODEL_JUDGE = "rerank"
        JUDGED.update(url=args.judge_url, model=args.judge_model, timeout=args.judge_timeout)
    use_database(DATABASE)
    report: dict[str, Any] = {
        "benchmark": "memory retrieval on corpora of several shapes vs plain dense (bench/memory_eval.py)",
        "embedder": settings.EMBEDDING_BACKEND,
        "budget_tokens": BUDGET_TOKENS,
        "split": args.split,
        "overrides": overrides,
        "reranker": JUDGED or None,
        "corpora": {},
    }
    if args.sweep:
        grid: list[dict[str, Any]] = [{}]
        for spec in args.sweep:
            key, _, values = spec.partition("=")
            grid = [{**g, key: json.loads(v)} for g in grid for v in values.split(",")]
        totals: dict[str, list[tuple[float, float]]] = {}
        for name in names:
            for overrides, figures in evaluate(BUILDERS[name](), split=args.split, limit=args.limit, sweep=grid):
                tag = json.dumps(overrides)
                d, r, f = figures["dense"], figures["ranking"], figures["defaults"]
                totals.setdefault(tag, []).append((f["recall@5"] - d["recall@5"], f["recall@10"] - d["recall@10"]))
                print(
                    f"{name:20} {tag:60} dense {d['recall@5']:.3f}/{d['recall@10']:.3f} ranking {r['recall@5']:.3f}/"
                    f"{r['recall@10']:.3f}/{r['recall@25']:.3f} defaults {f['recall@5']:.3f}/{f['recall@10']:.3f}/"
                    f"{f['recall@25']:.3f} tokens {figures['tokens_per_query']:.0f}",
                    flush=True,
                )

        def worst(gains: list[tuple[float, float]]) -> float:
            return min(min(pair) for pair in gains)

        for tag, gains in sorted(totals.items(), key=lambda t: -worst(t[1])):
            at5, at10 = [g[0] for g in gains], [g[1] for g in gains]
            print(
                f"min gain over dense @5 {min(at5):+.3f} @10 {min(at10):+.3f}  "
                f"mean @5 {statistics.fmean(at5):+.3f} @10 {statistics.fmean(at10):+.3f}  {tag}"
            )
        return 0
    for name in names:
        report["corpora"][name] = evaluate(BUILDERS[name](), split=args.split, limit=args.limit)
    report["worst_margin"] = worst_margins(report["corpora"])
    report["reference"] = {"dragon_locomo_turns": DRAGON_TURNS, "dragon_locomo_observations": DRAGON_OBSERVATIONS}
    report["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    print(table(report))
    print(json.dumps({k: v for k, v in report.items() if k != "corpora"}, indent=1))
    writes = not args.no_write and (
        args.write_anyway or (not overrides and not args.limit and args.budget is None and args.split == "all")
    )
    # A run with a reranker model is slow (a model call a query) and runs on a few corpora: its own file.
    target = RESULTS / ("memory_eval_reranked.json" if JUDGED else "memory_eval.json")
    if (writes and set(names) == set(BUILDERS)) or (JUDGED and not args.no_write and args.budget is None):
        RESULTS.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    raise SystemExit(main(sys.argv[1:]))
