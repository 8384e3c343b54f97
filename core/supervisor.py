"""The children of ``make run`` (``manage.py runstack``), kept alive: a child that dies is restarted, with backoff.

Each child runs in a process group of its own, so that what it started (gunicorn's workers, Celery's pool
processes and its beat) goes with it: when the child dies, whatever is left of its group is stopped before it
is started again, and nothing is orphaned. The backoff doubles from ``min_backoff`` to ``max_backoff`` while
the child keeps dying, and starts again from ``min_backoff`` once it has stayed up ``stable_after`` seconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import embedded_broker, embedded_db


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class Child:
    """One supervised process: ``start()`` it, then call ``heal()`` every so often."""

    name: str
    argv: list[str]
    min_backoff: float = 1.0
    max_backoff: float = 30.0
    stable_after: float = 60.0
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    restart_at: float | None = None
    backoff: float = field(default=0.0)
    env: dict[str, str] | None = None  # set in the environment it starts with (on top of this process's)
    nice: int = 0  # added to its scheduling niceness: a child whose work can wait yields the CPU to the rest

    def __post_init__(self) -> None:
        self.backoff = self.backoff or self.min_backoff

    def start(self) -> None:
        env = {**os.environ, **self.env} if self.env else None
        nice = self.nice
        # The supervisor runs no threads, so a function run in the child before its exec is safe here.
        preexec = (lambda: os.nice(nice)) if nice else None
        self.proc = subprocess.Popen(self.argv, start_new_session=True, env=env, preexec_fn=preexec)
        self.started_at = time.monotonic()

    def heal(self) -> str:
        """Restart the child if it died and its backoff has passed. Returns what to tell the operator ('': nothing)."""
        now = time.monotonic()
        if self.restart_at is not None:
            if now < self.restart_at:
                return ""
            self.restart_at = None
            self.signal(signal.SIGKILL)  # what the dead child left in its group and did not stop by now
            self.start()
            self.restarts += 1
            return f"{self.name} restarted (restart {self.restarts})."
        if self.proc is None or self.proc.poll() is None:
            return ""
        if now - self.started_at >= self.stable_after:
            self.backoff = self.min_backoff
        wait = self.backoff
        self.backoff = min(self.max_backoff, self.backoff * 2)
        self.restart_at = now + wait
        self.signal(signal.SIGTERM)  # its group's other processes (a beat, pool processes) stop with it
        return f"{self.name} exited ({_describe(self.proc.returncode)}); restarting it in {wait:g} s."

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group (whatever is still in it)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):  # nothing left in the group
            pass

    def wait_or_kill(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the child to end, then kill what is left of its group."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self.signal(signal.SIGKILL)
        self.proc.wait()


# --- make run's supervising process ------------------------------------------------------------------------------
# ``manage.py runstack`` prepares (migrations, the first staff user, the agents), says where the app is, then
# replaces itself (``os.execv``, the same process id) with ``python -m core.supervisor PLAN``: a process that
# imports no Django and holds ~20 MB instead of ~150 while it watches the children for as long as the app runs.


@dataclass
class Plan:
    """What the supervising process starts and watches, and what it stops at the end."""

    children: list[dict[str, Any]]  # name, argv, env, nice
    url: str  # the web server's root: "Ready at" once its /readyz answers 200
    broker_folder: str | None = None  # the embedded Valkey to restart when it stops answering
    stop_broker: bool = False  # started by runstack: stopped with the rest
    pg_folder: str | None = None  # the embedded PostgreSQL started by runstack: stopped with the rest
    pg_left_running: bool = False  # it ran before runstack: left running, and said so

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls(**json.loads(text))


def readiness(readyz_url: str) -> tuple[bool, str]:
    """(ready, what is still awaited) from the web server's /readyz ("the web server" while it does not answer)."""
    try:
        with urllib.request.urlopen(readyz_url, timeout=2) as response:
            return response.status == 200, ""
    except urllib.error.HTTPError as error:
        try:
            body = json.loads(error.read() or b"{}")
        except ValueError:
            return False, "the web server"
        waiting = [
            str(check.get("error", name))
            for name, check in body.items()
            if isinstance(check, dict) and not check.get("ok")
        ]
        return False, "; ".join(waiting)
    except (OSError, ValueError):
        return False, "the web server"


def _say(text: str, *, err: bool = False) -> None:
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def _heal(what: str, is_up: Callable[[], bool], start: Callable[[], object]) -> None:
    """A server runstack started outside the children (the embedded broker, the embedded PostgreSQL): started again
    when it is down; a start that fails is said, and tried again at the next check."""
    if is_up():
        return
    _say(f"The embedded {what} is down; starting it again.", err=True)
    try:
        start()
    except Exception as exc:  # noqa: BLE001 - said, and tried again at the next check
        _say(f"The embedded {what} could not be started: {exc}", err=True)


def _heal_broker(folder: Path) -> None:
    _heal(
        "broker",
        lambda: embedded_broker.answers(embedded_broker.socket_path(folder)),
        lambda: embedded_broker.ensure_embedded_valkey(folder),
    )


def _heal_postgres(folder: Path) -> None:
    """Its server gone (a killed postmaster, one stopped by hand): started again, its data kept in ``folder``."""
    _heal("PostgreSQL", lambda: embedded_db.is_running(folder), lambda: embedded_db.ensure_embedded_postgres(folder))


def _shutdown(plan: Plan, children: list[Child]) -> None:
    _say("\nStopping…")
    for child in children:
        child.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for child in children:
        child.wait_or_kill(max(0.1, deadline - time.monotonic()))
    if plan.broker_folder and plan.stop_broker:
        embedded_broker.stop_embedded_valkey(Path(plan.broker_folder))
    if plan.pg_folder:
        embedded_db.stop_embedded_postgres(Path(plan.pg_folder))
    elif plan.pg_left_running:
        _say("The embedded PostgreSQL was already running before; left running.")
    _say("Stopped.")


def supervise(plan: Plan) -> None:
    """Start the children, restart what dies, say when the app is ready, stop everything on Ctrl-C or SIGTERM."""
    stopping = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    children = [
        Child(c["name"], list(c["argv"]), env=c.get("env") or None, nice=int(c.get("nice") or 0)) for c in plan.children
    ]
    for child in children:
        child.start()
    ready, last_said = False, ""
    waiting_since = broker_checked = time.monotonic()
    try:
        while not stopping:
            for child in children:
                said = child.heal()
                if said:
                    _say(said, err=True)
            if time.monotonic() - broker_checked > 2:
                broker_checked = time.monotonic()
                if plan.broker_folder:
                    _heal_broker(Path(plan.broker_folder))
                if plan.pg_folder:
                    _heal_postgres(Path(plan.pg_folder))
            if not ready:
                # "Ready" only when the web process can answer a chat at once (/readyz): its models loaded,
                # the database answering, a worker heard from since the start.
                ready, waiting = readiness(f"{plan.url}readyz")
                if ready:
                    _say(f"Ready at {plan.url} (after {time.monotonic() - waiting_since:.0f}s)")
                elif waiting and waiting != last_said and time.monotonic() - waiting_since > 2:
                    _say(f"  starting: {waiting}…")
                    last_said = waiting
            time.sleep(0.5)
    finally:
        _shutdown(plan, children)


if __name__ == "__main__":
    supervise(Plan.from_json(sys.argv[1]))
