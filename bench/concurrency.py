"""Many people at once: the ``make run`` stack under N people who each send one message, streamed, together.

It starts a stand-in model on loopback (``bench/stand_in_model.py``: every call takes ``--latency`` seconds) and
the real stack as ``make run`` starts it (``manage.py runstack``: gunicorn as configured there, the MCP server,
a Celery worker with beat, the default broker and embedder) on a throwaway database of the embedded PostgreSQL,
then, for each N of ``--people`` (default 1, 64, 256), gives N new people a chat with the ``assistant`` agent
and has them all send one message at once through ``POST /api/sessions/<id>/messages/stream/``, as the chat
page does, then the same crowd again through ``POST /v1/chat/completions`` (``bench.openai_door``; ``--no-openai``
skips it). Measured per N:

- wall: from the send to the last ``done`` event, and its ratio to one chat alone (the first N);
- first token (the first ``delta`` event) and reply done, p50 and p95, per person;
- failures: a status other than 200, an ``error`` event, a stream with no ``done``;
- ``GET /healthz`` every 0.2 s meanwhile, from a process of its own (``bench/health_probe.py``): its slowest answer;
- PostgreSQL connections to the database (``pg_stat_activity``, sampled every 0.25 s): the most at once;
- the stack's log: every ERROR record and traceback while the N chats ran (the cold-start race of a fresh
  process shows here), and the background tasks that could not be sent (``TaskSendFailure``).

Beside it, the floor of the machine and the load client: the same N clients calling the stand-in directly,
each its two calls of a turn (a structured call, then a stream), with no app in between.

``python -m bench concurrency [-- --people 1,64,256 --latency 4]`` writes ``bench/results/concurrency.json``.
Loopback only; every request loop is bounded by N and ``--timeout``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

from bench.openai_door import openai_chat
from bench.soak import LOOPBACK, free_port, percentile
from bench.stand_in_model import StandInModel
from core.db import database_url

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
MESSAGE = "Hello! What can you do for me, and what do you remember about me?"
# The agent every person chats with (``--agent``): ``assistant`` (free chat with tools), or ``flight-booking`` (a
# workflow: its decision travels inside the reply's call).
AGENT = {"slug": "assistant"}
# A record at ERROR or above, in the JSON log format (the default) or the plain one, or a traceback.
ERROR_RECORD = re.compile(r'"level": "(ERROR|CRITICAL)"|^\S+ \S+ (ERROR|CRITICAL) |^Traceback', re.MULTILINE)


@dataclass
class Chat:
    """One person's message: when its first token and its end arrived (seconds after the common start)."""

    status: int = 0
    accepted: float | None = None  # the response's head: the message saved and the turn sent to a worker
    started: float | None = None  # the turn's first event: a worker (or the request) runs it
    first_token: float | None = None
    done: float | None = None
    error: str = ""


@dataclass
class Probe:
    """A background sampler's findings, guarded by ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    samples: list[float] = field(default_factory=list)
    failures: int = 0
    detail: dict[str, int] = field(default_factory=dict)


def _seed(people: int, run: str) -> list[tuple[str, str]]:
    """``people`` new users with an API token and a chat with the agent (``AGENT``): [(token, session id), ...]."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from agents.models import Agent
    from sessions.services import session_create

    agent = Agent.objects.get(slug=AGENT["slug"])
    seeded = []
    for i in range(people):
        user = get_user_model().objects.create_user(username=f"crowd-{run}-{i}", password=uuid.uuid4().hex)
        seeded.append((Token.objects.create(user=user).key, str(session_create(user=user, agent=agent).pk)))
    return seeded


