"""The memory ``make run`` holds: the real stack (``manage.py runstack``) ready, after one chat, idle.

It starts the stack as ``python -m bench concurrency`` does (a throwaway database, a stand-in model on loopback),
waits for "Ready", has one person send one message through the streaming API, waits a few seconds, and sums the
memory of every process under the stack: RSS (each process's resident set, shared pages counted in each) and
PSS (a shared page split between its sharers), per process and in all. The database server runs apart and is
not counted.

``python -m bench footprint`` writes ``bench/results/footprint.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.concurrency import _stop_stack, _wait_ready, phase, stack_env, start_stack
from bench.soak import free_port
from bench.stand_in_model import StandInModel
from core.db import database_url

RESULTS = Path(__file__).resolve().parent / "results"


def stack_processes(root: int) -> list[dict[str, Any]]:
    """Every process under ``root`` (and ``root``): pid, command, RSS and PSS in MB."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found = []
    for pid in parents:
        ancestor = pid
        while ancestor and ancestor != root:
            ancestor = parents.get(ancestor, 0)
        if ancestor != root:
            continue
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in rollup.splitlines()[1:] if ":" in line)
        found.append(
            {
                "pid": pid,
                "command": command[:120],
                "rss_mb": round(int(fields.get("Rss", "0 kB").split()[0]) / 1024),
                "pss_mb": round(int(fields.get("Pss", "0 kB").split()[0]) / 1024),
            }
        )
    return sorted(found, key=lambda p: -p["pss_mb"])


def run(*, argv: list[str], settle: float) -> dict[str, Any]:
    from agents.services import default_agents_ensure

    default_agents_ensure()
    folder = Path(tempfile.mkdtemp(prefix="footprint-"))
    log = folder / "stack.log"
    port = free_port()
    with StandInModel(latency=0.5, ttft=0.1) as model:
        env = stack_env(model=model, data_dir=folder / "data", database=database_url())
        stack = start_stack(env=env, port=port, log=log)
        try:
            ready_s = _wait_ready(stack, log, timeout=300)
            chat = phase(base=f"http://127.0.0.1:{port}", people=1, log=log, timeout=120)
            time.sleep(settle)
            processes = stack_processes(stack.pid)
        finally:
            _stop_stack(stack)
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m bench footprint", *(["--", *argv] if argv else [])]),
        "ready_s": round(ready_s, 1),
        "chat_failures": chat["failures"],
        "rss_mb": sum(p["rss_mb"] for p in processes),
        "pss_mb": sum(p["pss_mb"] for p in processes),
        "processes": processes,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench footprint")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds idle after the chat before measuring")
    parser.add_argument("--output", type=Path, default=RESULTS / "footprint.json")
    args, _ = parser.parse_known_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its polling of /readyz would bury the figures

    from django.db import connections
    from django.test.utils import setup_databases

    setup_databases(verbosity=0, interactive=False, keepdb=True, aliases={"default"})  # type: ignore[arg-type]
    result = run(argv=argv, settle=args.settle)
    connections.close_all()
    for p in result["processes"]:
        print(f"{p['pss_mb']:>6} MB PSS {p['rss_mb']:>6} MB RSS  {p['command']}")
    print(f"make run, ready and after one chat: {result['rss_mb']} MB RSS, {result['pss_mb']} MB PSS in all")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0 if result["chat_failures"] == 0 else 1
