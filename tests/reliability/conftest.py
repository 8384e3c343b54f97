"""Fixtures of the reliability suite: agents, a model served by the fake OpenAI server, and real
processes (a gunicorn web server, a Celery worker) that tests start, kill and restart themselves."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rest_framework.authtoken.models import Token

from agents.models import Agent
from core.db import database_url, redis_reachable
from tests.world import make_agent

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def booking_agent(db: Any) -> Agent:
    return make_agent(
        name="Booker",
        slug="booker",
        system_prompt="You book flights.",
        workflow="flight_booking",
        tools=["book_flight"],
    )


@pytest.fixture
def remote_model(settings: Any, fake_openai: Any) -> Any:
    """Every agent's default endpoint is the fake OpenAI server (real HTTP, fast retries, short timeouts)."""
    settings.LLM_PROFILES = {"default": fake_openai.profile(read_timeout=1.0, max_retries=2)}
    return fake_openai


def api_token(user: Any) -> str:
    token, _ = Token.objects.get_or_create(user=user)
    return str(token.key)


class ServerProcess:
    """``gunicorn config.wsgi`` (or ``config.asgi``) on a free port, in its own process group, against the test database.

    ``kill()`` is SIGKILL to the group (master and workers: a machine losing the web process);
    ``start()`` again brings up a new one on the same port.
    """

    def __init__(
        self,
        *,
        env: dict[str, str],
        log_dir: Path,
        workers: int = 1,
        threads: int = 4,
        as_make_run: bool = False,
        asgi: bool = False,
    ) -> None:
        self.port = free_port()
        # ``as_make_run``: gunicorn's hooks as ``make run`` sets them (config/gunicorn_conf.py: each worker
        # sets up its registries and starts its warm-up before it serves).
        self.extra_args = ["--config", "python:config.gunicorn_conf"] if as_make_run else []
        self.env = env
        self.log_dir = log_dir
        self.workers = workers
        self.threads = threads
        # ``asgi``: config.asgi under uvicorn's workers, as make run serves it (MCP at /mcp/ on the same port).
        self.asgi = asgi
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        self.starts += 1
        log = self.log_dir / f"server-{self.starts}.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "config.asgi:application" if self.asgi else "config.wsgi:application",
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--worker-class",
                    "uvicorn_worker.UvicornWorker" if self.asgi else "gthread",
                    "--workers",
                    str(self.workers),
                    *([] if self.asgi else ["--threads", str(self.threads)]),
                    "--timeout",
                    "120",
                    "--graceful-timeout",
                    "2",
                    "--no-control-socket",  # several servers at once; none shares ~/.gunicorn/gunicorn.ctl
                    *self.extra_args,
                ],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"gunicorn did not start:\n{self.log_text()}")
            try:
                httpx.get(f"{self.url}/healthz", timeout=5)
                return self
            except httpx.TransportError:
                time.sleep(0.2)

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("server-*.log")))

    def kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


def server_env(tmp_path: Path, *, llm_profile: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment of a web server subprocess: the test database, its own idle broker, no throttling."""
    broker = tmp_path / "broker"
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "EMBEDDING_BACKEND": "hashing",
            "LOG_FORMAT": "plain",
            "LOG_LEVEL": "WARNING",
            # Its enqueued tasks land in a folder nobody consumes: never in a developer's broker.
            "CELERY_BROKER_URL": "filesystem://",
            "CELERY_FILESYSTEM_BROKER_DIR": str(broker),
            "API_THROTTLE_MESSAGES": "100000/min",
            "API_THROTTLE_USER": "100000/min",
            "TURN_LOCK_WAIT_SECONDS": "120",
        }
    )
    env.pop("REDIS_URL", None)
    if llm_profile is not None:
        env["LLM_PROFILES_JSON"] = json.dumps({"default": llm_profile})
    return env


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[Any]:
    """A factory: ``web_server(llm_profile=..., workers=..., threads=..., as_make_run=..., asgi=..., env=...)`` returns a
    started ServerProcess (``env`` adds to or overrides ``server_env``; its broker folder is ``<log_dir>/broker``)."""
    servers: list[ServerProcess] = []

    def make(
        *,
        llm_profile: dict[str, Any] | None = None,
        workers: int = 1,
        threads: int = 4,
        as_make_run: bool = False,
        asgi: bool = False,
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        folder = tmp_path / f"web-{len(servers)}"
        folder.mkdir()
        server = ServerProcess(
            env={**server_env(folder, llm_profile=llm_profile), **(env or {})},
            log_dir=folder,
            workers=workers,
            threads=threads,
            as_make_run=as_make_run,
            asgi=asgi,
        )
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.stop()


def redis_queue_url() -> str:
    if os.environ.get("TEST_BROKER", "") == "filesystem" or not redis_reachable():
        why = "needs Redis (a broker whose unacknowledged messages survive a killed worker)"
        if os.environ.get("CI") and os.environ.get("TEST_BROKER", "") != "filesystem":
            pytest.fail(f"{why}: .ci/run starts one when none answers at 127.0.0.1:6379")
        pytest.skip(why)
    return os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def unique_queue() -> str:
    return f"rel-{uuid.uuid4().hex[:8]}"
