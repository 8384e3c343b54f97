"""API throughput: the running app (gunicorn, demo model) under locust at concurrency 1, 8 and 32.

Starts gunicorn on 127.0.0.1:<free port> against a throwaway database on the embedded server (DEBUG off,
hashing embedder, message throttles raised so the load tool measures the app, not the throttle, Celery
enqueues to a private Redis queue deleted afterwards), then runs ``locust --headless`` for a bounded time
per concurrency level. Each locust user opens its own session (``POST /api/sessions/``) and posts messages to
it (``POST /api/sessions/<id>/messages/``, the whole turn on the demo model). Reported per level: requests per
second, p50/p95 and errors of the message requests. Loopback only.

Run alone: ``python -m bench api_throughput [-- --seconds 20 --workers 2]``; needs locust (requirements-bench.txt).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.db import database_url

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DATABASE = "bench_api_throughput"
LEVELS = (1, 8, 32)

LOCUSTFILE = """
import os
import uuid
from locust import HttpUser, task, constant

TOKEN = os.environ["BENCH_TOKEN"]
MESSAGES = ["Hello, can you help me?", "What are the baggage rules?", "Thanks, that helps.", "One more question."]


class ChatUser(HttpUser):
    wait_time = constant(0)

    def on_start(self):
        self.client.headers["Authorization"] = f"Token {TOKEN}"
        r = self.client.post("/api/sessions/", json={"agent": "bench-api"}, name="create session")
        self.session_id = r.json()["id"]
        self.n = 0

    @task
    def post_message(self):
        self.n += 1
        self.client.post(
            f"/api/sessions/{self.session_id}/messages/",
            json={"message": MESSAGES[self.n % len(MESSAGES)]},
            headers={"Idempotency-Key": uuid.uuid4().hex},
            name="post message",
        )
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prepare() -> str:
    """A fresh database with a user, its API token and a free-chat agent on the demo model; returns the token."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from agents.models import Agent
    from bench.memory_db import use_database
    from bench.turn_overhead import _recreate_database

    _recreate_database(DATABASE)
    use_database(DATABASE)
    user = get_user_model().objects.create(username="bench-api")
    Agent.objects.create(name="Bench API", slug="bench-api", system_prompt="Be brief.", workflow="free_chat", tools=[])
    return str(Token.objects.create(user=user).key)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Poll until gunicorn answers at all (an anonymous request gets 401: that is an answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("gunicorn exited before it was ready")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("gunicorn did not answer in time")


def _locust(host: str, token: str, users: int, seconds: int, folder: Path) -> dict[str, Any]:
    locust = shutil.which("locust", path=str(Path(sys.executable).parent))
    if locust is None:
        raise RuntimeError("locust is not installed (requirements-bench.txt)")
    prefix = folder / f"c{users}"
    subprocess.run(
        [
            locust,
            "-f",
            str(folder / "locustfile.py"),
            "--headless",
            "--only-summary",
            "-u",
            str(users),
            "-r",
            str(users),
            "-t",
            f"{seconds}s",
            "--host",
            host,
            "--csv",
            str(prefix),
        ],
        env={**os.environ, "BENCH_TOKEN": token},
        check=False,
        capture_output=True,
        timeout=seconds + 60,
    )
    with open(f"{prefix}_stats.csv", newline="") as fh:
        rows = {row["Name"]: row for row in csv.DictReader(fh)}
    row = rows["post message"]
    return {
        "concurrency": users,
        "requests": int(row["Request Count"]),
        "errors": int(row["Failure Count"]),
        "rps": round(float(row["Requests/s"]), 2),
        "p50_ms": float(row["50%"]),
        "p95_ms": float(row["95%"]),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench api_throughput", description=__doc__)
    parser.add_argument("--seconds", type=int, default=20, help="load time per concurrency level")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per gunicorn worker")
    parser.add_argument("--no-write", action="store_true")
    args, _ = parser.parse_known_args(argv)

    token = _prepare()
    port = _free_port()
    queue = f"bench-api-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(DATABASE),
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(40),
        "ALLOWED_HOSTS": "127.0.0.1",
        "EMBEDDING_BACKEND": "hashing",
        "API_THROTTLE_MESSAGES": "1000000/min",
        "API_THROTTLE_USER": "1000000/min",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/14",
        "CELERY_QUEUE": queue,
        "LOG_LEVEL": "WARNING",
    }
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    if not Path(gunicorn).exists():
        gunicorn = str(ROOT / ".venv" / "bin" / "gunicorn")
    host = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [gunicorn, "config.wsgi", "-b", f"127.0.0.1:{port}", "-w", str(args.workers), "--threads", str(args.threads)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    levels: list[dict[str, Any]] = []
    try:
        _wait_ready(f"{host}/api/me/", proc)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "locustfile.py").write_text(LOCUSTFILE)
            for users in LEVELS:
                levels.append(_locust(host, token, users, args.seconds, folder))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        try:
            import redis

            redis.Redis.from_url("redis://127.0.0.1:6379/14").delete(queue)
        except Exception:  # noqa: BLE001 - nothing was queued without Redis
            pass
    report = {
        "benchmark": "POST /api/sessions/<id>/messages/ (a whole turn on the demo model) under locust",
        "server": f"gunicorn, {args.workers} workers x {args.threads} threads, DEBUG off, hashing embedder",
        "seconds_per_level": args.seconds,
        "levels": levels,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print(f"{'concurrency':<13}{'req/s':>9}{'p50 ms':>10}{'p95 ms':>10}{'errors':>8}{'requests':>10}")
    for lv in levels:
        print(
            f"{lv['concurrency']:<13}{lv['rps']:>9.1f}{lv['p50_ms']:>10.0f}{lv['p95_ms']:>10.0f}"
            f"{lv['errors']:>8}{lv['requests']:>10}"
        )
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "api_throughput.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    raise SystemExit(main(sys.argv[1:]))
