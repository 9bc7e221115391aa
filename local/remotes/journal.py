"""What the remote services simulator saw, call by call: the call journal and the down windows.

* **Call journal** (``GET /_calls?service=&since=``): every service call received (after the 400
  for a missing key), in arrival order: ``at`` (ISO time of arrival), ``service``,
  ``operation``, ``idempotencyKey`` and ``fault``: the fault injected into it (``down``,
  ``reset``, ``hang``, ``transient``, ``lostResponse``) or ``null``. A chaos run reads it to
  tell which of an order's failed attempts met the outage and which met another fault.
  It keeps the newest ``limit`` calls (``dropped`` says how many older ones were forgotten).
* **Down windows** (``/_stats`` ``downWindows``): one entry per period a service was ``down``
  (``PUT /_faults/{service}`` with ``down`` set, until a PUT or reset clears it): ``service``,
  ``mode`` (``503`` or ``reset``), ``from``, ``to`` (``null`` while still down), ``calls``:
  the calls received inside the window, and ``firstCall`` / ``lastCall``.

Both are guarded by the simulator's lock (the callers hold it).
"""

from __future__ import annotations

from collections import deque
from datetime import datetime
from typing import Any

JOURNAL_LIMIT = 500_000  # calls kept (a 2,000-order chaos run makes about 15,000)


class CallJournal:
    """The newest ``limit`` calls received, oldest first. Not thread-safe: callers lock."""

    def __init__(self, limit: int = JOURNAL_LIMIT) -> None:
        self._calls: deque[dict[str, Any]] = deque(maxlen=limit)
        self.received = 0

    def record(self, at: datetime, service: str, operation: str, key: str, fault: str | None) -> dict[str, Any]:
        """Journal one call; returns its entry (a later fault, a lost response, is set on it)."""
        entry = {"at": at.isoformat(), "service": service, "operation": operation, "idempotencyKey": key,
                 "fault": fault}
        self._calls.append(entry)
        self.received += 1
        return entry

    def entries(self, service: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        """Copies of the calls to ``service`` (all: None) that arrived at or after ``since`` (ISO)."""
        since_at = datetime.fromisoformat(since) if since else None
        return [dict(e) for e in self._calls
                if (service is None or e["service"] == service)
                and (since_at is None or datetime.fromisoformat(e["at"]) >= since_at)]

    def summary(self) -> dict[str, int]:
        return {"received": self.received, "kept": len(self._calls), "dropped": self.received - len(self._calls)}

    def clear(self) -> None:
        self._calls.clear()
        self.received = 0


class DownWindows:
    """The periods each service was down, and the calls it received in each. Callers lock."""

    def __init__(self) -> None:
        self._windows: list[dict[str, Any]] = []
        self._open: dict[str, dict[str, Any]] = {}

    def set_down(self, service: str, down: bool | str, at: datetime) -> None:
        """The service's ``down`` fault is now ``down`` (False, True or "reset"): open or close a window."""
        current = self._open.get(service)
        mode = None if not down else ("reset" if down == "reset" else "503")
        if current is not None and current["mode"] == mode:
            return  # unchanged (a PUT that keeps the service down)
        if current is not None:
            current["to"] = at.isoformat()
            del self._open[service]
        if mode is not None:
            window = {"service": service, "mode": mode, "from": at.isoformat(), "to": None, "calls": 0,
                      "firstCall": None, "lastCall": None}
            self._windows.append(window)
            self._open[service] = window

    def close_all(self, at: datetime) -> None:
        for service in list(self._open):
            self.set_down(service, False, at)

    def count_call(self, service: str, at: datetime) -> None:
        """A call ``service`` received (counted only inside one of its down windows)."""
        window = self._open.get(service)
        if window is None:
            return
        window["calls"] += 1
        window["firstCall"] = window["firstCall"] or at.isoformat()
        window["lastCall"] = at.isoformat()

    def snapshot(self) -> list[dict[str, Any]]:
        return [dict(w) for w in self._windows]

    def clear(self) -> None:
        self._windows.clear()
        self._open.clear()
