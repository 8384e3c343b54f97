"""The fault run: ``make run`` under people who keep chatting while each of its processes is killed once.

It starts a stand-in model on loopback (``bench/stand_in_model.py``: every call takes ``--latency`` seconds) and
the stack exactly as ``make run`` starts it (``manage.py runstack`` on a throwaway data folder: its own embedded
PostgreSQL and broker, the embedding service, gunicorn, the background worker with beat, the turn worker, all
under the supervisor), gives ``--people`` people a chat each, and has each of them send message after message
through ``POST /api/sessions/<id>/messages/stream/`` with an ``Idempotency-Key``, as a client that retries does:
a message whose stream breaks, or that is answered 409/5xx, is sent again under the same key until it is
answered (at most ``--retry-for`` seconds). Meanwhile, every ``--every`` seconds, one process of the stack is
killed with SIGKILL, in this order: the turn worker, the background worker, the embedding service, the web
server, the broker, PostgreSQL. The supervisor starts each again.

Measured, from the stack's own database at the end (``manage.py shell``):

- lost: a message sent whose turn is not in the database (or never finished);
- duplicated: a message with more than one turn, and a turn whose reply the model was asked for twice;
- failed: a turn that ended failed (its message is kept; the person would send it again);
- for each fault, the turns it held (unfinished when it struck) and how long after it the last of them
  settled: the goal is no turn settled later than 60 s after the fault that held it.

``python -m bench faults [-- --people 40 --every 30 --latency 2]`` writes ``bench/results/faults.json``.
Loopback only; every loop is bounded by ``--duration`` and ``--retry-for``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.concurrency import _stop_stack, _wait_ready, stack_env, start_stack
from bench.soak import LOOPBACK, free_port
from bench.stand_in_model import StandInModel

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
FAULTS = ("turn worker", "background worker", "embedding service", "web server", "broker", "postgresql")
RETRYABLE = {409, 429, 500, 502, 503, 504}


@dataclass
class Sent:
    """One message a person sent: its key, its text, and what became of it on the client's side."""

    key: str
    text: str
    attempts: int = 0
    answered: bool = False
    failed_event: str = ""
    first_sent: float = 0.0
    settled: float | None = None


@dataclass
class Person:
    token: str
    session: str
    sent: list[Sent] = field(default_factory=list)


def _manage_shell(env: dict[str, str], code: str) -> Any:
    """Run ``code`` in ``manage.py shell`` against the stack's database; what it prints last, as JSON."""
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


SEED = """
import json
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from agents.models import Agent
from sessions.services import session_create
agent = Agent.objects.get(slug="assistant")
people = []
for n in range({people}):
    user = get_user_model().objects.create_user(username=f"fault-{{n}}-{tag}", password="fault-pass-123")
    token, _ = Token.objects.get_or_create(user=user)
    people.append([token.key, str(session_create(user=user, agent=agent).pk)])
print(json.dumps(people))
"""

OUTCOME = """
import json
from django.db.models import Count, Q
from sessions.models import Turn
turns = Turn.objects.filter(session_id__in={sessions}).annotate(
    replies=Count("llm_calls", filter=Q(llm_calls__purpose="reply", llm_calls__outcome="ok"))
)
print(json.dumps([
    [str(t.session_id), t.idempotency_key, t.user_message, t.status, t.created_at.timestamp(),
     t.completed_at.timestamp() if t.completed_at else None, t.replies]
    for t in turns
]))
"""


def _children(supervisor: int) -> dict[str, list[int]]:
    """The process groups to kill, by fault name: the supervisor's children, the broker and PostgreSQL."""
    import psutil

    found: dict[str, list[int]] = {name: [] for name in FAULTS}
    for child in psutil.Process(supervisor).children():
        line = " ".join(child.cmdline())
        if "serve_embeddings" in line:
            found["embedding service"].append(child.pid)
        elif "gunicorn" in line:
            found["web server"].append(child.pid)
        elif "-turns" in line:
            found["turn worker"].append(child.pid)
        elif "celery" in line:
            found["background worker"].append(child.pid)
    return found