def _chat(
    base: str, token: str, session_id: str, start: threading.Barrier, t0: list[float], timeout: float, door: str = ""
) -> Chat:
    import httpx

    chat = Chat()
    if door == "openai":
        return openai_chat(  # type: ignore[no-any-return]
            chat, base, token, session_id, MESSAGE, start, t0, timeout, model=AGENT["slug"]
        )
    headers = {"Authorization": f"Token {token}", "Accept": "text/event-stream"}
    with httpx.Client(base_url=base, timeout=timeout) as client:
        start.wait()
        try:
            with client.stream(
                "POST", f"/api/sessions/{session_id}/messages/stream/", json={"message": MESSAGE}, headers=headers
            ) as response:
                chat.status = response.status_code
                chat.accepted = time.monotonic() - t0[0]
                if response.status_code != 200:
                    chat.error = f"{response.status_code}: {response.read()[:200]!r}"
                    return chat
                for line in response.iter_lines():
                    if line == "event: turn" and chat.started is None:
                        chat.started = time.monotonic() - t0[0]
                    if line == "event: delta" and chat.first_token is None:
                        chat.first_token = time.monotonic() - t0[0]
                    elif line == "event: done":
                        chat.done = time.monotonic() - t0[0]
                    elif line == "event: error":
                        chat.error = "an error event"
        except httpx.HTTPError as exc:
            chat.error = f"{type(exc).__name__}: {exc}"
    if chat.done is None and not chat.error:
        chat.error = "the stream ended with no done event"
    return chat


