"""/healthz: is the database (with pgvector), the broker and a worker alive?

Open to anyone (load balancers, uptime checks): a failure is named, its exception text (hosts, addresses,
user names) goes to the log only.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from config.celery import app
from config.models import WorkerHeartbeat

logger = logging.getLogger(__name__)
WORKER_FRESH_FOR = timedelta(seconds=60)


def _failed(what: str, exc: Exception) -> str:
    logger.warning("health check: %s: %s: %s", what, type(exc).__name__, exc)
    return f"{what} ({type(exc).__name__}; details in the server log)"


def check_database() -> dict[str, Any]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            row = cursor.fetchone()
            cursor.execute("SHOW server_version")
            version_row = cursor.fetchone()
    except Exception as exc:  # noqa: BLE001 - health reports every failure as data
        return {"ok": False, "error": _failed("the database is unreachable", exc)}
    if row is None:
        return {"ok": False, "error": "the pgvector extension is not installed (run migrations)"}
    return {"ok": True, "postgres": version_row[0] if version_row else None, "pgvector": row[0]}


def check_broker() -> dict[str, Any]:
    url = str(app.conf.broker_url)
    transport = url.split("://", 1)[0]
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "transport": transport, "error": _failed("the broker is unreachable", exc)}
    return {"ok": True, "transport": transport}


def check_worker() -> dict[str, Any]:
    try:
        beat = WorkerHeartbeat.objects.order_by("-seen_at").first()
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": _failed("the worker heartbeat could not be read", exc)}
    if beat is None:
        return {"ok": False, "error": "no worker heartbeat seen yet"}
    age = (timezone.now() - beat.seen_at).total_seconds()
    ok = age <= WORKER_FRESH_FOR.total_seconds()
    result: dict[str, Any] = {"ok": ok, "hostname": beat.hostname, "last_seen_seconds_ago": round(age, 1)}
    if not ok:
        result["error"] = f"last heartbeat {age:.0f}s ago (more than {WORKER_FRESH_FOR.total_seconds():.0f}s)"
    return result


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    database = check_database()
    checks = {"database": database, "broker": check_broker()}
    checks["worker"] = check_worker() if database["ok"] else {"ok": False, "error": "database unavailable"}
    ok = all(c["ok"] for c in checks.values())
    return JsonResponse({"status": "ok" if ok else "error", **checks}, status=200 if ok else 503)
