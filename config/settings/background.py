"""Background work: the broker, the cache, Celery's queues and routes, health, beat's schedule, retention."""

from __future__ import annotations

from pathlib import Path

from kombu import Queue

from config.settings.site import DATA_DIR
from core import task_names
from core.embedded_broker import broker_url as embedded_broker_url
from core.embedded_broker import socket_path as embedded_broker_socket
from core.env import env_bool, env_float, env_int, env_str

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
