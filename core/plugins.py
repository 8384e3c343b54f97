"""Loading what a setting and installed packages plug in: dotted paths, then an entry-point group.

A path that cannot be imported, an entry point that cannot be loaded, or a value the caller refuses is
``ImproperlyConfigured`` naming its source, so a bad entry stops the process saying which one it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

T = TypeVar("T")


def load_plugins(setting: str, paths: Iterable[str], group: str, accept: Callable[[object, str], list[T]]) -> list[T]:
    """``accept(value, source)`` for each of ``paths`` (the setting's dotted paths), then for each entry point
    of ``group``, in that order; ``accept`` returns what the value gives or raises ``ImproperlyConfigured``."""
    found: list[T] = []
    for path in paths:
        try:
            value = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(f"{setting}: cannot import {path!r} ({exc})") from exc
        found.extend(accept(value, f"{setting} entry {path!r}"))
    for entry in entry_points(group=group):
        source = f"entry point {entry.name!r} ({entry.value}) of {group}"
        try:
            value = entry.load()
        except Exception as exc:  # a broken package must say which one it is
            raise ImproperlyConfigured(f"{source} cannot be loaded: {exc}") from exc
        found.extend(accept(value, source))
    return found
