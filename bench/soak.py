"""A bounded load and soak run: thousands of turns over loopback against the real app, on the demo model.

It starts the app itself — gunicorn (``config.wsgi``) on ``127.0.0.1:<free port>`` and a Celery worker, both
on a throwaway database of the embedded PostgreSQL server — creates users, API tokens and sessions, and
sends ``--turns`` ``POST /api/sessions/<id>/messages/`` from ``--concurrency`` threads (httpx). Each thread
owns its sessions, so no two requests race on one session (that is the 409 path, tested elsewhere). The
messages are the failure gallery's 60-turn conversation, repeated, on the booking agent and the free-chat
assistant in turn.

It reports the count per status (a 5xx fails the run), latency p50/p95/p99, and the RSS of the gunicorn
workers sampled with psutil every ``--sample-every`` turns (the series, and the change from the first
sample to the last). It stops by itself: after ``--turns`` turns or ``--max-seconds``, whichever comes first,
and then stops the processes it started.

``python -m bench soak [-- --turns 5000 --concurrency 8]`` writes ``bench/results/soak.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from core.db import database_url, redis_reachable

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"


@dataclass
class Stats:
    """What the sending threads record; guarded by ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    rss: list[dict[str, Any]] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


def worker_rss(master_pid: int) -> dict[str, Any]:
    """RSS (MiB) of each gunicorn worker (the master's children) and their total."""
    import psutil

    per: dict[str, float] = {}
    try:
        for child in psutil.Process(master_pid).children():
            try:
                per[str(child.pid)] = round(child.memory_info().rss / 2**20, 1)
            except psutil.NoSuchProcess:
                continue
    except psutil.NoSuchProcess:
        pass
    return {"workers": per, "total_mib": round(sum(per.values()), 1)}


