"""Where an order's latency goes: the gaps between its consecutive status events.

The load generator stamps every status message on arrival (``bench.load.StatusEvents``): the
POST, its 202, ``received`` (sent by the submission after its commit), one ``step-done:{step}``
per step (sent by the Scheduler after the reply's transaction) and ``processed``. The gap
between two consecutive stamps is one leg of the order's path: the leg from ``step-done:a`` to
``step-done:b`` is the next step's request hop, the agent's call, the reply hop and the
Scheduler's transaction. Percentiles are per leg, over the orders that have both stamps.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from bench.load import OrderTimes, percentile


def legs(order: OrderTimes) -> list[tuple[str, float]]:
    """``(name, seconds)`` of each leg of a processed order, in the order the stamps came."""
    stamps = [("post", order.submitted)]
    if order.accepted:
        stamps.append(("202", order.accepted))
    stamps += sorted(order.events.items(), key=lambda kv: kv[1])
    return [(f"{a}→{b}", tb - ta) for (a, ta), (b, tb) in zip(stamps, stamps[1:], strict=False)]


def summarize(orders: list[OrderTimes]) -> dict[str, dict[str, Any]]:
    """Per leg: how many orders had it, and its p50 and p99 in ms (``202→received`` can be
    negative: the status message may arrive before the HTTP response)."""
    per: dict[str, list[float]] = defaultdict(list)
    for o in orders:
        if o.processed:
            for name, seconds in legs(o):
                per[name].append(seconds)
    out: dict[str, dict[str, Any]] = {}
    for name, values in sorted(per.items(), key=lambda kv: -len(kv[1])):
        p50, p99 = percentile(values, 50), percentile(values, 99)
        out[name] = {"n": len(values), "p50_ms": round(1000 * p50, 1) if p50 is not None else None,
                     "p99_ms": round(1000 * p99, 1) if p99 is not None else None}
    return out


def report_line(segments: dict[str, dict[str, Any]], min_share: float = 0.5) -> str:
    """The legs most orders had, with their p50, in one line."""
    if not segments:
        return "latency legs: none"
    most = max(s["n"] for s in segments.values())
    parts = [f"{name} {s['p50_ms']}" for name, s in segments.items() if s["n"] >= min_share * most]
    return "latency legs (p50 ms): " + ", ".join(parts)
