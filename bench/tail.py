"""The slowest orders of a phase, and what ran beside them.

A phase's p99 is its few slowest orders. For each of them this keeps its legs
(``bench.segments``) and what the stack did while it was in flight: the host invocations that
overlapped it and ran long, and the Azurite probe's slow reads (``bench.probe``). That is enough
to tell one slow leg from a stall that every process saw, or from a stall of one host instance.
"""

from __future__ import annotations

from typing import Any

from bench.hostlog import Invocation
from bench.load import OrderTimes
from bench.segments import legs

LONG_INVOCATION_MS = 40  # an invocation of the hot path takes ~5-20 ms at the fixed rate


def slowest(orders: list[OrderTimes], invocations: list[Invocation], probe_slow: list[list[float]],
            n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` slowest processed orders, slowest first, each with its legs (ms), the invocations
    that overlapped it and took at least ``LONG_INVOCATION_MS``, and the probe's slow reads in it.
    Times are ms from the order's POST."""
    done = sorted((o for o in orders if o.processed), key=lambda o: o.processed - o.submitted, reverse=True)
    out = []
    for o in done[:n]:
        start, end = o.submitted, o.processed

        def rel(t: float, start: float = start) -> float:
            return round(1000 * (t - start), 1)

        overlapping = [i for i in invocations
                       if i.duration_ms >= LONG_INVOCATION_MS and i.at - i.duration_ms / 1000 < end and i.at > start]
        out.append({
            "order_id": o.order_id,
            "ms": rel(end),
            "legs": [(name, round(1000 * s, 1)) for name, s in legs(o)],
            "long_invocations": [{"function": i.function, "instance": i.instance,
                                  "started": rel(i.at - i.duration_ms / 1000), "ms": i.duration_ms}
                                 for i in overlapping],
            "azurite_slow_reads": [{"started": rel(at), "ms": took} for at, took in probe_slow if start <= at <= end],
        })
    return out


def report_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per slow order: its total, its legs, and what overlapped it."""
    lines = []
    for r in rows:
        leg_text = ", ".join(f"{name} {ms}" for name, ms in r["legs"])
        beside = [f"{i['function']}@{i['instance']} {i['ms']} ms from +{i['started']}" for i in r["long_invocations"]]
        beside += [f"azurite read {p['ms']} ms at +{p['started']}" for p in r["azurite_slow_reads"]]
        lines.append(f"  slow order {r['ms']} ms: {leg_text}; beside it: {', '.join(beside) or 'nothing long'}")
    return lines
