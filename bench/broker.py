"""The default broker under a backlog: ``--tasks`` tasks queued at once on the embedded Valkey, drained by one
Celery worker as ``make run`` starts it (a pool of ``CELERY_WORKER_THREADS`` threads).

It starts a throwaway embedded broker (its own folder) and the worker on a queue of its own, sends ``--tasks``
heartbeat tasks (``web.tasks.core.record_worker_heartbeat``: one upsert each, the cheapest task the app has) as
fast as one thread can, and reports the send rate and the drain rate (from the first send until the queue and
the worker's unacknowledged set are empty). Loopback and a Unix socket only; bounded by ``--max-seconds``.

``python -m bench broker [-- --tasks 2000]`` writes ``bench/results/broker.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from core import embedded_broker
from core.db import database_url

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent


def run(*, argv: list[str], tasks: int, max_seconds: float) -> dict[str, Any]:
    import redis
    from celery import Celery

    folder = Path(tempfile.mkdtemp(prefix="vkb-"))
    url = embedded_broker.ensure_embedded_valkey(folder)
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    client = redis.Redis(unix_socket_path=str(embedded_broker.socket_path(folder)))
    env = {**os.environ, "CELERY_BROKER_URL": url, "CELERY_QUEUE": queue, "DATABASE_URL": database_url()}
    # As make run starts it (web.management.commands.runstack): a pool of connections shared by the threads.
    # Without one, Celery's Django fix-up closes the thread's connection before and after every task, and
    # each task opened a new one (a third of the worker's time on 2026-12-06; the 86/s of that morning).
    env.setdefault("DATABASE_POOL_MAX_SIZE", "4")
    log = folder / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "threads",
             "--concurrency", str(settings.CELERY_WORKER_THREADS), "-Q", queue,
             "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--hostname", f"{queue}@%h"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    sender = Celery("bench-broker", broker=url, set_as_current=False)
    sender.conf.task_default_queue = queue
    try:
        deadline = time.monotonic() + 120
        # Ready, and done warming up: under make run the worker embeds through the embedding service, so
        # loading the model in this worker (its warm-up, on a thread) is no part of draining a backlog.
        warmed = (
            ("embedding model loaded", "warm-up failed")
            if settings.EMBEDDING_BACKEND == "sentence-transformers"
            else ()
        )
        while "ready." not in (text := log.read_text(errors="replace")) or (
            warmed and not any(w in text for w in warmed)
        ):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start:\n{text[-2000:]}")
            time.sleep(0.2)
        started = time.monotonic()
        for _ in range(tasks):
            sender.send_task("web.tasks.core.record_worker_heartbeat", queue=queue)
        sent = time.monotonic() - started
        limit = started + max_seconds
        while client.llen(queue) or client.zcard("unacked_index"):
            if time.monotonic() > limit:
                break
            time.sleep(0.02)
        drained = time.monotonic() - started
        left = int(client.llen(queue)) + int(client.zcard("unacked_index"))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        embedded_broker.stop_embedded_valkey(folder)
    # Each task the worker ran says so in its log: none lost, none run twice.
    ran = re.findall(r"record_worker_heartbeat\[([0-9a-f-]+)\] succeeded", log.read_text(errors="replace"))
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m bench broker", *(["--", *argv] if argv else [])]),
        "tasks": tasks,
        "send_seconds": round(sent, 2),
        "sent_per_second": round(tasks / sent, 1),
        "drain_seconds": round(drained, 2),
        "drained_per_second": round((tasks - left) / drained, 1),
        "left": left,
        "succeeded": len(set(ran)),
        "ran_twice": len(ran) - len(set(ran)),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench broker")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--output", type=Path, default=RESULTS / "broker.json")
    args, _ = parser.parse_known_args(argv)
    from django.db import connections
    from django.test.utils import setup_databases

    setup_databases(verbosity=0, interactive=False, keepdb=True, aliases={"default"})  # type: ignore[arg-type]
    result = run(argv=argv, tasks=args.tasks, max_seconds=args.max_seconds)
    connections.close_all()
    print(
        f"{result['tasks']} tasks: sent in {result['send_seconds']} s ({result['sent_per_second']}/s), drained in "
        f"{result['drain_seconds']} s ({result['drained_per_second']}/s), {result['left']} left"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0 if result["left"] == 0 else 1
