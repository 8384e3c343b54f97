"""Settings for the agent runtime: one file, driven by environment variables.

Every variable is documented in docs/configuration.md. Helpers in
``core.env`` raise ``ImproperlyConfigured`` on values they cannot parse.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from csp.constants import NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from core import task_names
from core.embedded_broker import broker_url as embedded_broker_url
from core.embedded_broker import socket_path as embedded_broker_socket
from core.env import (
    database_from_url,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_rate,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
# Local state (embedded PostgreSQL, the serverless broker, the generated secret key). Git-ignored.
DATA_DIR = Path(env_str("APP_DATA_DIR", str(BASE_DIR / ".data")) or BASE_DIR / ".data")

# Off unless asked for: Django's debug page shows code, settings and requests to whoever meets an error, and
# `make run` serves the pages people use. DEBUG=true for working on the code.
DEBUG = env_bool("DEBUG", False)
# ALLOWED_HOSTS set: the app answers under names of its own, for other people (a deployment, not `make run`).
SERVES_OTHERS = bool(env_str("ALLOWED_HOSTS"))


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    if SERVES_OTHERS and not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY is required when ALLOWED_HOSTS is set (and DEBUG is off)")
    # Local use: generate once and keep it, so sessions survive restarts.
    path = DATA_DIR / "secret_key"
    if path.exists():
        return path.read_text().strip()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    path.write_text(key)
    path.chmod(0o600)
    return key


SECRET_KEY = _secret_key()
# The debug page and error reports also hide settings that hold credentials in URLs (core/reporting.py).
DEFAULT_EXCEPTION_REPORTER_FILTER = "core.reporting.SettingsFilter"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "core.apps.CoreConfig",
    "agents",
    "memory",
    "sessions.apps.ChatSessionsConfig",
    "observability",
    # The flight-booking demo: a workflow, two tools, the demo model's script for them, its Booking model, its
    # agent and its part of erasure, plugged in through AGENT_WORKFLOWS, AGENT_TOOLS, AGENT_SEEDS and
    # PERSON_ERASERS below as any package of yours would be (examples/booking/).
    "examples.booking",
    # Every door (admin, API, chat pages, ops pages, MCP, Celery tasks, management commands): last, so it sees
    # every model.
    "web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # 413 for oversize bodies before anything reads them (JSON error format under /api/).
    "core.api_errors.RequestSizeLimitMiddleware",
    # 400 for a page address with a NUL (%00) in its query string (PostgreSQL refuses NUL in a filter).
    "core.api_errors.NulQueryMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, so its process_exception sees a view's database errors first: a 503 page, not a 500.
    "core.api_errors.DatabaseUnavailableMiddleware",
]

# Content-Security-Policy on every response (django-csp): scripts only from this site's files, never inline
# (no inline handler either); styles may be inline (the admin's and the charts' style attributes); nothing
# from another origin; no framing.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

ROOT_URLCONF = "web.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

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
    DATABASES["health"] = {
        **_db,
        "OPTIONS": _health_options,
        "CONN_MAX_AGE": 60,
        "TEST": {"NAME": _db["TEST"]["NAME"], "MIRROR": "default"},  # type: ignore[index]
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]

LOGIN_URL = "/accounts/login/"
# Failed sign-ins for one username from one address before that pair is refused, and for how long.
LOGIN_MAX_FAILURES = env_int("LOGIN_MAX_FAILURES", 10, minimum=1)
LOGIN_FAILURE_WINDOW_SECONDS = env_int("LOGIN_FAILURE_WINDOW_SECONDS", 900, minimum=1)
# Reverse proxies of ours in front of the app (nginx, a load balancer), each appending to X-Forwarded-For.
# 0: the client is REMOTE_ADDR and the header is ignored (a client could write anything into it). n: the
# client is the n-th address from the header's end, the one our outermost proxy saw. Used by the sign-in
# throttle and, as DRF's NUM_PROXIES, by the API throttles. (/metrics never trusts forwarded headers.)
NUM_PROXIES = env_int("NUM_PROXIES", 0, minimum=0, maximum=10)
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"
# Secure cookies where the app serves others (over HTTPS); `make run` answers on http://127.0.0.1.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", SERVES_OTHERS and not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", SERVES_OTHERS and not DEBUG)
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# Request size limits: Django answers 400 past these; the API maps oversize bodies to 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 256 * 1024, minimum=1024)
# Largest import file through the API (POST /api/me/import/); bigger ones: manage.py import_person.
IMPORT_MAX_BYTES = env_int("IMPORT_MAX_BYTES", 20 * 1024 * 1024, minimum=1024)
# Paths whose bodies may be larger than MAX_REQUEST_BYTES, and their own limits.
LARGE_BODY_PATHS = {"/api/me/import/": IMPORT_MAX_BYTES}

# --- Celery ----------------------------------------------------------------------------------
# REDIS_URL (or CELERY_BROKER_URL) in production. Unset: the embedded broker, a Valkey server from a wheel on
# a Unix socket in DATA_DIR/valkey/ (core/embedded_broker.py), started by whatever serves first: runstack,
# a web or MCP process as it starts (web.warmup.process_prepare), a worker as it starts (config/celery.py).
REDIS_URL = env_str("REDIS_URL")
_broker = env_str("CELERY_BROKER_URL") or REDIS_URL
EMBEDDED_BROKER_DIR: Path | None = None if _broker else DATA_DIR / "valkey"
CELERY_BROKER_URL: str = _broker or embedded_broker_url(DATA_DIR / "valkey")

# The cache holds the API's throttle counters and the sign-in failure counts, which every process must
# share: gunicorn runs several, and per-process counters would let each one allow the whole rate. Redis
# when REDIS_URL is set; the embedded Valkey by default; else (another broker, or CACHE_ON_EMBEDDED_BROKER=false)
# a table in the app's PostgreSQL (created by a migration of config/).
CACHES: dict[str, dict[str, object]]
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
elif EMBEDDED_BROKER_DIR is not None and env_bool("CACHE_ON_EMBEDDED_BROKER", True):
    # The embedded broker is a Valkey server: its database 1 holds the cache (a table cost every request a
    # COUNT(*) of the cache per write, and round trips to a database busy with turns).
    CACHES = {
        "default": {
            "BACKEND": "core.cache.EmbeddedValkeyCache",
            "LOCATION": f"unix://{embedded_broker_socket(EMBEDDED_BROKER_DIR)}?db=1",
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "app_cache",
            "OPTIONS": {"MAX_ENTRIES": 50000},
        }
    }
BROKER_DIR = Path(env_str("CELERY_FILESYSTEM_BROKER_DIR", str(DATA_DIR / "broker")) or DATA_DIR / "broker")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL == "filesystem://":
    for sub in ("out", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "out"),
        "data_folder_out": str(BROKER_DIR / "out"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
    }
if CELERY_BROKER_URL.startswith(("redis://", "rediss://", "redis+socket://")):
    # A task taken by a worker that then dies is redelivered after this many seconds (late acks).
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600, minimum=10)}
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "agents") or "agents"
# Beat's tasks and turn recovery go on a queue of their own, so that recovery, alerts, heartbeats and the outbox
# sweeps never wait behind a backlog of memory writes and summaries. A worker takes both queues in turn (without
# -Q it consumes both: CELERY_TASK_QUEUES); one started with -Q must name both.
CELERY_OPS_QUEUE = f"{CELERY_TASK_DEFAULT_QUEUE}-ops"
# Turns accepted by the web doors, run by a turn worker: a thread pool that waits on models (`make run` starts
# one: celery worker -Q <queue>-turns -P threads). A worker started without -Q takes this queue too.
CELERY_TURNS_QUEUE = f"{CELERY_TASK_DEFAULT_QUEUE}-turns"
CELERY_TASK_QUEUES = (Queue(CELERY_OPS_QUEUE), Queue(CELERY_TURNS_QUEUE), Queue(CELERY_TASK_DEFAULT_QUEUE))
OPS_TASKS = task_names.OPERATIONS
# A task is routed by its name, and by the name it had before (core.task_names: a retry of a message queued by an
# older deployment is sent under that name).
CELERY_TASK_ROUTES: dict[str, dict[str, str]] = {
    alias: {"queue": CELERY_OPS_QUEUE} for name in OPS_TASKS for alias in task_names.with_former(name)
}
CELERY_TASK_ROUTES.update(
    {alias: {"queue": CELERY_TURNS_QUEUE} for alias in task_names.with_former(task_names.RUN_TURN)}
)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# The background worker's threads under make run (memory writes, the outbox sweep, beat's tasks): each task waits
# on the embedding service and the database, so threads of one process carry them (bench/broker.py).
CELERY_WORKER_THREADS = env_int("CELERY_WORKER_THREADS", 8, minimum=1)
# make run starts that background worker this much nicer than the rest (0: as the rest): its work can wait a
# moment, the replies people wait on cannot (bench/concurrency.py).
BACKGROUND_NICE = env_int("BACKGROUND_NICE", 10, minimum=0, maximum=19)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 120, minimum=1)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 180, minimum=1)
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# At most 30: /healthz takes a worker whose newest heartbeat is older than four of these for down (web.health).
# /healthz and /readyz answer within this many seconds, whatever the database and the broker do (web/health.py).
HEALTH_CHECK_TIMEOUT = env_float("HEALTH_CHECK_TIMEOUT", 1.5, minimum=0.1, maximum=30)
# Under ASGI a thread of each web process runs those checks this often while probes come, and a probe is answered
# from a reading at most this plus HEALTH_CHECK_TIMEOUT old (0: the checks run for each probe). web/health.py HealthMonitor.
HEALTH_REFRESH_SECONDS = env_float("HEALTH_REFRESH_SECONDS", 0.25, minimum=0, maximum=10)
WORKER_HEARTBEAT_SECONDS = env_int("WORKER_HEARTBEAT_SECONDS", 15, minimum=1, maximum=30)
# How often the sweep looks for turns that nobody runs. With TURN_LEASE_SECONDS it bounds how long a turn whose
# runner died waits: the lease runs out at most TURN_LEASE_SECONDS after the runner's last heartbeat, and the next
# sweep sends the turn to recovery (docs/reliability.md).
TURN_SWEEP_SECONDS = env_int("TURN_SWEEP_SECONDS", 10, minimum=1, maximum=300)
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "worker-heartbeat": {"task": task_names.RECORD_WORKER_HEARTBEAT, "schedule": float(WORKER_HEARTBEAT_SECONDS)},
    "alerts-evaluate": {"task": task_names.EVALUATE_ALERTS, "schedule": 60.0},
    # Retention of the checkpoint log (sessions.services.checkpoints_prune), once a day.
    "checkpoints-prune": {"task": task_names.PRUNE_CHECKPOINTS, "schedule": 24 * 3600.0},
    # The outbox sweeps: background work whose enqueue was lost while the broker was down is sent again.
    "memory-writes-requeue": {"task": task_names.REQUEUE_LOST_MEMORY_WRITES, "schedule": 120.0},
    "summaries-requeue": {"task": task_names.REQUEUE_LOST_SUMMARIES, "schedule": 120.0},
    # Turns that nobody runs (their lease free or run out: the runner died; or handed to a turn worker whose task
    # was lost) are finished from their checkpoint (orchestrator.runtime.stuck_turns_enqueue); a new message on the
    # session does it sooner. A sweep not started within its period is dropped (the next one comes).
    "turns-recover": {
        "task": task_names.RECOVER_STUCK_TURNS,
        "schedule": float(TURN_SWEEP_SECONDS),
        "options": {"expires": float(TURN_SWEEP_SECONDS)},
    },
    # Per-user HNSW indexes for histories past MEMORY_EXACT_SEARCH_MAX (memory.services.user_indexes_sync).
    "memory-user-indexes": {"task": task_names.SYNC_USER_INDEXES, "schedule": 24 * 3600.0},
}
# Checkpoints kept per session by the pruning policy (state changes are always kept).
CHECKPOINT_KEEP_LAST = env_int("CHECKPOINT_KEEP_LAST", 50, minimum=1)
# How a staff reply is signed to the user when the staff member has no full name (never their username).
STAFF_REPLY_NAME = (env_str("STAFF_REPLY_NAME", "Support") or "Support").strip()[:80] or "Support"
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
# Progressive summaries (sessions.summaries): ask this many turns before turns leave the window, in
# batches of at least this many turns, so the next call normally finds the summary ready.
SUMMARY_LEAD_TURNS = env_int("SUMMARY_LEAD_TURNS", 2, minimum=0, maximum=20)
SUMMARY_BATCH_TURNS = env_int("SUMMARY_BATCH_TURNS", 2, minimum=1, maximum=50)

# --- REST framework ----------------------------------------------------------------------
REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header makes an anonymous request a 401 rather than a 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "core.pagination.StandardPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_PARSER_CLASSES": ["core.parsers.SizeLimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "EXCEPTION_HANDLER": "core.api_errors.api_exception_handler",
    "NUM_PROXIES": NUM_PROXIES,
    # Every API endpoint needs a signed-in user (a 401 comes before any rate), so the rates are per user.
    "DEFAULT_THROTTLE_CLASSES": [
        "rest_framework.throttling.UserRateThrottle",
        "rest_framework.throttling.ScopedRateThrottle",
    ],
    # Posting a message runs the model, so it has its own, tighter scope.
    "DEFAULT_THROTTLE_RATES": {
        "user": env_rate("API_THROTTLE_USER", "1200/min"),
        "messages": env_rate("API_THROTTLE_MESSAGES", "30/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent runtime API",
    "DESCRIPTION": "Agents whose context, memory and state do not crash.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema is a page like any other: signed-in users only (the docs page redirects to the login).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Swagger UI and ReDoc assets come from the drf-spectacular-sidecar package: nothing loads from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "SessionStatusEnum": "sessions.models.ChatSession.Status",
        "TurnStatusEnum": "sessions.models.Turn.Status",
    },
    # drf-spectacular's enum hook, then the error answers of every operation (core/api_schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "core.api_schema.document_errors",
    ],
}

# --- LLM and embeddings (used by the agents and memory apps) ----------------------------
# The turn loop (orchestrator/runtime.py).
# Longest chat message accepted (characters); longer ones are refused with 413 before anything is saved.
# Shorter ones that exceed the prompt's message budget are cut with a visible marker (sessions/context.py).
MAX_MESSAGE_CHARS = env_int("MAX_MESSAGE_CHARS", 32000, minimum=100)
# Where an accepted turn runs. "worker": on a turn worker (the web request only saves the message and reads the
# turn's events from the run channel: core/events.py); "inline": in the request itself (no worker needed; each
# turn holds a web thread while the model answers). "worker" needs a Redis-protocol server for the channel (the
# embedded Valkey, or REDIS_URL); without one, turns run inline.
TURN_RUNNER = env_str("TURN_RUNNER", "worker") or "worker"
if TURN_RUNNER not in ("worker", "inline"):
    raise ImproperlyConfigured(f"TURN_RUNNER must be 'worker' or 'inline', not {TURN_RUNNER!r}.")
# Back-pressure: with this many turns waiting for a turn worker, a new message is refused with 503 and
# Retry-After (nothing saved) instead of waiting behind them. 0: no limit.
TURN_QUEUE_LIMIT = env_int("TURN_QUEUE_LIMIT", 1000, minimum=0)
# How long a turn may wait in the queue for a worker before its lease runs out and the sweep takes it over.
TURN_QUEUE_SECONDS = env_int("TURN_QUEUE_SECONDS", 300, minimum=10)
# A run's events stay readable (a client that comes back, a second tab) this long after its last one.
RUN_EVENTS_KEEP_SECONDS = env_int("RUN_EVENTS_KEEP_SECONDS", 3600, minimum=60)
RUN_EVENTS_URL = env_str("RUN_EVENTS_URL")
# The run streams' names start with this (the queue by default), so deployments sharing a Redis stay apart.
RUN_EVENTS_PREFIX = env_str("RUN_EVENTS_PREFIX")
TURN_LOCK_WAIT_SECONDS = env_float("TURN_LOCK_WAIT_SECONDS", 30.0, minimum=0.0)
# A turn's runner holds the session's lease (sessions/locks.py) for this long past its last heartbeat (every
# third of it): a runner that dies leaves its turn to the next message or the sweep after at most this long.
TURN_LEASE_SECONDS = env_float("TURN_LEASE_SECONDS", 30.0, minimum=1.0)
# A turn younger than this is never swept, even with its lease gone (a margin for a turn being accepted).
STUCK_TURN_SECONDS = env_int("STUCK_TURN_SECONDS", 10, minimum=0)
# An agent with tools decides inside its reply's own streamed call (its tools and the hand-off offered as functions;
# plain text is the answer): one model call for a turn that needs no tool, the first word at the model's speed.
# Off, or on an endpoint seen refusing tools: a structured routing call first, then the reply (two calls).
TURN_DECISION_IN_REPLY = env_bool("TURN_DECISION_IN_REPLY", True)
# A lease handed to a turn worker (with the turn's task) and not claimed by one for this long, while no task for it
# waits in the turns queue, belonged to a task that was lost: the sweep lets it go and resumes the turn.
TURN_CLAIM_SECONDS = env_float("TURN_CLAIM_SECONDS", 10.0, minimum=1.0)
# While a turn's stream waits (a turn queued, a turn being resumed), it sends an SSE comment this often, so that no
# proxy or client takes a quiet stream for a dead one.
RUN_EVENTS_KEEPALIVE_SECONDS = env_float("RUN_EVENTS_KEEPALIVE_SECONDS", 10.0, minimum=0.5, maximum=60.0)

LLM_BASE_URL = env_str("LLM_BASE_URL")
LLM_API_KEY = env_str("LLM_API_KEY")
LLM_MODEL = env_str("LLM_MODEL")
LLM_CONNECT_TIMEOUT = env_float("LLM_CONNECT_TIMEOUT", 5.0, minimum=0.1)
LLM_READ_TIMEOUT = env_float("LLM_READ_TIMEOUT", 60.0, minimum=0.1)
LLM_MAX_RETRIES = env_int("LLM_MAX_RETRIES", 3, minimum=0, maximum=10)
# Backoff between retries of 429/5xx/timeouts: base * 2**attempt seconds (capped, with jitter). A server's
# Retry-After is honoured, but one longer than LLM_MAX_RETRY_AFTER fails the call instead of holding a thread.
LLM_RETRY_BASE_DELAY = env_float("LLM_RETRY_BASE_DELAY", 0.5, minimum=0.0)
LLM_RETRY_MAX_DELAY = env_float("LLM_RETRY_MAX_DELAY", 8.0, minimum=0.0)
LLM_MAX_RETRY_AFTER = env_float("LLM_MAX_RETRY_AFTER", 30.0, minimum=0.0)
LLM_SUPPORTS_JSON_SCHEMA = env_bool("LLM_SUPPORTS_JSON_SCHEMA", True)
# How structured outputs are asked for: "auto" (try json_schema, then llama.cpp's json_object with a schema,
# then plain JSON mode, and remember what the endpoint took), or one of those pinned (docs/models.md).
LLM_STRUCTURED_OUTPUT = env_str("LLM_STRUCTURED_OUTPUT", "auto") or "auto"
if LLM_STRUCTURED_OUTPUT not in ("auto", "json_schema", "json_object_schema", "json_object"):
    raise ImproperlyConfigured(
        "LLM_STRUCTURED_OUTPUT must be auto, json_schema, json_object_schema or json_object "
        f"(got {LLM_STRUCTURED_OUTPUT!r})"
    )
# The default endpoint's context window, when known: a ceiling on every agent's own context_window.
LLM_CONTEXT_WINDOW = env_int("LLM_CONTEXT_WINDOW", 0, minimum=0) or None
if LLM_CONTEXT_WINDOW is not None and LLM_CONTEXT_WINDOW < 512:
    raise ImproperlyConfigured(f"LLM_CONTEXT_WINDOW must be at least 512 tokens (got {LLM_CONTEXT_WINDOW})")
# Where the admin's "Connect a model" form looks for a local Ollama to offer.
LLM_OLLAMA_URL = env_str("LLM_OLLAMA_URL", "http://127.0.0.1:11434") or "http://127.0.0.1:11434"
# A cheaper model on the same endpoint for relevance filtering, fact extraction and summaries ("" = LLM_MODEL).
LLM_CHEAP_MODEL = env_str("LLM_CHEAP_MODEL", "") or ""
# Named endpoint profiles that agents refer to by name (Agent.endpoint). API keys are never stored in
# the database: a profile names the environment variable that holds its key. "default" comes from the
# LLM_* variables above; more can be added as JSON in LLM_PROFILES_JSON, e.g.
# {"local": {"base_url": "http://127.0.0.1:11434/v1", "model": "llama3.2", "api_key_env": "OLLAMA_KEY"}}.
LLM_PROFILES: dict[str, dict[str, object]] = {}
if LLM_BASE_URL or LLM_MODEL:
    LLM_PROFILES["default"] = {
        "base_url": LLM_BASE_URL,
        "model": LLM_MODEL or "",
        "api_key_env": "LLM_API_KEY",
        "connect_timeout": LLM_CONNECT_TIMEOUT,
        "read_timeout": LLM_READ_TIMEOUT,
        "max_retries": LLM_MAX_RETRIES,
        "supports_json_schema": LLM_SUPPORTS_JSON_SCHEMA,
        "structured_output": LLM_STRUCTURED_OUTPUT,
        "context_window": LLM_CONTEXT_WINDOW,
        "cheap_model": LLM_CHEAP_MODEL,
    }
_profiles_json = env_str("LLM_PROFILES_JSON")
if _profiles_json:
    import json as _json

    try:
        _extra = _json.loads(_profiles_json)
    except ValueError as exc:
        raise ImproperlyConfigured(f"LLM_PROFILES_JSON is not valid JSON: {exc}") from exc
    if not isinstance(_extra, dict) or not all(isinstance(v, dict) for v in _extra.values()):
        raise ImproperlyConfigured("LLM_PROFILES_JSON must be an object of objects")
    LLM_PROFILES.update(_extra)
EMBEDDING_BACKEND = env_str("EMBEDDING_BACKEND", "sentence-transformers") or "sentence-transformers"
EMBEDDING_DIMENSIONS = env_int("EMBEDDING_DIMENSIONS", 384, minimum=8)
# OpenAI-compatible embeddings endpoint (EMBEDDING_BACKEND=openai); the key is read from the env var named here.
EMBEDDING_BASE_URL = env_str("EMBEDDING_BASE_URL", "") or ""
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL", "") or ""
EMBEDDING_API_KEY_ENV = env_str("EMBEDDING_API_KEY_ENV", "EMBEDDING_API_KEY") or "EMBEDDING_API_KEY"
EMBEDDING_TIMEOUT = env_float("EMBEDDING_TIMEOUT", 30.0, minimum=0.1)
# How long a turn (or a search) waits for its query's vector before it searches by words and profile facts alone,
# and says so in its retrieval report: a stalled embedder slows a turn by this much, and never fails it.
EMBEDDING_QUERY_WAIT = env_float("EMBEDDING_QUERY_WAIT", 5.0, minimum=0.1, maximum=120.0)
# The local model served once per machine (memory/embedding_service.py; make run starts it): when set, the
# sentence-transformers backend asks the service on this Unix socket instead of loading the model (and torch)
# in every process. How long a caller waits for a service that does not answer (restarting) before failing.
EMBEDDING_SERVICE_SOCKET = env_str("EMBEDDING_SERVICE_SOCKET", "") or ""
EMBEDDING_SERVICE_WAIT = env_float("EMBEDDING_SERVICE_WAIT", 20.0, minimum=0.0)
# Memory retrieval: candidates per search arm, HNSW search breadth, the relevance model's time budget.
MEMORY_CANDIDATES = env_int("MEMORY_CANDIDATES", 40, minimum=1, maximum=1000)
MEMORY_VECTOR_CANDIDATES = env_int("MEMORY_VECTOR_CANDIDATES", 40, minimum=1, maximum=1000)
# At most this many from an HNSW index (histories past MEMORY_EXACT_SEARCH_MAX): each extra row of a filtered
# graph walk costs steps, where an exact search costs the same for any number (bench/memory_scale.py).
MEMORY_HNSW_CANDIDATES = env_int("MEMORY_HNSW_CANDIDATES", 24, minimum=1, maximum=1000)
MEMORY_HNSW_EF_SEARCH = env_int("MEMORY_HNSW_EF_SEARCH", 40, minimum=10, maximum=1000)
# Users with fewer memories than this get an exact vector search (their rows via the user index, every
# distance computed); bigger histories get an HNSW index of their own (the daily sync_user_indexes task,
# or `manage.py memory_user_indexes`), and the shared HNSW index until then. bench/memory_scale.py.
MEMORY_EXACT_SEARCH_MAX = env_int("MEMORY_EXACT_SEARCH_MAX", 10_000, minimum=0, maximum=10_000_000)
MEMORY_RECENT_ACTIONS = env_int("MEMORY_RECENT_ACTIONS", 3, minimum=0, maximum=50)
MEMORY_MAX_KEPT = env_int("MEMORY_MAX_KEPT", 25, minimum=1, maximum=1000)
MEMORY_RELEVANCE_TIMEOUT = env_float("MEMORY_RELEVANCE_TIMEOUT", 4.0, minimum=0.1)
# How a configured cheap model judges the best candidates in one call: "rerank" orders the ones that help
# (listwise; what it leaves out is judged by the calibrated filter, below its picks), "scores" scores each.
MEMORY_MODEL_JUDGE = env_str("MEMORY_MODEL_JUDGE", "rerank")
if MEMORY_MODEL_JUDGE not in ("rerank", "scores"):
    raise ImproperlyConfigured(f"MEMORY_MODEL_JUDGE must be 'rerank' or 'scores', not {MEMORY_MODEL_JUDGE!r}")
# A new fact that contradicts a current one is applied at or above this confidence, else queued for review.
MEMORY_CONTRADICTION_CONFIDENCE = env_float("MEMORY_CONTRADICTION_CONFIDENCE", 0.75, minimum=0.0, maximum=1.0)

# --- Observability: JSON logs, /metrics, alerts, traces (observability app) ----------------
LOG_FORMAT = env_str("LOG_FORMAT", "json") or "json"
if LOG_FORMAT not in {"json", "plain"}:
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r} must be json or plain")
# --- Workflows and tools (agents/workflows, agents/tools; docs/extending.md) ------------------------
# The workflows agents may follow, besides the built-in free chat: dotted paths to a Workflow; installed
# packages add theirs through the entry-point group ``agents_runtime.workflows``. AGENT_EXTRA_WORKFLOWS adds
# paths without a settings module of your own.
AGENT_WORKFLOWS = [
    "examples.booking.workflow.FLIGHT_BOOKING",
    *env_list("AGENT_EXTRA_WORKFLOWS", []),
]
# The tools agents may use: dotted paths to a Tool (``@tool`` or ``Tool(...)``) or a list of them; installed
# packages add theirs through the entry-point group ``agents_runtime.tools`` (docs/extending.md).
# AGENT_EXTRA_TOOLS adds paths to these without a settings module of your own.
AGENT_TOOLS = [
    "memory.tools.SEARCH_MEMORY",
    "examples.booking.tools.SEARCH_FLIGHTS",
    "examples.booking.tools.BOOK_FLIGHT",
    "agents.tools.web.HTTP_GET",
    *env_list("AGENT_EXTRA_TOOLS", []),
]
# The agents created when missing (``manage.py runstack``), besides the built-in assistant: dotted paths to a dict
# of Agent fields with a slug, a list of them, or a callable returning either; a seed whose workflow is not
# plugged in is skipped. Installed packages add theirs through the entry-point group ``agents_runtime.agent_seeds``.
AGENT_SEEDS = [
    "examples.booking.seed.flight_booking_agent",
]
# What packages keep about a person, erased with the rest (people.erasure.person_erase): dotted paths to callables
# ``(user) -> dict[str, int]`` (counts by name). Installed packages add theirs through the entry-point group
# ``agents_runtime.person_erasers``.
PERSON_ERASERS = [
    "examples.booking.erasure.bookings_erase",
]
# Seconds one attempt of a tool may run before it is abandoned (the model sees "TOOL_ERROR: … timed out").
TOOLS_DEFAULT_TIMEOUT = env_float("TOOLS_DEFAULT_TIMEOUT", 10.0, minimum=0.05, maximum=600.0)
# Retryable failures (timeouts, connection errors, 5xx) get up to this many attempts; 4xx never retry.
TOOLS_MAX_ATTEMPTS = env_int("TOOLS_MAX_ATTEMPTS", 3, minimum=1, maximum=10)
TOOLS_RETRY_BASE_DELAY = env_float("TOOLS_RETRY_BASE_DELAY", 0.5, minimum=0.0, maximum=60.0)
TOOLS_RETRY_MAX_DELAY = env_float("TOOLS_RETRY_MAX_DELAY", 8.0, minimum=0.0, maximum=300.0)
# http_get: hosts it may fetch ("example.com", ".example.com" for subdomains, "*" for any public host).
# Private, loopback and link-local addresses are refused unless their host is listed by name.
TOOLS_HTTP_ALLOWED_HOSTS = env_list("TOOLS_HTTP_ALLOWED_HOSTS", [])
TOOLS_HTTP_MAX_BYTES = env_int("TOOLS_HTTP_MAX_BYTES", 65536, minimum=256, maximum=10 * 1024 * 1024)
TOOLS_HTTP_TIMEOUT = env_float("TOOLS_HTTP_TIMEOUT", 8.0, minimum=0.05, maximum=600.0)
# Injected tool failures for tests and benchmarks, e.g. "search_flights:http_503:2,book_flight:timeout:1"
# (kinds: timeout, http_503, http_400, malformed_payload, connection_error; count or "*"). Empty in production.
TOOLS_FAULTS = env_str("TOOLS_FAULTS", "") or ""

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Both formatters add the bound session/turn ids (observability.logging.bind_log_context).
    "formatters": {
        "json": {"()": "observability.logging.JsonFormatter"},
        "plain": {"()": "observability.logging.PlainFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    # httpx logs every request at INFO: the health monitor's GET /ready to the embedding service (4-8 a second while
    # a page is open) and each model call were 80 % of make run's log. Calls are recorded (LLMCall) and traced.
    "loggers": {"httpx": {"level": env_choice("HTTPX_LOG_LEVEL", "WARNING", ("DEBUG", "INFO", "WARNING", "ERROR"))}},
    "root": {
        "handlers": ["console"],
        "level": env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL")),
    },
}
# /metrics: a bearer token, or (METRICS_ALLOW_INTERNAL) any loopback/private client. Neither: loopback only.
METRICS_TOKEN = env_str("METRICS_TOKEN", "") or ""
METRICS_ALLOW_INTERNAL = env_bool("METRICS_ALLOW_INTERNAL", False)
# Alert rules live in the database (admin); these are the defaults the seed migration and new rules use.
ALERT_WEBHOOK_URL = env_str("ALERT_WEBHOOK_URL", "") or ""
ALERT_WEBHOOK_TIMEOUT = env_float("ALERT_WEBHOOK_TIMEOUT", 5.0, minimum=0.1)
# Too few calls in a window say nothing: a rate alert needs at least this many samples.
ALERT_MIN_SAMPLES = env_int("ALERT_MIN_SAMPLES", 10, minimum=1)
# Traces: OTLP/HTTP to this collector URL (e.g. http://127.0.0.1:4318); unset = tracing off.
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "") or ""
OTEL_EXPORTER_OTLP_TIMEOUT = env_float("OTEL_EXPORTER_OTLP_TIMEOUT", 5.0, minimum=0.1)
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "agent-runtime") or "agent-runtime"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Static files are served by WhiteNoise straight from the app folders: no collectstatic step to forget.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(exist_ok=True)
