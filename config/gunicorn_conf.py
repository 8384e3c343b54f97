"""Gunicorn settings used by ``make run`` (``-c python:config.gunicorn_conf``)."""

from __future__ import annotations

from typing import Any


def post_worker_init(worker: Any) -> None:
    # Each worker process loads the embedding model once, in the background (see config/warmup.py).
    from config.warmup import warm_up_in_background

    warm_up_in_background()
