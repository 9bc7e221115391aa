"""Priority lanes at saturation: high, normal and low orders side by side in ONE run.

``python -m bench.lanes`` (also the ``lanes`` phase of ``python -m bench``): a closed loop keeps
``--window`` orders in flight for ``--seconds``, a seeded 10% ``"priority": "high"`` and 10% ``low``,
each timed submit→Processed from the status queue. Per priority: orders, p50/p95/p99/max and the
completion rate over the steady part (the first quarter, at most 5 s, is ramp-up). Issue 14's
target: high p99 ≤ 1/4 of normal p99, and normal orders still complete. The lanes help only while
the backlog waits in the broker, so the run sets the trigger's ``maxConcurrentCalls`` through
``AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls``; standalone it starts a stack
per value of ``--max-concurrent-calls`` (0: host.json's 4; and 16, the value before the lanes) and
writes ``lanes.json`` and ``lanes.png`` to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.args import DEFAULT_INSTANCES
from bench.load import LoadRun, OrderTimes, Poster, PriorityMix, StatusWatcher, ms, percentile
from bench.logline import log
from local.host.keys import FUNCTION
from local.procs import REPO_ROOT

RESULTS = REPO_ROOT / "bench" / "results"
STATUS_QUEUE = "order-status"
MIX = {"high": 0.10, "low": 0.10}  # the rest normal
PRIORITIES = ("high", "normal", "low")
TARGET_RATIO = 0.25  # high p99 <= normal p99 / 4
MCC_SETTING = "AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls"


def host_json_calls() -> int:
    """host.json's maxConcurrentCalls (the Service Bus extension's default, 16, if unset)."""
    host = json.loads((REPO_ROOT / "host.json").read_text(encoding="utf-8"))
    return int(host.get("extensions", {}).get("serviceBus", {}).get("maxConcurrentCalls", 16))


def host_overrides(max_concurrent_calls: int) -> dict[str, str]:
    """The app settings the run adds: the trigger's concurrency (none: host.json's)."""
    return {MCC_SETTING: str(max_concurrent_calls)} if max_concurrent_calls > 0 else {}


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


def plot(runs: dict[str, dict[str, Any]], path: Path) -> Path:
    """One row per run: the latency CDF of each priority, and p50/p99 bars side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    colors = {"high": "tab:red", "normal": "tab:blue", "low": "tab:gray"}
    fig, axes = plt.subplots(len(runs), 2, figsize=(10, 3.4 * len(runs)), dpi=90, squeeze=False)
    for row, (label, res) in enumerate(runs.items()):
        cdf, bars = axes[row]
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
        cdf.set_title(f"{label}: latency CDF", fontsize=9)
        cdf.grid(alpha=0.3)
        cdf.legend(fontsize=7)
        bars.set_xticks([1, 5], ["p50", "p99"])
        bars.set_ylabel("seconds")
        bars.set_title(f"{label}: high/normal p99 = {res['high_to_normal_p99']}", fontsize=9)
        bars.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _one_stack_run(args: argparse.Namespace, work: Path, mcc: int) -> dict[str, Any]:
    from local.stack import Stack

    overrides = host_overrides(mcc)
    log(f"starting the stack ({args.instances} host instances; maxConcurrentCalls "
        f"{mcc or 'of host.json'}) in {work}")
    with Stack(state_dir=work / "stack", persistent=False, instances=args.instances,
               settings_overrides=overrides) as stack:
        watcher = StatusWatcher(stack.servicebus_connection_string, STATUS_QUEUE).start()
        try:
            poster = Poster(stack.api_url, STATUS_QUEUE, seed=14, headers=stack.key_headers(FUNCTION))
            warm = LoadRun(poster, watcher, "warmup")
            warm.open_loop(rate=4.0, seconds=2.5, threads=4)
            warm.wait_all(60)
            log(f"phase: lanes (closed loop, {args.window} orders in flight, {args.seconds:g}s, "
                f"10% high, 10% low)")
            res = run_lanes(poster, watcher, window=args.window, seconds=args.seconds)
        finally:
            watcher.stop()
    res["max_concurrent_calls"] = mcc or host_json_calls()
    res["settings"] = overrides
    return res


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.lanes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=DEFAULT_INSTANCES)
    ap.add_argument("--window", type=int, default=160, help="orders in flight")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--max-concurrent-calls", type=lambda s: [int(x) for x in s.split(",")], default=[0, 16],
                    help="maxConcurrentCalls of each run, comma-separated (0: host.json's, 4); one run each; "
                         "the default compares host.json's with the 16 it had before the lanes")
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="a short run (small window, 8 s)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.window, args.seconds, args.instances = min(args.window, 12), min(args.seconds, 8.0), 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out_dir)
    result: dict[str, Any] = {"started_at": datetime.now(UTC).isoformat(), "config": vars(args), "runs": {}}
    for mcc in args.max_concurrent_calls:
        label = f"maxConcurrentCalls {mcc}" if mcc else f"maxConcurrentCalls {host_json_calls()} (host.json)"
        work = Path(tempfile.mkdtemp(prefix="bench-lanes-"))
        try:
            res = _one_stack_run(args, work, mcc)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        result["runs"][label] = res
        log(f"lanes, {label}:")
        for line in report_lines(res):
            print(line, flush=True)
    write(result, out_dir, plots=not args.no_plots)
    return 0


def write(result: dict[str, Any], out_dir: Path, *, plots: bool = True) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    if plots and result["runs"]:
        result["plot"] = str(plot(result["runs"], out_dir / "lanes.png"))
    path = out_dir / "lanes.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    log(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
