"""The embedded broker (``core/embedded_broker.py``): a real Valkey from a wheel, started once however many
processes ask at once, answering on its socket, and keeping queued tasks across a restart."""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import psutil
import pytest
import redis

from core import embedded_broker


@pytest.fixture
def folder() -> Path:
    # A short path: a Unix socket's is limited to 107 bytes, and pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="vk-"))
    yield path
    embedded_broker.stop_embedded_valkey(path)


def servers_in(folder: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "valkey-server" and str(folder) in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_many_processes_asking_at_once_start_one_server(folder: Path) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        urls = set(pool.map(lambda _: embedded_broker.ensure_embedded_valkey(folder), range(8)))
    assert urls == {f"redis+socket://{folder}/valkey.sock"}
    assert len(servers_in(folder)) == 1
    assert embedded_broker.answers(embedded_broker.socket_path(folder))


def test_queued_tasks_survive_a_restart_of_the_server(folder: Path) -> None:
    embedded_broker.ensure_embedded_valkey(folder)
    client = redis.Redis(unix_socket_path=str(embedded_broker.socket_path(folder)))
    client.lpush("agents", *[f"task-{i}" for i in range(5)])
    embedded_broker.stop_embedded_valkey(folder)
    assert not embedded_broker.answers(embedded_broker.socket_path(folder))
    embedded_broker.ensure_embedded_valkey(folder)
    client = redis.Redis(unix_socket_path=str(embedded_broker.socket_path(folder)))
    assert client.llen("agents") == 5
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}


def test_the_health_check_of_a_stopped_broker_fails_by_its_deadline_and_lets_its_thread_go(
    folder: Path, settings: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker check PINGs on a kept connection: a broker that stops answering (SIGSTOP) fails the check
    within HEALTH_CHECK_TIMEOUT, rather than holding the check's thread until the server runs again, and the
    next check after it resumes connects afresh and passes."""
    import time

    from config.celery import app
    from web import health

    url = embedded_broker.ensure_embedded_valkey(folder)
    monkeypatch.setattr(app.conf, "broker_url", url)
    settings.HEALTH_CHECK_TIMEOUT = 0.5  # type: ignore[attr-defined]
    assert health.check_broker()["ok"] is True
    (server,) = servers_in(folder)
    server.suspend()
    with ThreadPoolExecutor(1) as pool:
        try:
            began = time.monotonic()
            pending = pool.submit(health.check_broker)
            done = wait([pending], timeout=5).done
            took = time.monotonic() - began
        finally:
            server.resume()  # a check still stuck returns now
        result = pending.result(timeout=10)
    assert done, "the PING to a stopped broker held its thread until the broker ran again"
    assert result["ok"] is False and result["error"].startswith("the broker is unreachable ("), result
    assert took < 0.5 + 1.0, f"the check took {took:.1f} s, past its deadline of 0.5 s"
    assert health._broker_conn is None
    assert health.check_broker()["ok"] is True
