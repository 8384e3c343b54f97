"""Gunicorn settings used by ``make run`` (``-c python:config.gunicorn_conf``)."""

from __future__ import annotations

from typing import Any


def post_worker_init(worker: Any) -> None:
    # Before the worker serves: the registries its first requests need, set up once (web/warmup.py); then
    # the embedding model, loaded once per worker process in the background.
    from web.warmup import process_prepare, warm_up_in_background

    process_prepare()
    warm_up_in_background()