def _server_pid(data_dir: Path, name: str) -> int | None:
    """The server program ``name`` (its executable's name: not the supervisor, whose plan names the folders too)
    serving from ``data_dir``."""
    import psutil

    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if str(proc.info["name"] or "").startswith(name) and str(data_dir) in line:
            return int(proc.info["pid"])
    return None


def _kill(fault: str, supervisor: int, data_dir: Path) -> str:
    if fault == "broker":
        pid = _server_pid(data_dir, "valkey")
        targets = [pid] if pid else []
    elif fault == "postgresql":
        pid = _server_pid(data_dir, "postgres")
        targets = [pid] if pid else []
    else:
        targets = _children(supervisor)[fault]
    for pid in targets:
        try:
            if fault in ("broker", "postgresql"):
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return f"{fault}: SIGKILL to {targets or 'nothing found'}"


def _send(base: str, person: Person, message: Sent, *, retry_for: float) -> None:
    """Send ``message`` until it is answered (``done``) or failed (an ``error`` event naming the turn), retrying
    under the same key what breaks on the way, for at most ``retry_for`` seconds."""
    import httpx

    headers = {"Authorization": f"Token {person.token}", "Accept": "text/event-stream", "Idempotency-Key": message.key}
    message.first_sent = time.time()
    while time.time() - message.first_sent < retry_for:
        message.attempts += 1
        try:
            with httpx.stream(
                "POST",
                f"{base}/api/sessions/{person.session}/messages/stream/",
                json={"message": message.text},
                headers=headers,
                timeout=httpx.Timeout(10.0, read=60.0),
            ) as response:
                if response.status_code in RETRYABLE:
                    time.sleep(1.0)
                    continue
                if response.status_code != 200:
                    message.failed_event = f"HTTP {response.status_code}"
                    message.settled = time.time()
                    return
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    if event.get("type") == "done":
                        message.answered, message.settled = True, time.time()
                        return
                    if event.get("type") == "error":
                        # The turn failed, or the stream did (the channel restarting, the turn taken over): the
                        # same key again replays a settled turn, or follows or resumes it. Failures are counted
                        # from the database.
                        message.failed_event = str(event.get("code", ""))
                        break
        except httpx.HTTPError:
            pass
        time.sleep(1.0)


def run(
    *, argv: list[str], people: int, every: float, latency: float, duration: float, retry_for: float
) -> dict[str, Any]:
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    folder = Path(tempfile.mkdtemp(prefix="faults-"))
    data_dir, log = folder / "data", folder / "stack.log"
    port = free_port()
    base = f"http://{LOOPBACK}:{port}"
    with StandInModel(latency=latency, ttft=min(0.3, latency)) as model:
        # make run's stack as it is, its own embedded PostgreSQL included: that is one of the processes killed.
        env = {**stack_env(model=model, data_dir=data_dir, database=None), "LOG_FORMAT": "plain"}
        stack = start_stack(env=env, port=port, log=log)
        try:
            ready_s = _wait_ready(stack, log, timeout=300)
            time.sleep(5)
            seeded = _manage_shell(env, SEED.format(people=people, tag=uuid.uuid4().hex[:6]))
            crowd = [Person(token, session) for token, session in seeded]
            stop_sending = time.time() + duration

            def chat(person: Person) -> None:
                n = 0
                while time.time() < stop_sending:
                    n += 1
                    message = Sent(key=uuid.uuid4().hex, text=f"Message {n} of {person.session[:8]}: how are you?")
                    person.sent.append(message)
                    _send(base, person, message, retry_for=retry_for)

            threads = [threading.Thread(target=chat, args=(p,), daemon=True) for p in crowd]
            for thread in threads:
                thread.start()
            faults: list[dict[str, Any]] = []
            for fault in FAULTS:
                time.sleep(every)
                at = time.time()
                faults.append({"fault": fault, "at": at, "did": _kill(fault, stack.pid, data_dir)})
            for thread in threads:
                thread.join(timeout=duration + retry_for + 60)
            time.sleep(5)  # what settles after the last answer (a memory write) is not measured; turns are
            rows = _manage_shell(env, OUTCOME.format(sessions=[p.session for p in crowd]))
        finally:
            _stop_stack(stack)
    return _figures(
        argv=argv, crowd=crowd, rows=rows, faults=faults, ready_s=ready_s, latency=latency, people=people, log=log
    )


