"""``GET <url>`` every ``interval`` seconds from a process of its own, as a load balancer or a kubelet probes,
until SIGTERM or SIGINT: one line per probe on stdout, ``<seconds> <status>`` (status 0: no answer).

The concurrency bench runs this beside its crowd. A probe in a thread of the crowd's own process waits for
the interpreter lock behind hundreds of client threads reading their streams, so its figure measured the load
client as much as the server (LangGraph's handler, which does nothing but answer, showed the same second).

``python -m bench.health_probe http://127.0.0.1:8000/healthz [interval]``
"""

from __future__ import annotations

import signal
import sys
import threading
import time


def main(argv: list[str]) -> int:
    import httpx

    url = argv[0]
    interval = float(argv[1]) if len(argv) > 1 else 0.2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            began = time.monotonic()
            try:
                status = client.get(url).status_code
            except httpx.HTTPError:
                status = 0
            print(f"{time.monotonic() - began:.4f} {status}", flush=True)
            stop.wait(interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