def _seed(*, concurrency: int, sessions_per_thread: int) -> list[tuple[str, list[str]]]:
    """One user with an API token per thread, and its sessions: [(token, [session id, ...]), ...]."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from agents.models import Agent
    from agents.services import default_agents_ensure
    from sessions.services import session_create

    default_agents_ensure()
    agents = [Agent.objects.get(slug="flight-booking"), Agent.objects.get(slug="assistant")]
    run = uuid.uuid4().hex[:8]
    seeded = []
    for i in range(concurrency):
        user = get_user_model().objects.create_user(username=f"soak-{run}-{i}", password=uuid.uuid4().hex)
        token = Token.objects.create(user=user)
        ids = [
            str(session_create(user=user, agent=agents[j % 2], title=f"soak {j}").pk)
            for j in range(sessions_per_thread)
        ]
        seeded.append((token.key, ids))
    return seeded


def _start(
    *, port: int, workers: int, threads: int, env: dict[str, str], logs: Path, queue: str, worker: bool
) -> list[subprocess.Popen[bytes]]:
    procs = []
    web_log = (logs / "gunicorn.log").open("wb")
    procs.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "config.wsgi:application",
                "--bind",
                f"{LOOPBACK}:{port}",
                "--worker-class",
                "gthread",
                "--workers",
                str(workers),
                "--threads",
                str(threads),
                "--timeout",
                "120",
                "--graceful-timeout",
                "10",
            ],
            cwd=ROOT,
            env=env,
            stdout=web_log,
            stderr=subprocess.STDOUT,
        )
    )
    if worker:
        worker_log = (logs / "celery.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "config",
                    "worker",
                    "--pool",
                    "prefork",
                    "--concurrency",
                    "1",
                    "--loglevel",
                    "WARNING",
                    "-Q",
                    f"{queue},{queue}-ops",
                    "--hostname",
                    f"{queue}@%h",
                    "--without-gossip",
                    "--without-mingle",
                ],
                cwd=ROOT,
                env=env,
                stdout=worker_log,
                stderr=subprocess.STDOUT,
            )
        )
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_ready(base: str, procs: list[subprocess.Popen[bytes]], *, timeout: float = 90.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a server process exited during start-up; see its log")
        try:
            # The web process is ready when it answers with its database up; the worker's heartbeat (the other
            # half of /healthz) can come later, and the soak reports on the web process.
            body = httpx.get(f"{base}/healthz", timeout=5).json()
            if body.get("database", {}).get("ok"):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the app did not answer {base}/healthz within {timeout:.0f} s")


def soak(
    *,
    turns: int = 5000,
    concurrency: int = 8,
    max_seconds: float = 3600.0,
    sample_every: int = 250,
    web_workers: int = 2,
    sessions_per_thread: int = 4,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the soak (see the module docstring) and return its figures. Needs the database set up."""
    import logging

    import httpx

    from bench.gallery import conversation

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would bury the figures

    messages = [t.text for t in conversation(date.today())]
    seeded = _seed(concurrency=concurrency, sessions_per_thread=sessions_per_thread)
    port = free_port()
    base = f"http://{LOOPBACK}:{port}"
    queue = f"soak-{uuid.uuid4().hex[:8]}"
    with_worker = redis_reachable()
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": database_url(),
            # The load is the point: the per-user message rate limit would answer 429 to most of it.
            "API_THROTTLE_MESSAGES": "1000000/min",
            "API_THROTTLE_USER": "1000000/min",
            # The deterministic embedder: MiniLM's model would cost each process a cold load and ~1 GB.
            "EMBEDDING_BACKEND": "hashing",
            "CELERY_QUEUE": queue,
            "TOOLS_FAULTS": "",
        }
    )
    if with_worker:
        env["CELERY_BROKER_URL"] = os.environ.get("SOAK_REDIS_URL", "redis://127.0.0.1:6379/14")
    else:
        # No broker to reach: background work runs inside the request instead (and is measured with it).
        env["CELERY_TASK_ALWAYS_EAGER"] = "true"
    stats = Stats()
    logs = Path(tempfile.mkdtemp(prefix="soak-logs-"))
    procs = _start(
        port=port,
        workers=web_workers,
        threads=max(2, concurrency // web_workers),
        env=env,
        logs=logs,
        queue=queue,
        worker=with_worker,
    )
    started = time.monotonic()
    deadline = started + max_seconds
    try:
        _wait_ready(base, procs)
        master = procs[0].pid
        stats.rss.append({"turns": 0, **worker_rss(master)})
        bar = _progress_bar(turns) if progress else None

        def send(thread: int) -> None:
            token, session_ids = seeded[thread]
            headers = {"Authorization": f"Token {token}"}
            positions = dict.fromkeys(session_ids, 0)
            with httpx.Client(base_url=base, headers=headers, timeout=120.0) as client:
                turn = 0
                while True:
                    with stats.lock:
                        if stats.sent >= turns or time.monotonic() > deadline:
                            return
                        stats.sent += 1
                    session_id = session_ids[turn % len(session_ids)]
                    turn += 1
                    message = messages[positions[session_id] % len(messages)]
                    positions[session_id] += 1
                    t0 = time.perf_counter()
                    try:
                        response = client.post(f"/api/sessions/{session_id}/messages/", json={"message": message})
                        status = str(response.status_code)
                        if response.status_code >= 500:
                            with stats.lock:
                                stats.errors.append(f"{status}: {response.text[:300]}")
                    except httpx.HTTPError as exc:
                        status = f"transport error ({type(exc).__name__})"
                        with stats.lock:
                            stats.errors.append(f"{status}: {exc}")
                    elapsed = (time.perf_counter() - t0) * 1000
                    with stats.lock:
                        stats.statuses[status] += 1
                        stats.latencies_ms.append(elapsed)
                        done = len(stats.latencies_ms)
                    if bar is not None:
                        bar.update(1)
                    if done % sample_every == 0:
                        sample = {"turns": done, **worker_rss(master)}
                        with stats.lock:
                            stats.rss.append(sample)

        threads = [threading.Thread(target=send, args=(i,), name=f"soak-{i}") for i in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if bar is not None:
            bar.close()
        if not stats.rss or stats.rss[-1]["turns"] != len(stats.latencies_ms):
            stats.rss.append({"turns": len(stats.latencies_ms), **worker_rss(master)})
    finally:
        _stop(procs)
    seconds = time.monotonic() - started
    return _report(
        stats,
        seconds=seconds,
        turns=turns,
        concurrency=concurrency,
        web_workers=web_workers,
        worker=with_worker,
        logs=logs,
    )


def _progress_bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="turn", desc="soak", mininterval=2.0)


def _report(
    stats: Stats, *, seconds: float, turns: int, concurrency: int, web_workers: int, worker: bool, logs: Path
) -> dict[str, Any]:
    lat = stats.latencies_ms
    rss = stats.rss
    # Memory is judged after warm-up: the first sample under load (imports, connection pools, caches) is
    # the baseline, not the idle process at turn 0.
    loaded = [s for s in rss if s["turns"] > 0]
    first, last = (loaded[0], loaded[-1]) if loaded else (rss[0], rss[-1])
    five_xx = sum(n for status, n in stats.statuses.items() if status.startswith("5"))
    transport = sum(n for status, n in stats.statuses.items() if not status[:1].isdigit())
    return {
        "turns_requested": turns,
        "turns_sent": len(lat),
        "concurrency": concurrency,
        "web_workers": web_workers,
        "celery_worker": worker,
        "seconds": round(seconds, 1),
        "turns_per_second": round(len(lat) / seconds, 2) if seconds else 0.0,
        "statuses": dict(sorted(stats.statuses.items())),
        "five_xx": five_xx,
        "transport_errors": transport,
        "latency_ms": {
            "p50": round(percentile(lat, 0.50), 1),
            "p95": round(percentile(lat, 0.95), 1),
            "p99": round(percentile(lat, 0.99), 1),
            "max": round(max(lat), 1) if lat else 0.0,
            "mean": round(statistics.fmean(lat), 1) if lat else 0.0,
        },
        "rss_mib": [{"turns": s["turns"], "total": s["total_mib"]} for s in rss],
        "rss_workers_mib": rss,
        "rss_delta_mib": {
            "from_turn": first["turns"],
            "to_turn": last["turns"],
            "first": first["total_mib"],
            "last": last["total_mib"],
            "delta": round(last["total_mib"] - first["total_mib"], 1),
            "delta_pct": round((last["total_mib"] / first["total_mib"] - 1) * 100, 1) if first["total_mib"] else 0.0,
        },
        "errors_sample": stats.errors[:10],
        "logs": str(logs),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench soak")
    parser.add_argument("--turns", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8, help="sending threads (each owns its sessions)")
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="stop sending after this long")
    parser.add_argument("--sample-every", type=int, default=250, help="sample the workers' RSS every N turns")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--output", type=Path, default=RESULTS / "soak.json")
    args, _ = parser.parse_known_args(argv)  # options after "--" are shared by every part
    if args.turns < 1 or args.concurrency < 1:
        parser.error("--turns and --concurrency must be at least 1")

    from django.db import connections
    from django.test.utils import setup_databases

    # A throwaway database (kept between runs): the soak's users, sessions and turns stay out of the app's data.
    setup_databases(verbosity=0, interactive=False, keepdb=True, aliases={"default"})  # type: ignore[arg-type]
    result = soak(
        turns=args.turns,
        concurrency=args.concurrency,
        max_seconds=args.max_seconds,
        sample_every=args.sample_every,
        web_workers=args.web_workers,
    )
    connections.close_all()
    lat, delta = result["latency_ms"], result["rss_delta_mib"]
    print(
        f"{result['turns_sent']} turns in {result['seconds']} s ({result['turns_per_second']}/s), "
        f"concurrency {result['concurrency']}, {result['web_workers']} gunicorn workers, "
        f"celery worker: {'yes' if result['celery_worker'] else 'no (tasks inline)'}"
    )
    print("statuses: " + ", ".join(f"{k}: {v}" for k, v in result["statuses"].items()))
    print(f"latency ms: p50 {lat['p50']}, p95 {lat['p95']}, p99 {lat['p99']}, max {lat['max']}")
    print("workers' RSS (MiB) by turn: " + ", ".join(f"{s['turns']}: {s['total']}" for s in result["rss_mib"]))
    print(
        f"RSS from turn {delta['from_turn']} to {delta['to_turn']}: {delta['first']} -> {delta['last']} MiB "
        f"({delta['delta']:+} MiB, {delta['delta_pct']:+}%)"
    )
    for error in result["errors_sample"]:
        print("error:", error)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0 if result["five_xx"] == 0 and result["transport_errors"] == 0 else 1
