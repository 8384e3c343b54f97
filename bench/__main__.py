"""``python -m bench [part ...] [-- part options]``: run named benchmark parts (all when none is named).

A part is a module in this package with ``main(argv: list[str]) -> int``. To add one, write the
module and add one line to ``PARTS``. Django is set up before any part is imported, so parts may
use the ORM, the token counter and the providers like the app does.
"""

from __future__ import annotations

import importlib
import os
import sys

# name -> module. One line per part.
PARTS: dict[str, str] = {
    "context": "bench.context_bench",
    "turn_overhead": "bench.turn_overhead",
    "peer_mem0": "bench.peer_mem0",
    "api_throughput": "bench.api_throughput",
    "gallery": "bench.gallery",
    "soak": "bench.soak",
    "concurrency": "bench.concurrency",
    "faults": "bench.faults",
    "broker": "bench.broker",
    "footprint": "bench.footprint",
    "memory_eval": "bench.memory_eval",
    "store_shape": "bench.store_shape",
    "query_embedding": "bench.query_embedding",
    "memory_locomo": "bench.memory_locomo",
    "memory_scale": "bench.memory_scale",
    "admin_scale": "bench.admin_scale",
}


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        print("parts:", ", ".join(PARTS))
        return 0
    names, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        print(f"unknown part(s): {', '.join(unknown)}; known: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # Parts that need a database create a throwaway test database; its own name keeps it apart from
    # the test suite's and the app's.
    os.environ.setdefault("TEST_DB_SUFFIX", "_bench")
    # Building a corpus (a million rows, their HNSW index) takes minutes a statement: no statement timeout here.
    os.environ.setdefault("DATABASE_STATEMENT_TIMEOUT", "0")
    import django

    django.setup()
    # The parts that run turns publish their events and queue their tasks on the broker: the embedded one
    # (the default) is started here when no process has, as every other process of the app does at start.
    # Without it each turn waited ~30 s on a broker that was not there (the gallery took half an hour).
    from core.embedded_broker import ensure_configured

    ensure_configured()
    status = 0
    try:
        for name in names or list(PARTS):
            print(f"== bench {name} ==", flush=True)
            module = importlib.import_module(PARTS[name])
            status = max(status, int(module.main(rest)))
    finally:
        _stop_what_this_run_started()
    return status


def _stop_what_this_run_started() -> None:
    """The embedded PostgreSQL and broker, when this run started them (a `make run` started later would adopt
    them, and leave them running after its Ctrl-C); never what was running before."""
    from django.conf import settings
    from django.db import connections

    from core import embedded_broker, embedded_db

    connections.close_all()
    if embedded_broker.started_by_this_process and settings.EMBEDDED_BROKER_DIR is not None:
        embedded_broker.stop_embedded_valkey(settings.EMBEDDED_BROKER_DIR)
    if embedded_db.started_by_this_process and not settings.DATABASE_URL:
        embedded_db.stop_embedded_postgres(settings.DATA_DIR / "pg")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
