"""The benchmark: ``python -m bench`` (``make bench``; ``--smoke`` for a CI-sized run).

One run starts the local stack (Azurite, the Service Bus emulator, the remotes simulator, the
Functions host with ``--instances`` instances) on free loopback ports and measures, in this order:
the emulator alone, a search page's cost (on an Azurite of its own, before the stack starts), a
sweep over ``--sweep-small`` finished orders, saturation (``--window`` orders in flight), the
priority lanes, fixed arrival rates of 20% and 60% of saturation (latency, sustained), idle,
recovery from a SIGKILL mid-step, a bulk retry beside live orders, a sweep over ``--sweep-large``
finished orders, then, with every process of the stack stopped, the DBOS and Temporal peers.
Counts are counted, not estimated: table requests at the host processes' transport
(``bench.opcount``), bus operations by the emulator, invocations from the host's log. It writes
``bench.json`` and the plots to ``--out-dir`` and prints the results (``bench.results``);
bench/README.md says what each figure means. Nothing is asserted on speed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from typing import Any

from bench import (
    busstats,
    cpu_split,
    opcount,
    phase_bulk,
    phase_recovery,
    phase_sweep,
    segments,
    tail,
    versus,
)
from bench.appcode import split as split_function_threads
from bench.args import parse_args
from bench.bench_state import SETTLE_LAG, BenchState
from bench.calibrate import calibrate
from bench.hostlog import HostLog
from bench.load import Poster, StatusWatcher
from bench.logline import log
from bench.profiling import group_pids, start_record, summarize_raw
from local.host.keys import FUNCTION
from local.procs import REPO_ROOT
from shared.observability.sampling import RATIO_SETTING

# The exporter's batches every 0.5 s, not 5 (the OpenTelemetry SDK's variables): a window's items
# reach the receiver within its settle lag, so each phase counts its own telemetry
EXPORT_PROMPTLY = {"OTEL_BSP_SCHEDULE_DELAY": "500", "OTEL_BLRP_SCHEDULE_DELAY": "500"}

STATUS_QUEUE = "order-status"


# ---------------------------------------------------------------------------------------------
class Bench(BenchState):
    # ---- lifecycle -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t_start = time.time()
        try:
            if not self.args.skip_emulator:
                self.phase_emulator()
            self.phase_search()
            self.start_stack()
            phase_sweep.run(self, "small", self.args.sweep_small)
            self.phase_warmup()
            self.phase_saturation()
            if self.args.lanes_seconds > 0:
                self.phase_lanes()
            self.phase_fixed("latency", 0.2, self.args.latency_seconds)
            if self.args.sustained_seconds > 0:
                self.phase_fixed("sustained", 0.6, self.args.sustained_seconds)
            self.phase_idle()
            if not self.args.skip_recovery:
                phase_recovery.run(self)
            if self.args.bulk_orders > 0:
                phase_bulk.run(self)
            phase_sweep.run(self, "large", self.args.sweep_large)
            if not self.args.skip_peer:
                self.phase_peer()
        except BaseException as e:
            self.result["error"] = f"{type(e).__name__}: {e}"
            self.result["traceback"] = traceback.format_exc()
            log(f"ERROR: {e!r}")
            if isinstance(e, KeyboardInterrupt):
                raise
        finally:
            self.stop_stack()
            self.result["duration_s"] = round(time.time() - t_start, 1)
            try:
                self.summarize()
            except Exception as e:  # noqa: BLE001
                self.result.setdefault("error", f"summary failed: {e!r}")
                self.result["summary_traceback"] = traceback.format_exc()
            self.write()
            if not self.args.keep:
                shutil.rmtree(self.work, ignore_errors=True)
            else:
                log(f"kept {self.work}")
        return self.result

    def start_stack(self) -> None:
        from local.stack import Stack

        os.environ[busstats.ENV] = str(self.bus_stats_path)
        overrides = {"StepTimeoutSeconds": str(self.args.step_timeout),
                     "SupervisorSchedule": f"*/{self.args.supervisor_period} * * * * *"}
        # a bulk retry at the default's pace (orders/s) whatever the Supervisor's period (bench.phase_bulk)
        overrides["BulkOrdersPerTick"] = str(phase_bulk.per_tick(self.args))
        overrides[RATIO_SETTING] = str(self.args.telemetry_ratio)
        log(f"starting the stack ({self.args.instances} host instances; step timeout {self.args.step_timeout}s, "
            f"supervisor every {self.args.supervisor_period}s) in {self.work}")
        t0 = time.monotonic()
        self.stack = Stack(state_dir=self.work / "stack", persistent=False, instances=self.args.instances,
                           settings_overrides=overrides, telemetry=True,
                           host_env=opcount.host_env(self.count_dir) | cpu_split.host_env(self.roles_dir)
                           | EXPORT_PROMPTLY)
        self.stack.start()
        self.result["stack_start_s"] = round(time.monotonic() - t0, 1)
        self.hostlog = HostLog(self.stack.log_dir / "host.log")
        # instance -> pid now: the host's `instance K pid PID` lines scroll out of the stack's
        # line buffer once the instances have logged a few thousand invocations
        self.instance_pids = dict(self.stack.host_instances())
        self.bus = busstats.BusStats(self.bus_stats_path, lambda: self.stack.proc("servicebus").pid)
        self.watcher = StatusWatcher(self.stack.servicebus_connection_string, STATUS_QUEUE).start()
        self.poster = Poster(self.stack.api_url, STATUS_QUEUE, seed=7, headers=self.stack.key_headers(FUNCTION))
        if self.bus.snapshot() is None:
            log("note: the emulator writes no stats file: bus operations are not counted in this run")
        log(f"stack ready in {self.result['stack_start_s']}s: {self.stack.base_url}")

    def stop_stack(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.stack is not None:
            log("stopping the stack")
            self.stack.stop()
        os.environ.pop(busstats.ENV, None)

    # ---- phases --------------------------------------------------------------------------------
    def phase_emulator(self) -> None:
        from bench import emulator as emu

        log(f"phase: the emulator on its own ({self.args.emulator_messages} messages through the SDK)")
        out = self.work / "emulator.json"
        t0 = time.time()
        try:
            emu.main(["--messages", str(self.args.emulator_messages), "--receivers", "2", "--out", str(out)])
            self.result["emulator_alone"] = json.loads(out.read_text(encoding="utf-8"))
        except Exception as e:  # noqa: BLE001 - its own failure must not stop the rest
            self.result["emulator_alone"] = {"error": repr(e)}
        self.phase_windows.append(("emulator alone", t0, time.time()))

    def phase_search(self) -> None:
        """The cost of a search page at each of ``--search-sizes`` finished orders, on an Azurite
        of its own (``bench.search_cost``), before the stack starts: nothing else is running."""
        sizes = self.args.search_sizes
        if not sizes:
            return
        log(f"phase: search page cost with {' and '.join(f'{n:,}' for n in sizes)} finished orders (own Azurite)")
        from bench import search_cost

        t0 = time.time()
        try:
            self.result["search"] = search_cost.run(sizes, threads=self.args.seed_threads,
                                                    progress=lambda s: print(s, flush=True))
        except Exception as e:  # noqa: BLE001 - reported (and its target not met); the rest still runs
            self.result["search"] = {"error": repr(e), "traceback": traceback.format_exc()}
            log(f"  search phase failed: {e!r}")
        self.phase_windows.append(("search", t0, time.time()))

    def phase_warmup(self) -> None:
        log(f"phase: warm-up ({self.args.warmup} orders)")
        r = self.new_run("warmup")
        r.open_loop(rate=max(2.0, self.args.warmup / 3), seconds=min(3.0, self.args.warmup / 2.0), threads=4)
        if not r.wait_all(60):
            log(f"  warning: {len(r.orders) - r.finished()} warm-up orders unfinished")
        time.sleep(SETTLE_LAG)  # its settlements land before the next phase counts

    def phase_saturation(self) -> None:
        a = self.args
        log(f"phase: saturation (closed loop, {a.window} orders in flight, {a.saturation_seconds:g}s)")
        r = self.new_run("saturation")
        speed = calibrate()["ms"]  # the machine's speed right now: the peers' saturation records it too
        before = self.snapshot()
        t0 = time.time()
        pids = self._pids()
        meters = cpu_split.PhaseMeters(pids, self.roles_dir)
        meters.start()
        prof_procs = [] if a.no_profile else self._start_profiles(pids)
        probe = self._start_probe(a.saturation_seconds + 30)
        r.closed_loop(a.window, a.saturation_seconds, threads=min(32, a.window),
                      progress=lambda s: print(s, flush=True))
        probed = self._stop_probe(probe)
        res = self._measured("saturation", r, before, t0, drain_timeout=120,
                             steady_from=t0 + min(5.0, a.saturation_seconds / 4))
        # after the drain: every processed order's work, the last ones' too, is in the window
        res.update(meters.stop(res["processed"]))
        cpu, wall = res["cpu_seconds"], time.time() - t0
        res["cpu_wall_seconds"] = round(wall, 2)
        res["calibration_ms"] = speed
        res["cpu_share_of_machine"] = {k: round(v / (wall * (os.cpu_count() or 1)), 3) for k, v in cpu.items()}
        res["azurite_probe"] = probed
        self._collect_profiles(prof_procs)
        self.result.setdefault("phases", {})["saturation"] = res
        st = res.get("steady", {})
        log(f"  saturation: {st.get('orders_per_s')} orders/s, {st.get('work_items_per_s')} work items/s (steady); "
            f"p50 {res['latency_ms']['p50']} ms, p99 {res['latency_ms']['p99']} ms; CPU s: {cpu}")
        log(f"  {cpu_split.report_line(res, ' at saturation')}")

    def _start_profiles(self, pids: dict[str, list[int]]) -> list[tuple[str, int, Any]]:
        """py-spy on one host instance (they run the same code on the same load; ``--gil``: its
        CPU, split by ``bench.appcode``) and the emulator, over the middle of saturation: every
        py-spy takes CPU from the 2 the stack shares, so profiling all of them would change what it
        measures. Filled in by a thread."""
        a = self.args
        secs = max(3, int(a.saturation_seconds * 0.6))
        start_at = a.saturation_seconds * 0.25
        profiled = ("host instance 1", "servicebus emulator")
        prof_procs: list[tuple[str, int, Any]] = []

        def later() -> None:
            time.sleep(start_at)
            for name, plist in pids.items():
                if name in profiled:
                    for pid in plist:
                        p = start_record(pid, secs, self.work / "profiles" / f"{name.replace(' ', '_')}-{pid}.txt",
                                         gil=name.startswith("host instance"))
                        if p is not None:
                            prof_procs.append((name, pid, p))

        import threading

        threading.Thread(target=later, daemon=True).start()
        return prof_procs

    def _collect_profiles(self, prof_procs: list[tuple[str, int, Any]]) -> None:
        for name, pid, p in prof_procs:
            try:
                p.wait(timeout=60)
            except Exception:  # noqa: BLE001
                p.kill()
            path = self.work / "profiles" / f"{name.replace(' ', '_')}-{pid}.txt"
            self.profiles[f"{name} (pid {pid})"] = summary = summarize_raw(path)
            if name.startswith("host instance") and path.exists():
                summary["function_threads"] = split_function_threads(path)

    def phase_lanes(self) -> None:
        """Priority lanes at saturation: 10% high, 10% low orders beside normal ones (bench/lanes.py)."""
        from bench import lanes

        a = self.args
        assert self.poster is not None and self.watcher is not None
        log(f"phase: lanes (closed loop, {a.lanes_window} orders in flight, {a.lanes_seconds:g}s, 10% high, 10% low)")
        before = self.snapshot()
        t0 = time.time()
        res = lanes.run_lanes(self.poster, self.watcher, window=a.lanes_window, seconds=a.lanes_seconds)
        time.sleep(SETTLE_LAG)  # its last settlements land in its window, not in the next phase's
        self.phase_windows.append(("lanes", t0, time.time()))
        res["window_counts"] = self.window(before, self.snapshot())
        self.result.setdefault("phases", {})["lanes"] = res
        for line in lanes.report_lines(res):
            print(line, flush=True)
        if not a.no_plots:
            try:
                res["plot"] = lanes.plot(res, self.out_dir / "lanes.png")
            except Exception as e:  # noqa: BLE001 - a plot is not worth the run
                res["plot"] = repr(e)

    def _start_probe(self, seconds: float) -> subprocess.Popen[str] | None:
        """Azurite's own latency during the phase, measured from a process of its own."""
        az = self.stack.azurite
        state_table, _ = phase_sweep.state_tables(self.stack.settings)
        try:
            return subprocess.Popen([sys.executable, "-m", "bench.probe", "--host", az.host, "--port",
                                     str(az.table_port), "--table", state_table, "--seconds", str(seconds)],
                                    cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    start_new_session=True)
        except OSError:
            return None

    @staticmethod
    def _stop_probe(proc: subprocess.Popen[str] | None) -> dict[str, Any] | None:
        if proc is None:
            return None
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=10)
            return json.loads(out.strip().splitlines()[-1])
        except Exception:  # noqa: BLE001 - a diagnostic: its failure must not fail the phase
            proc.kill()
            return None

    def _pids(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for k, pid in sorted(self.host_instances().items()):
            out[f"host instance {k}"] = [pid]
        out["host supervisor"] = [self.stack.proc("host").pid]
        out["servicebus emulator"] = [self.stack.proc("servicebus").pid]
        out["azurite"] = group_pids(self.stack.azurite.proc.pid) or [self.stack.azurite.proc.pid]
        out["remotes"] = [self.stack.proc("remotes").pid]
        out["bench (load + status consumer)"] = [os.getpid()]
        return out

    def phase_fixed(self, name: str, fraction: float, seconds: float) -> None:
        rate = max(0.5, fraction * self.saturation_rate())
        log(f"phase: {name}: fixed arrival rate {rate:.2f} orders/s ({fraction:.0%} of saturation) for {seconds:g}s")
        r = self.new_run(name)
        before = self.snapshot()
        t0 = time.time()
        meters = cpu_split.PhaseMeters(self._pids(), self.roles_dir)
        meters.start()
        probe = self._start_probe(seconds + 30)
        r.open_loop(rate, seconds, threads=8, progress=lambda s: print(s, flush=True))
        probed = self._stop_probe(probe)
        res = self._measured(name, r, before, t0, drain_timeout=120)
        res.update(meters.stop(res["processed"]))
        res["azurite_probe"] = probed
        assert self.hostlog is not None
        res["slowest"] = tail.slowest(r.collect(), self.hostlog.ended_since(t0), (probed or {}).get("slow", []))
        res["arrival_rate"] = round(rate, 2)
        res["fraction_of_saturation"] = fraction
        self.result.setdefault("phases", {})[name] = res
        log(f"  {name}: {res['processed']}/{res['orders_posted']} processed, {res['orders_per_s']} orders/s; "
            f"latency p50 {res['latency_ms']['p50']} ms, p95 {res['latency_ms']['p95']} ms, "
            f"p99 {res['latency_ms']['p99']} ms")
        log(f"  {segments.report_line(res['latency_legs'])}")
        for line in tail.report_lines(res["slowest"]):
            log(line)
        lag = res["status_consumer_lag_ms"]
        log(f"  the bench's status consumer got the status messages p50 {lag['p50']} ms, p99 {lag['p99']} ms, "
            f"max {lag['max']} ms after the broker enqueued them ({lag['n']} messages)")
        log(f"  {cpu_split.report_line(res, f' ({name})')}")

    def phase_idle(self) -> None:
        secs = self.args.idle_seconds
        log(f"phase: idle ({secs:g}s with no orders in flight)")
        time.sleep(SETTLE_LAG)  # the last settlements
        before = self.snapshot()
        t0 = time.time()
        end = time.monotonic() + secs
        while time.monotonic() < end:
            time.sleep(min(10.0, max(0.0, end - time.monotonic())))
            if time.monotonic() < end:
                print(f"  idle: {end - time.monotonic():.0f}s left", flush=True)
        after = self.snapshot()
        self.phase_windows.append(("idle", t0, time.time()))
        w = self.window(before, after)
        minutes = w["seconds"] / 60.0
        bus_all = busstats.totals(w["bus"])
        bus_ops = sum(v for k, v in bus_all.items() if k in ("sent", "delivered", "management", *busstats.SETTLEMENTS))
        table_req = sum(int(v["requests"]) for v in w["table"].values())
        table_ent = sum(int(v["entities"]) for v in w["table"].values())
        sweeps = w["invocations"].get("supervisor", 0)
        res = {"window": w, "sweeps": sweeps,
               "bus_ops_per_min": round(bus_ops / minutes, 1), "table_requests_per_min": round(table_req / minutes, 1),
               "table_entities_per_min": round(table_ent / minutes, 1),
               "table_requests_per_sweep": round(table_req / sweeps, 2) if sweeps else None,
               "at_default_schedule_15s": {"table_requests_per_min":
                                           round(4 * table_req / sweeps, 1) if sweeps else None},
               "credit_flows_per_min": round(bus_all.get("flows", 0) / minutes, 1) if "flows" in bus_all else None}
        self.result["idle"] = res
        log(f"  idle: {res['bus_ops_per_min']} bus ops/min, {res['table_requests_per_min']} table requests/min "
            f"({sweeps} sweeps)")

    def phase_peer(self) -> None:
        """The peers (DBOS, Temporal), once every process of our stack has stopped (bench.versus)."""
        self.stop_stack()
        self.stack = self.watcher = None
        versus.measure_all(self.args, self.result, self.phase_windows)

    # ---- summary -------------------------------------------------------------------------------
    def summarize(self) -> None:
        from bench import results
        from bench.report import summarize

        summarize(self)
        versus.summarize(self)
        print(results.render(self.result), flush=True)
        checks = self.result.get("consistency") or []
        print(f"counts consistent: {sum(c['ok'] for c in checks)} of {len(checks)} relations hold"
              + "".join(f"; BROKEN: {c['check']} {c['detail']}" for c in checks if not c["ok"]), flush=True)
        for name, part in (("run", self.result), *((k, self.result.get(k) or {}) for k in ("search", "peer",
                                                                                         "peer_temporal"))):
            if part.get("error"):
                print(f"ERROR ({name}): {part['error']}", flush=True)

    def write(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / "bench.json"
        path.write_text(json.dumps(self.result, indent=2, default=str) + "\n", encoding="utf-8")
        log(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)
    bench = Bench(args)

    def on_term(signum: int, _frame: Any) -> None:
        # once: the run then stops its stack and writes what it measured, undisturbed
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    result = bench.run()
    return 1 if result.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
