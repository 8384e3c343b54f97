"""The children of ``make run`` (``manage.py runstack``), kept alive: a child that dies is restarted, with backoff.

Each child runs in a process group of its own, so that what it started (gunicorn's workers, Celery's pool
processes and its beat) goes with it: when the child dies, whatever is left of its group is stopped before it
is started again, and nothing is orphaned. The backoff doubles from ``min_backoff`` to ``max_backoff`` while
the child keeps dying, and starts again from ``min_backoff`` once it has stayed up ``stable_after`` seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field


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

    def __post_init__(self) -> None:
        self.backoff = self.backoff or self.min_backoff

    def start(self) -> None:
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(self.argv, start_new_session=True, env=env)
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
