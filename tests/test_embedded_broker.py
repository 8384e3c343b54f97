"""The embedded broker (``core/embedded_broker.py``): a real Valkey from a wheel, started once however many
processes ask at once, answering on its socket, and keeping queued tasks across a restart."""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
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
