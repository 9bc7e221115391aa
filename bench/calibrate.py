"""How fast this machine's CPU is right now: a fixed pure-Python workload, timed in CPU seconds.

This machine's speed moves by a third to a half between hours, so a CPU-per-order figure alone
cannot tell a code change from a machine change: the bench times this workload (JSON, key
formatting and parsing, a SHA-256, dataclasses: the kind of work the app's CPU goes to) at its
start, before each saturation phase and at its end. Its figure is the best of ``rounds``, in ms.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

ITERATIONS = 4000  # ~0.1-0.2 s per round on this machine
ROUNDS = 8  # the first rounds of an idle machine run slow (~1.5x): the best is the warmed-up figure


@dataclass(frozen=True)
class _Row:
    order_id: str
    step: int
    complete_by: datetime
    etag: str


def _document(i: int) -> dict[str, Any]:
    return {"orderId": f"{i:032x}", "customerId": f"customer-{i % 97}", "currency": "EUR",
            "lines": [{"sku": f"SKU-{j}", "quantity": j + 1, "price": f"{(i + j) % 500}.99"} for j in range(4)],
            "steps": {"inventory": "done", "payment": "pending", "shipping": None}, "priority": "normal"}


def _one(i: int, start: datetime) -> int:
    doc = _document(i)
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    back = json.loads(text)
    key = f"{back['orderId']}:{(start + timedelta(seconds=i)).strftime('%Y%m%dT%H%M%S%f')}"
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    row = _Row(back["orderId"], 0, start, digest[:16])
    for step in range(3):
        row = replace(row, step=step, complete_by=row.complete_by + timedelta(seconds=30))
    parts = key.split(":")
    return len(parts[1]) + row.step + len(back["lines"])


def workload(iterations: int = ITERATIONS) -> int:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return sum(_one(i, start) for i in range(iterations))


def calibrate(rounds: int = ROUNDS, iterations: int = ITERATIONS) -> dict[str, Any]:
    """CPU milliseconds of the workload: the best of ``rounds``, and every round."""
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        workload(iterations)
        times.append((time.process_time() - t0) * 1000.0)
    return {"ms": round(min(times), 1), "rounds_ms": [round(t, 1) for t in times], "iterations": iterations}
