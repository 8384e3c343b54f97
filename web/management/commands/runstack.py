"""Start everything the app needs on this machine, keep it running, and stop it all on Ctrl-C.

The first README command (``make run``) ends here: the embedded PostgreSQL (when
``DATABASE_URL`` is unset), migrations, a first staff user, a web server (gunicorn with uvicorn workers: Django
and MCP on one port), a Celery worker with its beat scheduler and a turn worker, all in the foreground. A child that dies is restarted with backoff
(``core.supervisor``), and says so; only Ctrl-C (or SIGTERM) stops everything.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db import connections

from agents.services import default_agents_ensure
from core import embedded_broker, embedded_db
from core.env import env_int
from core.supervisor import Child, Plan

CREDENTIALS_FILE = "first-staff-user.txt"


def ensure_first_staff_user(data_dir: Path) -> tuple[str, str | None]:
    """Create a staff superuser if there is none. Returns (username, password or None if it existed)."""
    User = get_user_model()
    existing = User.objects.filter(is_staff=True).order_by("pk").first()
    if existing is not None:
        return existing.get_username(), None
    username = os.environ.get("FIRST_STAFF_USERNAME", "admin")
    password = secrets.token_urlsafe(12)
    User.objects.create_superuser(username=username, email="", password=password)
    path = data_dir / CREDENTIALS_FILE
    path.write_text(f"username: {username}\npassword: {password}\n")
    path.chmod(0o600)
    return username, password


def _embedding_service_children(data_dir: Path) -> tuple[dict[str, str], list[Child]]:
    """The embedding model once for the machine (memory/embedding_service.py), and what the other processes are
    told to find it: they ask it over a Unix socket and never load torch (~550 MB each otherwise). None when
    the backend is not the local model, or when the operator runs a service of their own."""
    if settings.EMBEDDING_BACKEND != "sentence-transformers" or settings.EMBEDDING_SERVICE_SOCKET:
        return {}, []
    socket_path = data_dir / "embedder.sock"
    manage = str(settings.BASE_DIR / "manage.py")
    service = Child("embedding service", [sys.executable, manage, "serve_embeddings", "--socket", str(socket_path)])
    return {"EMBEDDING_SERVICE_SOCKET": str(socket_path)}, [service]


def _web_child(bind: str, workers: int, shared_model: dict[str, str]) -> Child:
    """The web server: ASGI (config/asgi.py), so an open event stream holds no thread; MCP answers at /mcp/ on the
    same port."""
    # Each process shares a few database connections among its threads (DATABASE_POOL_MAX_SIZE).
    # (≤ 30 in all under make run with 2 web processes: a web process's requests are short, a turn worker's
    # threads many.)
    pooled = {
        "DATABASE_POOL_MAX_SIZE": os.environ.get("DATABASE_POOL_MAX_SIZE", "6"),
        "DATABASE_APPLICATION_NAME": "agents-web",
        **shared_model,
    }
    return Child(
        "web server",
        [
            sys.executable,
            "-m",
            "gunicorn",
            "config.asgi:application",
            "--config",
            "python:config.gunicorn_conf",
            "--bind",
            bind,
            "--worker-class",
            "uvicorn_worker.UvicornWorker",
            "--workers",
            str(workers),
            "--timeout",
            "300",
            "--graceful-timeout",
            "10",
            # Its control socket in this app's data folder, not ~/.gunicorn/ (shared by every copy on a machine).
            "--control-socket",
            str(settings.DATA_DIR / "gunicorn.ctl"),
        ],
        env=pooled,
    )


CELERY = [sys.executable, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO"]


def _worker_children(turn_workers: int, turn_threads: int, shared_model: dict[str, str]) -> list[Child]:
    """The Celery worker (with beat) for the default and ops queues, then the turn workers."""
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    worker = Child(
        "Celery worker",
        [
            *CELERY,
            "--beat-thread",  # beat on a thread of this worker (config.celery.ThreadedBeat), not a second process
            "-Q",
            f"{queue},{settings.CELERY_OPS_QUEUE}",
            # Threads, not processes: a memory write waits on the embedding service and the database, and one
            # process holds the app once (~150 MB) rather than once per pool process.
            "--pool",
            "threads",
            "--concurrency",
            str(settings.CELERY_WORKER_THREADS),
            "--schedule",
            settings.CELERY_BEAT_SCHEDULE_FILENAME,
        ],
        env={
            "DATABASE_POOL_MAX_SIZE": os.environ.get("DATABASE_POOL_MAX_SIZE", "4"),
            "DATABASE_APPLICATION_NAME": "agents-background",
            **shared_model,
        },
        # Memory writes, summaries and sweeps can wait a moment; people waiting on a reply cannot. Niced, the
        # background worker takes the CPU the web processes and the turn worker leave (BACKGROUND_NICE).
        nice=settings.BACKGROUND_NICE,
    )
    return [worker, *_turn_workers(turn_workers, turn_threads, shared_model)]


def _turn_workers(turn_workers: int, turn_threads: int, shared_model: dict[str, str]) -> list[Child]:
    """Turns: threads that wait on models (each gives its connection back before a model call), in
    TURN_WORKER_PROCESSES processes: each takes turns from the queue and runs them on one core."""
    pooled_turns = {
        "DATABASE_POOL_MAX_SIZE": os.environ.get("DATABASE_POOL_MAX_SIZE", "8"),
        "DATABASE_APPLICATION_NAME": "agents-turns",
        **shared_model,
    }
    processes = max(1, int(turn_workers))
    threads = max(1, int(turn_threads) // processes)
    return [
        Child(
            "turn worker" if processes == 1 else f"turn worker {number}",
            [
                *CELERY,
                "-Q",
                settings.CELERY_TURNS_QUEUE,
                "--pool",
                "threads",
                "--concurrency",
                str(threads),
                "--hostname",
                f"turns{number}@%h",
                "--without-gossip",
                "--without-mingle",
            ],
            env=pooled_turns,
        )
        for number in range(1, processes + 1)
    ]


class Command(BaseCommand):
    help = "Run the web server and a Celery worker (plus the embedded database when DATABASE_URL is unset)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        # env_int: a value that is not a number stops here with ImproperlyConfigured naming the variable.
        parser.add_argument("--port", type=int, default=env_int("PORT", 8000, minimum=1, maximum=65535))
        parser.add_argument("--web-workers", type=int, default=env_int("WEB_WORKERS", 2, minimum=1))
        parser.add_argument("--no-worker", action="store_true", help="Do not start the Celery workers.")
        parser.add_argument(
            "--turn-threads",
            type=int,
            default=env_int("TURN_WORKER_THREADS", 256, minimum=1),
            help="Turns the turn workers run at once, in all (threads waiting on models).",
        )
        parser.add_argument(
            "--turn-workers",
            type=int,
            default=env_int("TURN_WORKER_PROCESSES", 1, minimum=1),
            help="Turn worker processes (the threads are shared out among them).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        data_dir: Path = settings.DATA_DIR
        data_dir.mkdir(parents=True, exist_ok=True)
        embedded_broker.ensure_configured()
        self.stdout.write("Applying migrations…")
        call_command("migrate", interactive=False, verbosity=0)
        username, password = ensure_first_staff_user(data_dir)

        default_agents_ensure()

        bind = f"{options['host']}:{options['port']}"
        shared_model, children = _embedding_service_children(data_dir)
        children.append(_web_child(bind, options["web_workers"], shared_model))
        if not options["no_worker"]:
            children += _worker_children(options["turn_workers"], options["turn_threads"], shared_model)
        url = f"http://{bind}/"
        self._say_started(url, data_dir, username, password)
        plan = Plan(
            children=[{"name": c.name, "argv": c.argv, "env": c.env or {}, "nice": c.nice} for c in children],
            url=url,
            broker_folder=str(settings.EMBEDDED_BROKER_DIR) if settings.EMBEDDED_BROKER_DIR is not None else None,
            stop_broker=settings.EMBEDDED_BROKER_DIR is not None and embedded_broker.started_by_this_process,
            pg_folder=str(data_dir / "pg")
            if not settings.DATABASE_URL and embedded_db.started_by_this_process
            else None,
            pg_left_running=not settings.DATABASE_URL and not embedded_db.started_by_this_process,
        )
        # The rest of the app's life needs no Django: this process becomes a small supervisor (the same process
        # id; core/supervisor.py), holding ~20 MB instead of ~150 MB while it watches the children.
        connections.close_all()
        sys.stdout.flush()
        sys.stderr.flush()
        start = (
            f"import sys; sys.path.insert(0, {str(settings.BASE_DIR)!r}); "
            "from core.supervisor import Plan, supervise; supervise(Plan.from_json(sys.argv[1]))"
        )
        os.execv(sys.executable, [sys.executable, "-c", start, plan.to_json()])

    def _say_started(self, url: str, data_dir: Path, username: str, password: str | None) -> None:
        """Where the app is, what it runs on, and how to sign in."""
        db = "embedded PostgreSQL in " + str(data_dir / "pg") if not settings.DATABASE_URL else "DATABASE_URL"
        broker = str(settings.CELERY_BROKER_URL).split("://", 1)[0]
        if settings.EMBEDDED_BROKER_DIR is not None:
            broker = f"embedded Valkey in {settings.EMBEDDED_BROKER_DIR}"
        self.stdout.write(self.style.SUCCESS(f"\nThe app is starting at {url}"))
        self.stdout.write(f"  database: {db}\n  broker:   {broker}\n  health:   {url}healthz\n  admin:    {url}admin/")
        self.stdout.write(f"  MCP:      {url}mcp/ (Authorization: Bearer <API token>)")
        if password:
            self.stdout.write(self.style.WARNING(f"  sign in as {username!r} with password {password!r}"))
            self.stdout.write(f"  (kept in {data_dir / CREDENTIALS_FILE}; change it in the admin)")
        else:
            self.stdout.write(f"  sign in as {username!r} (first run's password in {data_dir / CREDENTIALS_FILE})")
        self.stdout.write("Press Ctrl-C to stop everything.\n")
