"""``python -m bench`` stops the embedded PostgreSQL and broker it started (issue 55: they stayed running, and a
``make run`` started later adopted them and left them running after its Ctrl-C)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RUN = """
import os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()
from django.db import connection
from core import embedded_broker, embedded_db
from core.embedded_broker import ensure_configured
ensure_configured()
connection.ensure_connection()
assert embedded_broker.started_by_this_process and embedded_db.started_by_this_process
import bench.__main__ as bench_main
bench_main._stop_what_this_run_started()
"""


def test_the_bench_stops_the_embedded_services_it_started(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env["APP_DATA_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", RUN], cwd=ROOT, env=env, capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    from core import embedded_broker, embedded_db

    assert (tmp_path / "pg").exists() and (tmp_path / "valkey").exists()  # they were started here
    assert not embedded_broker.answers(embedded_broker.socket_path(tmp_path / "valkey"))
    assert not embedded_db.is_running(tmp_path / "pg")