def _start_health_probe(base: str) -> subprocess.Popen[str]:
    """``bench.health_probe`` on ``/healthz``: a process of its own, as a load balancer probes from elsewhere."""
    return subprocess.Popen(
        [sys.executable, "-m", "bench.health_probe", f"{base}/healthz", "0.2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def _stop_health_probe(prober: subprocess.Popen[str], probe: Probe) -> None:
    prober.terminate()
    out, _ = prober.communicate(timeout=60)
    for line in out.splitlines():
        seconds, status = line.split()
        probe.samples.append(float(seconds))
        probe.failures += status == "0"


def _probe_connections(url: str, probe: Probe) -> None:
    """Connections to the database every 0.25 s (this probe's own left out); at the most, who held them
    (``application_name``: agents-web, agents-turns, agents-background, their -health, the bench's own)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while not probe.stop.is_set():
            rows = conn.execute(
                "SELECT coalesce(nullif(application_name, ''), '?'), count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1"
            ).fetchall()
            total = float(sum(count for _name, count in rows))
            with probe.lock:
                if total > max(probe.samples, default=-1.0):
                    probe.detail = {str(name): int(count) for name, count in rows}
                probe.samples.append(total)
            probe.stop.wait(0.25)


def _in_parallel(jobs: list[Any], work: Any) -> list[Any]:
    results: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        results[i] = work(jobs[i])

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def phase(
    *,
    base: str,
    people: int,
    log: Path,
    timeout: float,
    model: StandInModel,
    langgraph_db: str = "",
    door: str = "",
) -> dict[str, Any]:
    """N people send one message each, at once; what they saw, and what the stack logged meanwhile. With
    ``langgraph_db`` (its database's URL), against the LangGraph side: new threads, no accounts. ``door``
    "openai": through ``/v1/chat/completions`` instead of the native stream."""
    from core.models import TaskSendFailure

    calls_before = model.calls
    if langgraph_db:
        seeded = [("-", str(uuid.uuid4())) for _ in range(people)]
    else:
        seeded = _seed(people, uuid.uuid4().hex[:8])
    sends_failed_before = sum(TaskSendFailure.objects.values_list("count", flat=True))
    log_from = log.stat().st_size
    health, connections = Probe(), Probe()
    prober = _start_health_probe(base)
    samplers = [
        threading.Thread(target=_probe_connections, args=(langgraph_db or database_url(), connections), daemon=True)
    ]
    for sampler in samplers:
        sampler.start()
    t0 = [0.0]
    start = threading.Barrier(people, action=lambda: t0.__setitem__(0, time.monotonic()))
    chats: list[Chat] = _in_parallel(seeded, lambda job: _chat(base, job[0], job[1], start, t0, timeout, door))
    time.sleep(2.0)  # what the turns' after-commit work logs lands in the next two seconds
    _stop_health_probe(prober, health)
    connections.stop.set()
    for sampler in samplers:
        sampler.join(timeout=10)
    with log.open("rb") as handle:
        handle.seek(log_from)
        logged = handle.read().decode(errors="replace")
    errors = [m.group(0) for m in ERROR_RECORD.finditer(logged)]
    error_lines = [line[:300] for line in logged.splitlines() if ERROR_RECORD.search(line)]
    failed = [c for c in chats if c.error]
    done = [c.done for c in chats if c.done is not None]
    first = [c.first_token for c in chats if c.first_token is not None]
    accepted = [c.accepted for c in chats if c.accepted is not None]
    started = [c.started for c in chats if c.started is not None]
    if langgraph_db:  # every call the stand-in answered meanwhile was a turn's (LangGraph has no background calls)
        cost: dict[str, Any] = {"model_calls_per_turn": round((model.calls - calls_before) / people, 2)}
    else:
        cost = _turn_cost([session for _token, session in seeded])
    return {
        "people": people,
        **cost,
        "wall_s": round(max(done, default=0.0), 2),
        "failures": len(failed),
        "failure_sample": [c.error for c in failed[:5]],
        "accepted_s": {"p50": round(percentile(accepted, 0.5), 2), "p95": round(percentile(accepted, 0.95), 2)},
        "started_s": {"p50": round(percentile(started, 0.5), 2), "p95": round(percentile(started, 0.95), 2)},
        "first_token_s": {"p50": round(percentile(first, 0.5), 2), "p95": round(percentile(first, 0.95), 2)},
        "done_s": {"p50": round(percentile(done, 0.5), 2), "p95": round(percentile(done, 0.95), 2)},
        "healthz_max_s": round(max(health.samples, default=0.0), 3),
        "healthz_probes": len(health.samples),
        "healthz_failures": health.failures,
        "pg_connections_max": int(max(connections.samples, default=0.0)),
        "pg_connections_at_most_by_holder": connections.detail,
        "log_error_records": len(errors),
        "log_error_sample": error_lines[:5],
        "task_sends_failed": sum(TaskSendFailure.objects.values_list("count", flat=True)) - sends_failed_before,
    }


def _turn_cost(session_ids: list[str]) -> dict[str, Any]:
    """The model calls of the turns of ``session_ids`` (those a turn makes: the reply, a routing or workflow decision;
    not the background's memory writes and summaries), per turn and by purpose, with their tokens."""
    from django.db.models import Count, Sum

    from agents.models import LLMCall

    rows = (
        LLMCall.objects.filter(session_id__in=session_ids, purpose__in=("reply", "route", "slots"))
        .values("purpose")
        .annotate(calls=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )
    turns = max(len(session_ids), 1)
    by_purpose = {
        row["purpose"]: {
            "calls": round(row["calls"] / turns, 2),
            "prompt_tokens": round((row["prompt"] or 0) / turns),
            "completion_tokens": round((row["completion"] or 0) / turns),
        }
        for row in rows
    }
    return {
        "model_calls_per_turn": round(sum(v["calls"] for v in by_purpose.values()), 2),
        "per_turn_by_purpose": by_purpose,
    }


def floor(*, model: StandInModel, people: int, timeout: float) -> float:
    """Seconds for ``people`` clients to make a turn's two calls straight to the stand-in (no app)."""
    import httpx

    schema = {"type": "object", "properties": {"action": {"enum": ["answer"]}}, "required": ["action"]}
    structured: dict[str, Any] = {"model": "stand-in", "messages": [{"role": "user", "content": MESSAGE}]}
    structured["response_format"] = {"type": "json_schema", "json_schema": {"name": "Route", "schema": schema}}
    streamed = {"model": "stand-in", "messages": [{"role": "user", "content": MESSAGE}], "stream": True}
    t0 = [0.0]
    start = threading.Barrier(people, action=lambda: t0.__setitem__(0, time.monotonic()))

    def turn(_: int) -> float:
        with httpx.Client(base_url=model.base_url, timeout=timeout) as client:
            start.wait()
            client.post("/chat/completions", json=structured).raise_for_status()
            with client.stream("POST", "/chat/completions", json=streamed) as response:
                for _line in response.iter_lines():
                    pass
        return time.monotonic() - t0[0]

    return round(max(_in_parallel(list(range(people)), turn)), 2)


def stack_env(*, model: StandInModel, data_dir: Path, database: str | None, embedder: str = "") -> dict[str, str]:
    """The environment of ``manage.py runstack`` as ``make run`` has it, on ``data_dir`` and the stand-in ``model``:
    the bench's own settings of the broker, queue, embedder and statement timeout left out; ``database`` the
    PostgreSQL to use (None: make run's own embedded one, in ``data_dir``); no rate limits (the load is the point:
    the per-user rates would answer 429 to a crowd of one user's size)."""
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "APP_DATA_DIR": str(data_dir),
            "LLM_BASE_URL": model.base_url,
            "LLM_MODEL": "stand-in",
            "LLM_API_KEY": "",
            "API_THROTTLE_MESSAGES": "1000000/min",
            "API_THROTTLE_USER": "1000000/min",
        }
    )
    unset = (
        "LLM_PROFILES_JSON",
        "CELERY_BROKER_URL",
        "REDIS_URL",
        "RUN_EVENTS_URL",
        "CELERY_QUEUE",
        "CELERY_FILESYSTEM_BROKER_DIR",
        "EMBEDDING_SERVICE_SOCKET",
        "DATABASE_STATEMENT_TIMEOUT",
        "TEST_DB_SUFFIX",
        "DATABASE_URL",
    )
    for name in unset:
        env.pop(name, None)
    if database:
        env["DATABASE_URL"] = database
    if embedder:
        env["EMBEDDING_BACKEND"] = embedder
    return env


def start_stack(*, env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """``manage.py runstack`` in a process group of its own, its output in ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


LANGGRAPH_DATABASE = "bench_concurrency_langgraph"


def _start_langgraph(
    *, port: int, model: StandInModel, database: str, log: Path, workers: int
) -> subprocess.Popen[bytes]:
    """The like-for-like side (``bench/langgraph_server.py``) on uvicorn, ``workers`` processes."""
    env = dict(os.environ)
    env.update(
        {
            "LANGGRAPH_DATABASE_URL": database,
            "LANGGRAPH_MODEL_URL": model.base_url,
            "LANGGRAPH_POOL_SIZE": str(max(1, 20 // workers)),
        }
    )
    command = [sys.executable, "-m", "uvicorn", "bench.langgraph_server:app", "--host", LOOPBACK, "--port", str(port)]
    command += ["--lifespan", "on"]  # a process whose startup fails exits, instead of serving half set up
    command += ["--workers", str(workers), "--loop", "uvloop", "--http", "httptools", "--no-access-log"]
    with log.open("wb") as out:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _langgraph_database() -> str:
    """A new, empty database for the LangGraph side's checkpoints, on the bench's server: its URL."""
    import psycopg

    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{LANGGRAPH_DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{LANGGRAPH_DATABASE}"')
    return database_url(LANGGRAPH_DATABASE)


def _wait_healthy(server: subprocess.Popen[bytes], base: str, log: Path, *, timeout: float) -> float:
    import httpx

    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited during start-up:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return time.monotonic() - began
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the server was not ready within {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


def _wait_ready(stack: subprocess.Popen[bytes], log: Path, *, timeout: float) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if stack.poll() is not None:
            raise RuntimeError(f"the stack exited during start-up:\n{log.read_text(errors='replace')[-3000:]}")
        if "Ready at" in log.read_text(errors="replace"):
            return time.monotonic() - began
        time.sleep(0.5)
    raise RuntimeError(f"the stack was not ready within {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


def _stack_memory_mb(root: int) -> dict[str, int]:
    """The memory of the stack (``bench.footprint.stack_processes``), in MB: ``rss``, the sum of each process's
    resident set (shared pages counted in each), and ``pss`` (a shared page split between its sharers)."""
    from bench.footprint import stack_processes

    processes = stack_processes(root)
    return {"rss": sum(p["rss_mb"] for p in processes), "pss": sum(p["pss_mb"] for p in processes)}


def _stop_stack(stack: subprocess.Popen[bytes]) -> None:
    if stack.poll() is None:
        stack.send_signal(signal.SIGINT)  # as Ctrl-C: runstack stops what it started
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait(timeout=10)


def run(
    *,
    argv: list[str],
    people: list[int],
    latency: float,
    ttft: float,
    embedder: str,
    timeout: float,
    langgraph_workers: int = 0,
    openai: bool = True,
) -> dict[str, Any]:
    import logging

    from rich.progress import Progress

    from agents.services import default_agents_ensure

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would bury the figures
    default_agents_ensure()
    folder = Path(tempfile.mkdtemp(prefix="concurrency-"))
    log = folder / "stack.log"
    port = free_port()
    base = f"http://{LOOPBACK}:{port}"
    phases: list[dict[str, Any]] = []
    graph_phases: list[dict[str, Any]] = []
    openai_phases: list[dict[str, Any]] = []
    with StandInModel(latency=latency, ttft=ttft) as model, Progress() as progress:
        task = progress.add_task("floor, then the stack", total=(3 if langgraph_workers else 2) * len(people) + 1)
        floors = {}
        for n in people:
            floors[n] = floor(model=model, people=n, timeout=timeout)
            progress.advance(task)
        env = stack_env(model=model, data_dir=folder / "data", database=database_url(), embedder=embedder)
        stack = start_stack(env=env, port=port, log=log)
        try:
            ready_s = _wait_ready(stack, log, timeout=300)
            time.sleep(5)  # the web processes' and workers' warm-up threads finish
            ready_memory = _stack_memory_mb(stack.pid)  # ready, idle: what make run holds before anyone chats
            progress.advance(task)
            for n in people:
                progress.update(task, description=f"{n} people at once")
                phases.append(
                    {**phase(base=base, people=n, log=log, timeout=timeout, model=model), "floor_wall_s": floors[n]}
                )
                if openai:  # the same crowd through the OpenAI-compatible door, right after
                    openai_phases.append(
                        phase(base=base, people=n, log=log, timeout=timeout, model=model, door="openai")
                    )
                progress.advance(task)
            memory = _stack_memory_mb(stack.pid)  # after the crowds: the stack idle again, its caches grown
        finally:
            _stop_stack(stack)
        if langgraph_workers:
            graph_log = folder / "langgraph.log"
            graph_db = _langgraph_database()
            graph_port = free_port()
            graph_base = f"http://{LOOPBACK}:{graph_port}"
            server = _start_langgraph(
                port=graph_port, model=model, database=graph_db, log=graph_log, workers=langgraph_workers
            )
            try:
                _wait_healthy(server, graph_base, graph_log, timeout=120)
                for n in people:
                    progress.update(task, description=f"LangGraph: {n} people at once")
                    graph_phases.append(
                        phase(
                            base=graph_base,
                            people=n,
                            log=graph_log,
                            timeout=timeout,
                            model=model,
                            langgraph_db=graph_db,
                        )
                    )
                    progress.advance(task)
            finally:
                _stop_stack(server)
    for side in (phases, openai_phases, graph_phases):
        alone = (side[0]["wall_s"] if side else 0.0) or 1.0
        for result in side:
            result["wall_ratio"] = round(result["wall_s"] / alone, 2)
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m bench concurrency", *(["--", *argv] if argv else [])]),
        "agent": AGENT["slug"],
        "model_latency_s": latency,
        "model_ttft_s": ttft,
        "embedder": embedder or "the default (make run's)",
        "stack_ready_s": round(ready_s, 1),
        "stack_rss_mb": memory["rss"],
        "stack_pss_mb": memory["pss"],
        "ready_rss_mb": ready_memory["rss"],
        "ready_pss_mb": ready_memory["pss"],
        "stack_log": str(log),
        "phases": phases,
        "openai_phases": openai_phases,
        "langgraph_workers": langgraph_workers,
        "langgraph_phases": graph_phases,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench concurrency")
    parser.add_argument("--people", default="1,64,256", help="comma-separated crowd sizes; the first is 'alone'")
    parser.add_argument("--latency", type=float, default=4.0, help="seconds per model call")
    parser.add_argument("--ttft", type=float, default=0.3, help="seconds to a streamed call's first word")
    parser.add_argument("--embedder", default="", help="EMBEDDING_BACKEND for the stack (default: make run's)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a person waits for the reply")
    parser.add_argument(
        "--langgraph-workers",
        type=int,
        default=-1,
        help="uvicorn processes of the LangGraph side (default 2 when langgraph is installed; 0: no LangGraph side)",
    )
    parser.add_argument("--agent", default="assistant", help="the agent's slug (assistant, flight-booking)")
    parser.add_argument("--no-openai", action="store_true", help="skip the crowds through /v1/chat/completions")
    parser.add_argument("--output", type=Path, default=RESULTS / "concurrency.json")
    args, _ = parser.parse_known_args(argv)
    AGENT["slug"] = args.agent
    if args.langgraph_workers < 0:
        try:
            import langgraph.checkpoint.postgres.aio  # noqa: F401
        except ImportError:
            print("langgraph is not installed (make bench installs it into .venv-peers): no LangGraph side")
            args.langgraph_workers = 0
        else:
            args.langgraph_workers = 2
    people = [int(n) for n in args.people.split(",") if n.strip()]
    if not people or min(people) < 1:
        parser.error("--people takes crowd sizes of at least 1")

    from django.db import connections
    from django.test.utils import setup_databases

    # A throwaway database (kept between runs): the crowd's users and chats stay out of the app's data.
    setup_databases(verbosity=0, interactive=False, keepdb=True, aliases={"default"})  # type: ignore[arg-type]
    result = run(
        argv=argv,
        people=people,
        latency=args.latency,
        ttft=args.ttft,
        embedder=args.embedder,
        timeout=args.timeout,
        langgraph_workers=args.langgraph_workers,
        openai=not args.no_openai,
    )
    connections.close_all()
    print(
        f"model: {args.latency:g} s a call; stack ready after {result['stack_ready_s']} s, "
        f"memory ready {result['ready_rss_mb']} MB RSS / {result['ready_pss_mb']} MB PSS, after the crowds "
        f"{result['stack_rss_mb']} / {result['stack_pss_mb']} MB; log {result['stack_log']}"
    )
    print(
        "people | wall s (x alone) | floor s | accepted p50/p95 | turn started p50/p95 | first token p50/p95 | done p50/p95 | failures | healthz max | pg conns | log errors | sends failed | model calls a turn"
    )
    for p in [*result["phases"], *result["openai_phases"], *result["langgraph_phases"]]:
        if p is (result["openai_phases"] or [None])[0]:
            print("The same crowds through POST /v1/chat/completions (streamed, X-Session-Id):")
        if p is (result["langgraph_phases"] or [None])[0]:
            print(f"LangGraph (astream on AsyncPostgresSaver, uvicorn, {result['langgraph_workers']} processes):")
        print(
            f"{p['people']} | {p['wall_s']} ({p['wall_ratio']}x) | {p.get('floor_wall_s', '-')} | "
            f"{p['accepted_s']['p50']}/{p['accepted_s']['p95']} | {p['started_s']['p50']}/{p['started_s']['p95']} | "
            f"{p['first_token_s']['p50']}/{p['first_token_s']['p95']} | {p['done_s']['p50']}/{p['done_s']['p95']} | "
            f"{p['failures']} | {p['healthz_max_s']} s | {p['pg_connections_max']} | {p['log_error_records']} | "
            f"{p['task_sends_failed']} | {p.get('model_calls_per_turn', '-')}"
        )
        for line in p["log_error_sample"] + p["failure_sample"]:
            print("   ", line)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    failed = any(
        p["failures"] or p["log_error_records"] or p["task_sends_failed"]
        for p in [*result["phases"], *result["openai_phases"]]
    )
    failed = failed or any(p["failures"] for p in result["langgraph_phases"])
    return 1 if failed else 0
