"""Priority lanes at saturation: high, normal and low orders side by side in ONE run.

The ``lanes`` phase of ``python -m bench``: a closed loop keeps ``--lanes-window`` orders in flight
for ``--lanes-seconds``, a seeded 10% ``"priority": "high"`` and 10% ``low``, each timed
submit→Processed from the status queue. Per priority: orders, p50/p95/p99/max and the completion
rate over the steady part (the first quarter, at most 5 s, is ramp-up). Issue 14's target: high p99
≤ 1/4 of normal p99, and normal orders still complete.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench.figures import pyplot, save
from bench.load import LoadRun, OrderTimes, Poster, PriorityMix, StatusWatcher, ms, percentile

MIX = {"high": 0.10, "low": 0.10}  # the rest normal
PRIORITIES = ("high", "normal", "low")
TARGET_RATIO = 0.25  # high p99 <= normal p99 / 4


def run_lanes(poster: Poster, watcher: StatusWatcher, *, window: int, seconds: float, seed: int = 14,
              drain_timeout: float = 180.0) -> dict[str, Any]:
    """The closed loop with the priority mix, then its figures per priority."""
    run = LoadRun(poster, watcher, "lanes", mix=PriorityMix(MIX, seed))
    t0 = time.time()
    run.closed_loop(window, seconds, threads=min(32, window), progress=lambda s: print(s, flush=True))
    posting_ended = time.time()
    all_done = run.wait_all(drain_timeout, progress=lambda s: print(s, flush=True))
    orders = run.collect()
    steady_from = t0 + min(5.0, seconds / 4)
    result = summarize(orders, steady_from=steady_from, steady_to=posting_ended)
    result.update({"window": window, "seconds": seconds, "mix": {**MIX, "normal": round(1 - sum(MIX.values()), 2)},
                   "all_finished": all_done, "post_failures": run.post_failures, "post_errors": run.post_errors,
                   "loadavg_1m_at_end": round(os.getloadavg()[0], 2)})
    return result


def summarize(orders: list[OrderTimes], *, steady_from: float, steady_to: float) -> dict[str, Any]:
    """Per priority: counts, latency percentiles (orders submitted after the ramp-up), and the
    completion rate over [steady_from, steady_to] (while the loop kept the window full)."""
    span = max(steady_to - steady_from, 1e-9)
    per: dict[str, Any] = {}
    for priority in PRIORITIES:
        mine = [o for o in orders if o.priority == priority]
        measured = [o.processed - o.submitted for o in mine if o.processed and o.submitted >= steady_from]
        done_in = [o for o in mine if o.processed and steady_from <= o.processed <= steady_to]
        per[priority] = {
            "posted": len(mine), "processed": sum(1 for o in mine if o.processed),
            "failed": sum(1 for o in mine if o.failed), "measured": len(measured),
            "latency_ms": {f"p{p}": ms(percentile(measured, p)) for p in (50, 95, 99)}
            | {"max": ms(max(measured, default=None))},
            "orders_per_s": round(len(done_in) / span, 2),
            "latencies_s": sorted(round(v, 4) for v in measured),
        }
    high, normal = per["high"]["latency_ms"]["p99"], per["normal"]["latency_ms"]["p99"]
    ratio = round(high / normal, 3) if high is not None and normal else None
    return {"per_priority": per, "steady_seconds": round(span, 2),
            "orders_per_s": round(sum(p["orders_per_s"] for p in per.values()), 2),
            "high_to_normal_p99": ratio,
            "target": {"high_p99_at_most_quarter_of_normal": ratio is not None and ratio <= TARGET_RATIO,
                       "normal_completes": per["normal"]["orders_per_s"] > 0}}


def report_lines(res: dict[str, Any]) -> list[str]:
    per = res["per_priority"]
    lines = [f"  {'priority':8} {'posted':>7} {'processed':>9} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
             f"{'orders/s':>8}"]
    for priority in PRIORITIES:
        p = per[priority]
        lat = p["latency_ms"]
        lines.append(f"  {priority:8} {p['posted']:>7} {p['processed']:>9} {lat['p50'] or '-':>8} "
                     f"{lat['p95'] or '-':>8} {lat['p99'] or '-':>8} {p['orders_per_s']:>8}")
    target = res["target"]
    lines.append(f"  high p99 / normal p99 = {res['high_to_normal_p99']} (target <= {TARGET_RATIO}: "
                 f"{'met' if target['high_p99_at_most_quarter_of_normal'] else 'NOT met'}); "
                 f"normal orders completed at {per['normal']['orders_per_s']}/s "
                 f"({'nothing starves' if target['normal_completes'] else 'STARVED'}); "
                 f"all {res['orders_per_s']}/s")
    return lines


def plot(res: dict[str, Any], path: Path) -> str:
    """The latency CDF of each priority, and their p50/p99 bars side by side."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    plt = pyplot()

    colors = {"high": "tab:red", "normal": "tab:blue", "low": "tab:gray"}
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(10, 3.4), dpi=90)
    for i, priority in enumerate(PRIORITIES):
        p = res["per_priority"][priority]
        lat = p["latencies_s"]
        if lat:
            cdf.plot(lat, [(k + 1) / len(lat) for k in range(len(lat))], color=colors[priority],
                     label=f"{priority} ({p['measured']})")
        for j, q in enumerate(("p50", "p99")):
            value = (p["latency_ms"][q] or 0) / 1000
            bars.bar(j * 4 + i, value, color=colors[priority], alpha=0.5 if q == "p50" else 1.0,
                     label=priority if j == 1 else None)
            bars.text(j * 4 + i, value, f"{value:.2f}", ha="center", va="bottom", fontsize=7)
    cdf.set_xscale("log")
    cdf.xaxis.set_major_formatter(ScalarFormatter())
    cdf.xaxis.set_minor_formatter(NullFormatter())
    cdf.set_xlabel("submit → Processed (s, log)")
    cdf.set_ylabel("share of orders")
    cdf.set_title("lanes: latency CDF", fontsize=9)
    cdf.grid(alpha=0.3)
    cdf.legend(fontsize=7)
    bars.set_xticks([1, 5], ["p50", "p99"])
    bars.set_ylabel("seconds")
    bars.set_title(f"lanes: high/normal p99 = {res['high_to_normal_p99']}", fontsize=9)
    bars.legend(fontsize=7)
    return save(fig, path)
