"""The benchmark run's state and what its phases measure with (bench.run's Bench is one; bench.phase_* use it)."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from bench import azure_cost, busstats, opcount, segments
from bench.calibrate import calibrate
from bench.hostlog import HostLog
from bench.load import LoadRun, Poster, StatusWatcher, phase_figures
from local.procs import REPO_ROOT

# A phase's last settlements land this long after its last order ended: a settlement waits for its
# receiver's receive call in progress, up to RECEIVE_WAIT (2 s) in a lull (local/host/servicebus.py,
# Turns). Each phase waits it out before its window closes, so that no phase counts another's.
SETTLE_LAG = 2.5


def machine() -> dict[str, Any]:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    mem = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory_gib": mem, "python": platform.python_version(),
            "commit": _commit(),
            "platform": platform.platform(), "loadavg_at_start": list(os.getloadavg()),
            "calibration_at_start": calibrate()}


def _commit() -> str | None:
    """The commit the run measures, marked when the tree has uncommitted changes to tracked files."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30).stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head} (with uncommitted changes)" if head and dirty else head or None


class BenchState:
    """The run's options, results and windows, the stack's handles, and the counters and load runs
    every phase measures with. bench.run's Bench adds the stack's start and stop and the phases."""

    bus: busstats.BusStats  # the emulator's counters, once the stack started (Bench.start_stack)
    instance_pids: dict[int, int]  # host instance -> pid, from the stack's start on

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out_dir = Path(args.out_dir)
        self.work = Path(tempfile.mkdtemp(prefix="bench-"))
        self.count_dir = self.work / "opcount"
        self.bus_stats_path = self.work / "servicebus-stats.json"
        self.roles_dir = self.work / "threadroles"
        self.result: dict[str, Any] = {"started_at": datetime.now(UTC).isoformat(), "machine": machine(),
                                       "config": {k: v for k, v in vars(args).items()}}
        self.stack: Any = None
        self.hostlog: HostLog | None = None
        self.watcher: StatusWatcher | None = None
        self.poster: Poster | None = None
        self.runs: list[LoadRun] = []
        self.phase_windows: list[tuple[str, float, float]] = []
        self.profiles: dict[str, Any] = {}

    # ---- counters ------------------------------------------------------------------------------
    def table_snapshot(self) -> dict[str, dict[str, float]]:
        return opcount.read_totals(self.count_dir)

    def bus_snapshot(self) -> dict[str, dict[str, Any]] | None:
        return self.bus.snapshot()

    def snapshot(self) -> dict[str, Any]:
        time.sleep(0.7)  # every process writes its table counters twice a second
        assert self.hostlog is not None
        self.hostlog.poll()
        return {"at": time.time(), "table": self.table_snapshot(), "bus": self.bus_snapshot(),
                "telemetry": self.telemetry_snapshot()}

    def telemetry_snapshot(self) -> dict[str, Any] | None:
        """The telemetry receiver's counts (None without one): what the app's exporter has sent."""
        if self.stack is None or not self.stack.telemetry_url:
            return None
        try:
            return dict(requests.get(f"{self.stack.telemetry_url}/_stats", timeout=10).json())
        except (requests.RequestException, ValueError):
            return None

    @staticmethod
    def table_diff(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for k, v in a.items():
            w = b.get(k, {})
            d = {f: round(v.get(f, 0) - w.get(f, 0), 3) for f in ("requests", "entities", "failed", "seconds")}
            if d["requests"]:
                out[k] = d
        return out

    def window(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        table = self.table_diff(after["table"], before["table"])
        bus = busstats.diff(after["bus"], before["bus"])
        assert self.hostlog is not None
        inv = self.hostlog.counts(before["at"] - 0.7, after["at"] - 0.7)
        return {"seconds": round(after["at"] - before["at"], 2), "table": table, "bus": bus,
                "invocations": dict(inv),
                "telemetry": azure_cost.telemetry_diff(after.get("telemetry"), before.get("telemetry"))}

    # ---- load runs and the host ----------------------------------------------------------------
    def new_run(self, phase: str) -> LoadRun:
        assert self.poster is not None and self.watcher is not None
        r = LoadRun(self.poster, self.watcher, phase)
        self.runs.append(r)
        return r

    def _measured(self, name: str, r: LoadRun, before: dict[str, Any], t0: float, drain_timeout: float,
                  steady_from: float | None = None) -> dict[str, Any]:
        ok = r.wait_all(drain_timeout, progress=lambda s: print(s, flush=True))
        time.sleep(SETTLE_LAG)  # the last settlements and status sends
        after = self.snapshot()
        t1 = time.time()
        self.phase_windows.append((name, t0, t1))
        orders = r.collect()
        processed = [o for o in orders if o.processed]
        first = min((o.submitted for o in orders), default=t0)
        last = max((o.processed for o in processed), default=t1)
        res: dict[str, Any] = phase_figures(orders, r.post_failures, ok) | {
            "post_errors": r.post_errors, "latency_legs": segments.summarize(orders),
            "status_consumer_lag_ms": self.watcher.lag_ms(t0, t1) if self.watcher is not None else None,
            "window": self.window(before, after)}
        assert self.hostlog is not None
        work = self.hostlog.work_items(first - 0.01, last + 0.5)
        res["work_items"] = work
        res["work_items_per_s"] = round(work / (last - first), 1) if last > first else None
        if steady_from is not None:
            done_in = [o for o in processed if steady_from <= o.processed <= r_end(orders)]
            span = r_end(orders) - steady_from
            res["steady"] = {"from": steady_from, "seconds": round(span, 2),
                             "orders_per_s": round(len(done_in) / span, 2) if span > 0 else None,
                             "work_items_per_s":
                                 round(self.hostlog.work_items(steady_from, steady_from + span) / span, 1)
                             if span > 0 else None}
        return res

    def host_instances(self) -> dict[int, int]:
        self.instance_pids.update(self.stack.host_instances())
        return dict(self.instance_pids)

    def saturation_rate(self) -> float:
        st = self.result.get("phases", {}).get("saturation", {})
        return float((st.get("steady") or {}).get("orders_per_s") or st.get("orders_per_s") or 5.0)


def r_end(orders: list[Any]) -> float:
    return max((o.processed for o in orders if o.processed), default=time.time())