def _figures(
    *,
    argv: list[str],
    crowd: list[Person],
    rows: list[list[Any]],
    faults: list[dict[str, Any]],
    ready_s: float,
    latency: float,
    people: int,
    log: Path,
) -> dict[str, Any]:
    by_key: dict[str, list[list[Any]]] = {}
    by_text: dict[tuple[str, str], int] = {}
    for row in rows:
        by_key.setdefault(str(row[1]), []).append(row)
        by_text[(row[0], row[2])] = by_text.get((row[0], row[2]), 0) + 1
    sent = [m for p in crowd for m in p.sent]
    lost = [m.key for m in sent if not any(r[3] in ("completed", "failed") for r in by_key.get(m.key, []))]
    duplicated = sum(1 for count in by_text.values() if count > 1)
    asked_twice = sum(1 for row in rows if row[6] > 1)
    failed = [row for row in rows if row[3] == "failed"]
    # A turn is held by the first fault that struck while it was unfinished; it settles that long after it.
    first_fault: dict[int, int] = {}
    for i, row in enumerate(rows):
        for n, fault in enumerate(faults):
            if row[4] <= fault["at"] and (row[5] is None or row[5] > fault["at"]):
                first_fault[i] = n
                break
    held: list[dict[str, Any]] = []
    for n, fault in enumerate(faults):
        hit = [rows[i] for i, f in first_fault.items() if f == n]
        settle = [(r[5] if r[5] is not None else float("inf")) - fault["at"] for r in hit]
        held.append(
            {
                "fault": fault["fault"],
                "did": fault["did"],
                "turns_held": len(hit),
                "last_settled_after_s": round(max(settle), 1) if settle else 0.0,
            }
        )
    client_waits = [m.settled - m.first_sent for m in sent if m.settled is not None]
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m bench faults", *(["--", *argv] if argv else [])]),
        "people": people,
        "model_latency_s": latency,
        "stack_ready_s": round(ready_s, 1),
        "messages_sent": len(sent),
        "answered": sum(m.answered for m in sent),
        "turns": len(rows),
        "lost": len(lost),
        "lost_sample": lost[:5],
        "duplicated": duplicated,
        "asked_the_model_twice": asked_twice,
        "failed": len(failed),
        "failed_sample": [row[2][:60] for row in failed[:5]],
        "unanswered_on_the_client": sum(1 for m in sent if not m.answered),
        "unanswered_why": sorted({m.failed_event or "retried until --retry-for" for m in sent if not m.answered}),
        "client_attempts_max": max((m.attempts for m in sent), default=0),
        "client_wait_max_s": round(max(client_waits, default=0.0), 1),
        "faults": held,
        "worst_settle_after_fault_s": max((h["last_settled_after_s"] for h in held), default=0.0),
        "stack_log": str(log),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench faults")
    parser.add_argument("--people", type=int, default=40)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between two faults")
    parser.add_argument("--latency", type=float, default=2.0, help="the stand-in model's seconds a call")
    parser.add_argument("--duration", type=float, default=0.0, help="seconds of sending (default: past the faults)")
    parser.add_argument("--retry-for", type=float, default=180.0, help="a message is retried this long at most")
    parser.add_argument("--output", type=Path, default=RESULTS / "faults.json")
    args = parser.parse_args(argv)
    duration = args.duration or args.every * (len(FAULTS) + 1)
    result = run(
        argv=argv,
        people=args.people,
        every=args.every,
        latency=args.latency,
        duration=duration,
        retry_for=args.retry_for,
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "lost_sample"}, indent=2))
    ok = result["lost"] == 0 and result["duplicated"] == 0 and result["worst_settle_after_fault_s"] <= 60
    return 0 if ok else 1
