"""``python -m tests.reliability.worker_main <worker options>``: a Celery worker for the SIGKILL test.

The same worker as production, except that its Redis transport hands unacknowledged messages back after
``TEST_VISIBILITY_TIMEOUT`` seconds (kombu's default is an hour), so a test can watch a killed worker's
task being delivered again to the next worker without waiting that long.
"""

from __future__ import annotations

import os
import sys

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from config.celery import app

    app.conf.broker_transport_options = {
        "visibility_timeout": float(os.environ.get("TEST_VISIBILITY_TIMEOUT", "3")),
        # kombu scans for expired unacknowledged messages only every 10th restore cycle (~100 s) by default.
        "unacked_restore_throttle": 1,
    }
    app.worker_main(["worker", *sys.argv[1:]])


if __name__ == "__main__":
    main()
