"""The admin's change lists on production-sized logs: a million turns, checkpoints and model calls.

The logs grow by rows a turn; an operator opens their lists to curate and to investigate. Django's defaults
read the whole table on every page (counts, distinct values for the filters, date lists); this measures
what the pages cost as built (``web.admin.lists``), as a signed-in superuser through Django's test
client (no network), median of three loads after one warm-up.

Seeded once into its own database (``bench_admin_scale``, reused; ``--fresh`` rebuilds it) by copying one
template row per table with ``generate_series``: ``--rows`` turns, checkpoints and model calls, a fifth as
many tool calls, half as many memories, a hundredth as many sessions; then ANALYZE, as autovacuum would.

Run alone: ``python -m bench admin_scale [-- --rows 1000000 --fresh]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DATABASE = "bench_admin_scale"

PAGES = [
    ("sessions", "/admin/chat_sessions/chatsession/"),
    ("turns", "/admin/chat_sessions/turn/"),
    ("turns, failed only", "/admin/chat_sessions/turn/?status__exact=failed"),
    ("checkpoints", "/admin/chat_sessions/checkpoint/"),
    ("checkpoints in one state", "/admin/chat_sessions/checkpoint/?state=GATHERING_ORIGIN"),
    ("model calls", "/admin/agents/llmcall/"),
    ("model calls, outcome ok", "/admin/agents/llmcall/?outcome=ok"),
    ("tool calls", "/admin/agents/toolinvocation/"),
    ("memories", "/admin/memory/memory/"),
    ("memories, a word search", "/admin/memory/memory/?q=4242"),
    ("memories, a fact key", "/admin/memory/memory/?q=home_city"),
]


def _clone(model: Any, template_id: Any, count: int, overrides: dict[str, str]) -> None:
    """Insert ``count`` copies of one row, with SQL expressions of ``g`` (1..count) for some columns."""
    from django.db import connection

    table = model._meta.db_table
    columns = [
        f.column
        for f in model._meta.concrete_fields
        if (not f.primary_key or f.column in overrides) and not getattr(f, "generated", False)
    ]
    names = ", ".join(f'"{c}"' for c in columns)
    values = ", ".join(overrides.get(c, f'"{c}"') for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{table}" ({names}) SELECT {values} FROM "{table}", generate_series(1, {int(count)}) g '
            "WHERE id = %s",
            [template_id],
        )


def _seed(rows: int) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from rich.progress import Progress

    from agents.models import Agent, LLMCall, ToolInvocation
    from memory.models import Memory
    from sessions.models import ChatSession, Checkpoint, Turn
    from sessions.services import checkpoint_record, session_create

    user_model = get_user_model()
    user_model.objects.create_superuser("bench-ops", "ops@example.com", None)
    user = user_model.objects.create_user("bench-user")
    agent = Agent.objects.create(name="Bench", slug="bench", system_prompt="Be brief.")
    session = session_create(user=user, agent=agent)
    turn = Turn.objects.create(session=session, seq=1, user_message="hello", assistant_message="hi", status="completed")
    checkpoint = checkpoint_record(session=session, reason="before_call", turn=turn)
    call = LLMCall.objects.create(
        agent=agent, session=session, turn=turn, purpose="reply", provider="openai", model="m", outcome="ok"
    )
    tool = ToolInvocation.objects.create(session=session, turn=turn, name="search_flights")
    memory = Memory.objects.create(user=user, kind="episodic", text="User: hello")
    sessions = max(1, rows // 100)
    # Rows spread over the sessions and back in time, a second apart.
    spread = f"(ARRAY(SELECT id FROM chat_sessions_chatsession ORDER BY created_at))[1 + mod(g, {sessions})]"
    ago = "now() - g * interval '1 second'"
    steps: list[tuple[str, Any, Any, int, dict[str, str]]] = [
        (
            "sessions",
            ChatSession,
            session.pk,
            sessions - 1,
            {"id": "gen_random_uuid()", "created_at": ago, "updated_at": ago},
        ),
        ("turns", Turn, turn.pk, rows, {"session_id": spread, "seq": "1 + g", "created_at": ago}),
        (
            "checkpoints",
            Checkpoint,
            checkpoint.pk,
            rows,
            {
                "session_id": spread,
                "seq": "1 + g",
                "turn_id": "NULL",
                "created_at": ago,
                "state": "CASE WHEN mod(g, 50) = 0 THEN 'GATHERING_ORIGIN' ELSE 'CHATTING' END",
            },
        ),
        ("model calls", LLMCall, call.pk, rows, {"turn_id": "NULL", "created_at": ago}),
        ("tool calls", ToolInvocation, tool.pk, rows // 5, {"turn_id": "NULL", "created_at": ago}),
        (
            "memories",
            Memory,
            memory.pk,
            rows // 2,
            {
                "text": "'User: note number ' || g",
                "content_hash": "md5(g::text)",
                "kind": "CASE WHEN mod(g, 1000) = 0 THEN 'semantic' ELSE 'episodic' END",
                "fact_key": "CASE WHEN mod(g, 1000) = 0 THEN 'home_city' ELSE '' END",
                "valid_to": "CASE WHEN mod(g, 1000) = 0 AND g > 1000 THEN now() ELSE NULL END",
                "created_at": ago,
                "valid_from": ago,
            },
        ),
    ]
    with Progress() as progress:
        task = progress.add_task("seeding", total=len(steps) + 1)
        for label, model, template, count, overrides in steps:
            progress.update(task, description=f"seeding {count:,} {label}")
            _clone(model, template, count, overrides)
            progress.advance(task)
        progress.update(task, description="ANALYZE")
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        progress.advance(task)


def _time_pages() -> list[dict[str, Any]]:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    client = Client()
    client.force_login(get_user_model().objects.get(username="bench-ops"))
    out = []
    for label, url in PAGES:
        client.get(url)  # warm-up
        samples = []
        for _ in range(3):
            with CaptureQueriesContext(connection) as ctx:
                started = time.perf_counter()
                response = client.get(url)
                samples.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"{url}: HTTP {response.status_code}")
        slowest = max(ctx.captured_queries, key=lambda q: float(q["time"]))
        out.append(
            {
                "page": label,
                "url": url,
                "median_ms": round(statistics.median(samples), 1),
                "queries": len(ctx.captured_queries),
                "slowest_query_ms": round(float(slowest["time"]) * 1000, 1),
            }
        )
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench admin_scale", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="turns, checkpoints and model calls")
    parser.add_argument("--fresh", action="store_true", help="rebuild the database even if it is there")
    parser.add_argument("--no-write", action="store_true")
    args, _ = parser.parse_known_args(argv)

    from django.conf import settings
    from django.contrib.auth import get_user_model

    from bench.memory_db import use_database
    from bench.turn_overhead import _recreate_database
    from sessions.models import Turn

    settings.DEBUG = False
    settings.EMBEDDING_BACKEND = "hashing"
    if args.fresh:
        _recreate_database(DATABASE)
    use_database(DATABASE)
    if not get_user_model().objects.filter(username="bench-ops").exists() or Turn.objects.count() < args.rows:
        _recreate_database(DATABASE)
        use_database(DATABASE)
        _seed(args.rows)
    pages = _time_pages()
    report = {
        "benchmark": "admin change lists on big logs, as a superuser through the test client (median of 3)",
        "rows": {"turns_checkpoints_model_calls": args.rows, "memories": args.rows // 2, "tool_calls": args.rows // 5},
        "pages": pages,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print(f"{'admin page at ' + format(args.rows, ',') + ' rows':<34}{'median ms':>10}{'queries':>9}{'slowest':>9}")
    for page in pages:
        print(f"{page['page']:<34}{page['median_ms']:>10.1f}{page['queries']:>9}{page['slowest_query_ms']:>9.1f}")
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "admin_scale.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0
