"""The soak run's arithmetic and its process sampling (the run itself is a benchmark: bench/soak.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.soak import LOOPBACK, free_port, percentile, worker_rss


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.5, 50.0), (0.95, 95.0), (0.99, 99.0), (1.0, 100.0), (0.0, 1.0)],
)
def test_percentile_is_the_nearest_rank(q: float, expected: float) -> None:
    values = [float(v) for v in range(100, 0, -1)]  # unsorted on purpose
    assert percentile(values, q) == expected


def test_percentile_of_nothing_is_zero() -> None:
    assert percentile([], 0.95) == 0.0


def test_worker_rss_sums_the_children_of_a_process() -> None:
    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        import psutil

        for _ in range(100):
            if psutil.Process(parent.pid).children():
                break
            time.sleep(0.05)
        sample = worker_rss(parent.pid)
        assert len(sample["workers"]) == 1
        assert sample["total_mib"] == pytest.approx(sum(sample["workers"].values()))
        assert sample["total_mib"] > 1
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()
    assert worker_rss(parent.pid) == {"workers": {}, "total_mib": 0.0}


def test_free_port_is_a_loopback_port_nobody_holds() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind((LOOPBACK, port))  # would raise if it were taken
    assert 1024 <= port <= 65535
