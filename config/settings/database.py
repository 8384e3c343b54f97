"""The database: PostgreSQL with pgvector, always (embedded unless DATABASE_URL is set)."""

from __future__ import annotations

from config.settings.site import DATA_DIR
from core.env import database_from_url, env_bool, env_int, env_str

# --- Database: PostgreSQL with pgvector, always. -----------------------------------------
# With DATABASE_URL unset, an embedded PostgreSQL 18 (+pgvector) is started on first use,
# its data under DATA_DIR/pg. See core/embedded_db.py.
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    _db = database_from_url(DATABASE_URL)
else:
    from core.embedded_db import default_shared_buffers, embedded_database_settings

    # PostgreSQL's page cache: the HNSW index and the memories it points at should fit (bench/memory_scale.py).
    _db = embedded_database_settings(
        DATA_DIR / "pg", shared_buffers=env_str("EMBEDDED_PG_SHARED_BUFFERS") or default_shared_buffers()
    )
_db["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
# Every connection gives up connecting after DATABASE_CONNECT_TIMEOUT seconds, and the server cancels any
# statement after DATABASE_STATEMENT_TIMEOUT seconds (0: never; index builds lift it for themselves). Behind
# PgBouncer in transaction mode, which refuses start-up options, set it to 0 and on the database role instead.
_options: dict[str, object] = dict(_db.get("OPTIONS") or {})  # type: ignore[call-overload]
_options.setdefault("connect_timeout", env_int("DATABASE_CONNECT_TIMEOUT", 5, minimum=1))  # the URL's own wins
# Who holds each connection, in pg_stat_activity (make run names its processes: agents-web, agents-turns, ...).
_options.setdefault("application_name", env_str("DATABASE_APPLICATION_NAME") or "agents")
STATEMENT_TIMEOUT_SECONDS = env_int("DATABASE_STATEMENT_TIMEOUT", 120, minimum=0)
if STATEMENT_TIMEOUT_SECONDS:
    _given = str(_options.get("options", "")).strip()
    _options["options"] = f"{_given} -c statement_timeout={STATEMENT_TIMEOUT_SECONDS * 1000}".strip()
# A pool of at most DATABASE_POOL_MAX_SIZE connections per process (psycopg's, through Django): a thread takes
# one for a statement or a transaction and gives it back, so a turn worker's hundreds of threads, each waiting on a
# model, share a few connections (make run sets it; 0: a connection per thread, kept DATABASE_CONN_MAX_AGE).
DATABASE_POOL_MAX_SIZE = env_int("DATABASE_POOL_MAX_SIZE", 0, minimum=0)
if DATABASE_POOL_MAX_SIZE:
    _options["pool"] = {
        "min_size": 1,
        "max_size": DATABASE_POOL_MAX_SIZE,
        "timeout": env_int("DATABASE_POOL_TIMEOUT", 30, minimum=1),
    }
    _db["CONN_MAX_AGE"] = 0  # the pool keeps them
# Behind PgBouncer in transaction mode (DATABASE_TRANSACTION_POOLER=true): no server-side prepared statements or
# cursors, no per-connection settings (set statement_timeout and pgvector's hnsw.* on the role instead).
DATABASE_TRANSACTION_POOLER = env_bool("DATABASE_TRANSACTION_POOLER", False)
if DATABASE_TRANSACTION_POOLER:
    _options["prepare_threshold"] = None
    _options.pop("options", None)  # PgBouncer refuses start-up options
    _db["DISABLE_SERVER_SIDE_CURSORS"] = True
_db["OPTIONS"] = _options
_db["CONN_HEALTH_CHECKS"] = True  # with the pool: each connection is checked as it is handed out
# Parallel test runs (several developers or helpers on one machine) each get their own test database.
_db["TEST"] = {"NAME": f"test_{_db['NAME']}{env_str('TEST_DB_SUFFIX', '') or ''}"}
# Note: no ATOMIC_REQUESTS. A request waiting on an LLM must not hold a transaction open.
DATABASES = {"default": _db}
if DATABASE_POOL_MAX_SIZE:
    # /healthz and /readyz read the database on a connection of their own, outside the pool: under load they
    # would otherwise wait in the pool's queue behind the requests they are meant to vouch for.
    _health_options = {k: v for k, v in _options.items() if k != "pool"}
    _health_options["application_name"] = f"{_options['application_name']}-health"
    DATABASES["health"] = {
        **_db,
        "OPTIONS": _health_options,
        "CONN_MAX_AGE": 60,
        "TEST": {"NAME": _db["TEST"]["NAME"], "MIRROR": "default"},  # type: ignore[index]
    }
