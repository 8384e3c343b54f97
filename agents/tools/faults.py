"""Failures injected into tools on purpose, so tests and benchmarks can watch the agent survive them.

Two ways in, one registry per process:

* in-process (tests)::

      with inject_fault("search_flights", "http_503", times=2):
          ...  # the next two runs of search_flights fail with HTTP 503

* from another process (a benchmark starting a worker): the ``TOOLS_FAULTS`` setting / environment
  variable, e.g. ``TOOLS_FAULTS="search_flights:http_503:2,book_flight:timeout:*"`` ("*" = every run).

A fault fires inside the tool's worker thread, before the tool body, exactly as an upstream failure
would: ``timeout`` really hangs until the registry's deadline abandons the attempt, ``malformed_payload``
is a real ``KeyError``. Production leaves ``TOOLS_FAULTS`` empty, and then this module does nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, get_args

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agents.tools.errors import ToolConnectionError, ToolHttpError, ToolTimeout

FaultKind = Literal["timeout", "http_503", "http_400", "malformed_payload", "connection_error"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
ALWAYS = -1


@dataclass(eq=False)
class Fault:
    """One injected failure: which tool, what kind, how many more runs it hits (``ALWAYS`` = every run)."""

    tool: str
    kind: FaultKind
    remaining: int
    fired: int = 0
    source: str = "code"
    # Set when the fault is withdrawn, so a run hanging on it ends instead of lingering.
    released: threading.Event = field(default_factory=threading.Event)


class FaultRegistry:
    """The process's injected faults. Thread-safe: tools run in worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._env_value: str | None = None

    def add(self, tool: str, kind: str, *, times: int = 1, source: str = "code") -> Fault:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; use one of {', '.join(FAULT_KINDS)}")
        if times < 1 and times != ALWAYS:
            raise ValueError("times must be at least 1 (or ALWAYS)")
        fault = Fault(tool=tool, kind=kind, remaining=times, source=source)  # type: ignore[arg-type]
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove(self, fault: Fault) -> None:
        fault.released.set()
        with self._lock:
            if fault in self._faults:
                self._faults.remove(fault)

    def clear(self) -> None:
        with self._lock:
            for fault in self._faults:
                fault.released.set()
            self._faults.clear()
            self._env_value = None

    def active(self) -> list[Fault]:
        self._sync_from_settings()
        with self._lock:
            return list(self._faults)

    def take(self, tool: str) -> Fault | None:
        """The fault that hits this run of ``tool`` (and count it), or None."""
        self._sync_from_settings()
        with self._lock:
            for fault in self._faults:
                if fault.tool == tool and fault.remaining != 0:
                    if fault.remaining != ALWAYS:
                        fault.remaining -= 1
                    fault.fired += 1
                    return fault
        return None

    def _sync_from_settings(self) -> None:
        # Read lazily (and again if the setting changes, as tests may override it); counts are per process.
        value = getattr(settings, "TOOLS_FAULTS", "") or ""
        if value == self._env_value:
            return
        parsed = parse_faults(value)
        with self._lock:
            for fault in [f for f in self._faults if f.source == "settings"]:
                fault.released.set()
                self._faults.remove(fault)
            for tool, kind, times in parsed:
                self._faults.append(Fault(tool=tool, kind=kind, remaining=times, source="settings"))  # type: ignore[arg-type]
            self._env_value = value


def parse_faults(value: str) -> list[tuple[str, str, int]]:
    """Parse ``"tool:kind[:times],…"``; raises ``ImproperlyConfigured`` naming TOOLS_FAULTS on a bad entry."""
    faults: list[tuple[str, str, int]] = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        bits = [bit.strip() for bit in entry.split(":")]
        if len(bits) not in (2, 3) or not bits[0]:
            raise ImproperlyConfigured(f"TOOLS_FAULTS entry {entry!r} is not tool:kind[:times]")
        tool, kind = bits[0], bits[1]
        if kind not in FAULT_KINDS:
            raise ImproperlyConfigured(f"TOOLS_FAULTS entry {entry!r}: kind must be one of {', '.join(FAULT_KINDS)}")
        raw_times = bits[2] if len(bits) == 3 else "1"
        if raw_times == "*":
            times = ALWAYS
        else:
            try:
                times = int(raw_times)
            except ValueError as exc:
                raise ImproperlyConfigured(f"TOOLS_FAULTS entry {entry!r}: times must be a number or *") from exc
            if times < 1:
                raise ImproperlyConfigured(f"TOOLS_FAULTS entry {entry!r}: times must be at least 1")
        faults.append((tool, kind, times))
    return faults


faults = FaultRegistry()


@contextmanager
def inject_fault(tool_name: str, kind: str, *, times: int = 1) -> Iterator[Fault]:
    """Make the next ``times`` runs of ``tool_name`` fail with ``kind`` (``ALWAYS`` for every run) inside the block."""
    fault = faults.add(tool_name, kind, times=times)
    try:
        yield fault
    finally:
        faults.remove(fault)


def apply_fault(tool_name: str, *, timeout_s: float) -> None:
    """Raise (or hang) as the next injected fault for ``tool_name`` says; do nothing when there is none."""
    fault = faults.take(tool_name)
    if fault is None:
        return
    if fault.kind == "timeout":
        # Hang past the deadline so the registry's real timeout path runs; bounded, so the thread still ends.
        fault.released.wait(timeout=max(timeout_s * 2, timeout_s + 1.0))
        raise ToolTimeout("injected hang", timeout_s=timeout_s)
    if fault.kind == "http_503":
        raise ToolHttpError(503, "Service Unavailable (injected fault)")
    if fault.kind == "http_400":
        raise ToolHttpError(400, "Bad Request (injected fault)")
    if fault.kind == "connection_error":
        raise ToolConnectionError("connection refused (injected fault)")
    if fault.kind == "malformed_payload":
        # What a tool does when an upstream payload lacks a field: a bare KeyError, as real code raises.
        payload: dict[str, object] = {"flights": []}
        payload["data"]
