"""The Service Bus emulator's operation counters, as the benchmark reads them.

The emulator (``local.servicebus``) writes per-queue counters to the JSON file named by
``--stats-file`` (or the ``LOCAL_SERVICEBUS_STATS_FILE`` environment variable) every second,
on SIGUSR1 and at exit. Counted at the broker: messages accepted by sends (``sent``; a batch
counts each message), deliveries (a message transferred to a receiver: credit waits are not
operations), settlements (complete / abandon / dead-letter / defer / release), management
operations by name, duplicates dropped, expirations. :func:`diff` sums the management operations
under ``management`` and keeps each by name as ``management:<op>``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "LOCAL_SERVICEBUS_STATS_FILE"
SETTLEMENTS = ("completed", "abandoned", "deadlettered", "deferred", "released")


class BusStats:
    def __init__(self, path: Path, pid: Callable[[], int | None]) -> None:
        self.path = path
        self._pid = pid

    def read(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def snapshot(self, timeout: float = 3.0) -> dict[str, dict[str, Any]] | None:
        """Fresh per-queue counters (asks the emulator to write them now)."""
        if self.read() is None:
            return None  # an emulator without stats (SIGUSR1 would kill it: its default action)
        pid = self._pid()
        t0 = time.time()
        if pid:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self.read()
            if data is not None and float(data.get("at", 0)) >= t0:
                return data.get("queues", {})
            time.sleep(0.05)
        data = self.read()
        return None if data is None else data.get("queues", {})


def diff(after: dict[str, dict[str, Any]] | None,
         before: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, int]]:
    """Per queue: counters(after) - counters(before); management ops summed under ``management``."""
    if after is None:
        return {}
    before = before or {}
    out: dict[str, dict[str, int]] = {}
    for q, a in after.items():
        b = before.get(q, {})
        row: dict[str, int] = {}
        for k, v in a.items():
            if isinstance(v, dict):
                bv = b.get(k, {}) if isinstance(b.get(k), dict) else {}
                row[k] = sum(int(n) - int(bv.get(op, 0)) for op, n in v.items())  # type: ignore[assignment]
                for op, n in v.items():  # and each by name (``management:peek-message``): credits differ by kind
                    row[f"{k}:{op}"] = int(n) - int(bv.get(op, 0))
            elif isinstance(v, (int, float)):
                row[k] = int(v) - int(b.get(k, 0))
        if any(row.values()):
            out[q] = row
    return out


def totals(d: dict[str, dict[str, int]], queues: Callable[[str], bool] = lambda q: True) -> dict[str, int]:
    out: dict[str, int] = {}
    for q, row in d.items():
        if not queues(q):
            continue
        for k, v in row.items():
            out[k] = out.get(k, 0) + v
    return out
