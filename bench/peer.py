"""The peers measured the way the benchmark measures our app: ``python -m bench.peer [--peer temporal]``.

The peer (bench/peer_dbos, DBOS Transact on SQLite; or bench/peer_temporal) runs in a venv of its
own against the same remotes simulator, driven by the same load generator; its status events
reach a listener in the bench (``bench.peer_rig``) and are stamped on arrival. Phases: saturation
(``window`` in flight), latency (a fixed rate: ``rate``, or ``fraction`` of the peer's saturation),
and recovery (``recovery_orders`` in flight inside a slowed charge, the peer SIGKILLed and restarted:
time until every order is done, the ledger checked). ``measure_peer`` returns the figures
(``bench.versus`` calls it); the command writes ``bench/results/peer.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.calibrate import calibrate
from bench.load import phase_figures
from bench.logline import log
from bench.peer_dbos.venv import ensure_peer_venv
from bench.peer_rig import PeerRig
from bench.poll import wait_for
from bench.profiling import cpu_seconds
from local.procs import REPO_ROOT
from local.remotes.client import RemotesClient

RESULTS = REPO_ROOT / "bench" / "results"
FORWARD = ("inventory/reserve", "payment/charge", "shipping/ship")


def ledger_check(remotes: RemotesClient, order_ids: list[str]) -> dict[str, Any]:
    """No effect applied twice, and each of these orders' three forward effects applied once."""
    by_order = remotes.effects_by_order()
    incomplete = [o for o in order_ids if o not in by_order or any(by_order[o][e] != 1 for e in FORWARD)]
    return {"double_effects": len(remotes.duplicate_effects()), "orders": len(order_ids),
            "orders_without_exactly_one_of_each_effect": len(incomplete)}


def _cpu(rig: PeerRig) -> dict[str, float]:
    return {k: cpu_seconds(p) or 0.0 for k, p in rig.cpu_pids().items()}


def _with_cpu(res: dict[str, Any], before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    cpu = {k: round(after[k] - before[k], 2) for k in after}
    res["cpu_seconds"] = cpu
    n = res["processed"] + res["failed"]
    res["peer_cpu_ms_per_order"] = round(1000 * cpu["peer"] / n, 1) if n else None
    if "temporal server" in cpu:  # Temporal: the worker + front ("peer") and the dev server (its SQLite inside)
        both = cpu["peer"] + cpu["temporal server"]
        res["peer_and_server_cpu_ms_per_order"] = round(1000 * both / n, 1) if n else None
    return res


def phase_saturation(rig: PeerRig, window: int, seconds: float) -> dict[str, Any]:
    log(f"phase: saturation (closed loop, {window} orders in flight, {seconds:g}s)")
    r = rig.new_run("saturation", seed=1)
    speed = calibrate()["ms"]  # the machine's speed right now, as ours' saturation records it
    before = _cpu(rig)
    t0 = time.time()
    r.closed_loop(window, seconds, threads=min(32, window), progress=lambda s: print(s, flush=True))
    ok = r.wait_all(120)
    after = _cpu(rig)
    orders = r.collect()
    res = _with_cpu(phase_figures(orders, r.post_failures, ok), before, after)
    steady_from = t0 + min(5.0, seconds / 4)
    end = max((o.processed for o in orders if o.processed), default=time.time())
    in_steady = [o for o in orders if o.processed and steady_from <= o.processed <= end]
    res["steady_orders_per_s"] = round(len(in_steady) / (end - steady_from), 2) if end > steady_from else None
    res["calibration_ms"] = speed
    log(f"  saturation: {res['steady_orders_per_s']} orders/s (steady); p50 {res['latency_ms']['p50']} ms, "
        f"p99 {res['latency_ms']['p99']} ms; peer CPU {res['peer_cpu_ms_per_order']} ms/order")
    return res


def phase_latency(rig: PeerRig, rate: float, seconds: float) -> dict[str, Any]:
    log(f"phase: latency (fixed arrival rate {rate:.2f} orders/s for {seconds:g}s)")
    r = rig.new_run("latency", seed=2)
    before = _cpu(rig)
    r.open_loop(rate, seconds, threads=8, progress=lambda s: print(s, flush=True))
    ok = r.wait_all(120)
    res = _with_cpu(phase_figures(r.collect(), r.post_failures, ok), before, _cpu(rig))
    res["arrival_rate"] = round(rate, 2)
    log(f"  latency: {res['processed']}/{res['orders_posted']} done; p50 {res['latency_ms']['p50']} ms, "
        f"p95 {res['latency_ms']['p95']} ms, p99 {res['latency_ms']['p99']} ms; "
        f"peer CPU {res['peer_cpu_ms_per_order']} ms/order")
    return res


def _reserves(remotes: RemotesClient) -> int:
    return sum(remotes.stats()["requests"].get("inventory", {}).get("reserve", {}).values())


def phase_recovery(rig: PeerRig, orders: int, hang: float) -> dict[str, Any]:
    """SIGKILL the peer while ``orders`` orders wait inside charge-payment; restart it."""
    log(f"phase: recovery ({orders} orders inside charge-payment, payment slowed {hang:g}s, peer SIGKILLed)")
    rig.remotes.set_faults("payment", latencyMs=int(hang * 1000))
    r = rig.new_run("recovery", seed=3)
    try:
        reserves0 = _reserves(rig.remotes)
        ids = [oid for oid in (r._post_one() for _ in range(orders)) if oid]
        # every order reserved: its charge is under way at the remote
        wait_for(lambda: _reserves(rig.remotes) >= reserves0 + len(ids), 30, every=0.05)
        time.sleep(min(1.0, hang / 3))  # in the middle of the remote call
        rig.kill_peer()
        t_kill = time.time()
        rig.remotes.reset_faults()
        restart_s = rig.start_peer()
        ok = r.wait_all(120)
        with rig.listener.lock:
            done_at = max((rig.listener.terminal[oid][1] for oid in ids if oid in rig.listener.terminal), default=None)
        charges_replayed = rig.remotes.stats()["replays"].get("payment", {}).get("charge", 0)
        res = {"orders": len(ids), "payment_latency_s": hang, "all_finished": ok,
               "restart_to_ready_s": round(restart_s, 2),
               "kill_to_all_done_s": round(done_at - t_kill, 2) if done_at and ok else None,
               "charges_replayed_after_restart": charges_replayed,
               "ledger": ledger_check(rig.remotes, ids)}
    finally:
        rig.remotes.reset_faults()
    log(f"  recovery: every order done {res['kill_to_all_done_s']}s after the kill (restart to ready "
        f"{res['restart_to_ready_s']}s); ledger {res['ledger']}")
    return res


def measure_peer(out_dir: Path | None = None, *, window: int = 48, saturation_seconds: float = 40.0,
                 latency_seconds: float = 40.0, rate: float | None = None, fraction: float = 0.2,
                 warmup: int = 10, recovery_orders: int = 10, recovery_hang: float = 3.0,
                 skip_recovery: bool = False, echo: bool = False, peer: str = "dbos") -> dict[str, Any]:
    """Run the peer's phases and return the figures. ``rate``: the latency phase's arrival rate
    (bench/run.py passes the one it used for our app); None: ``fraction`` of the peer's saturation.
    ``peer``: "dbos" (bench/peer_dbos) or "temporal" (bench/peer_temporal)."""
    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        work = Path(out_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        t_venv = time.monotonic()
        if peer == "temporal":
            from bench.peer_temporal.rig import TemporalRig
            from bench.peer_temporal.venv import ensure_temporal_venv

            _, built = ensure_temporal_venv()
            about = {"peer": "Temporal (bench/peer_temporal: one worker, temporal server start-dev)",
                     "system_database": "SQLite (the dev server's, WAL journal)"}
        else:
            _, built = ensure_peer_venv()
            about = {"peer": "DBOS Transact (bench/peer_dbos)", "system_database": "SQLite (wal journal)"}
        result: dict[str, Any] = {**about,
                                  "venv_build_seconds": round(built, 1),
                                  "venv_check_seconds": round(time.monotonic() - t_venv, 2),
                                  "loadavg_1m_at_start": round(os.getloadavg()[0], 2), "nproc": os.cpu_count()}
        rig_of = (lambda: TemporalRig(work, echo=echo)) if peer == "temporal" else (lambda: PeerRig(work, echo=echo))
        with rig_of() as rig:
            result["peer_start_s"] = rig.peer_starts[0]
            w = rig.new_run("warmup", seed=0)
            w.open_loop(rate=max(2.0, warmup / 3), seconds=max(1.0, warmup / max(2.0, warmup / 3)), threads=4)
            w.wait_all(60)
            sat = phase_saturation(rig, window, saturation_seconds)
            fixed = rate if rate is not None else max(0.5, fraction * float(sat["steady_orders_per_s"] or 5.0))
            result["phases"] = {"saturation": sat, "latency": phase_latency(rig, fixed, latency_seconds)}
            if not skip_recovery:
                result["recovery"] = phase_recovery(rig, recovery_orders, recovery_hang)
            result["ledger_all_orders"] = ledger_check(rig.remotes, rig.order_ids())
        return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a short run (small counts)")
    ap.add_argument("--peer", choices=("dbos", "temporal"), default="dbos", help="which peer")
    ap.add_argument("--window", type=int, default=48, help="orders in flight at saturation")
    ap.add_argument("--saturation-seconds", type=float, default=40.0)
    ap.add_argument("--latency-seconds", type=float, default=40.0)
    ap.add_argument("--rate", type=float, default=None, help="the latency phase's arrival rate (orders/s)")
    ap.add_argument("--fraction", type=float, default=0.2, help="without --rate: this share of saturation")
    ap.add_argument("--recovery-orders", type=int, default=10)
    ap.add_argument("--recovery-hang", type=float, default=3.0, help="payment latency while the peer is killed")
    ap.add_argument("--skip-recovery", action="store_true")
    ap.add_argument("--out", default=None, help="default: bench/results/peer.json (temporal: peer-temporal.json)")
    ap.add_argument("--echo", action="store_true", help="echo the remotes' and the peer's output")
    a = ap.parse_args(argv)
    if a.smoke:
        a.window, a.saturation_seconds, a.latency_seconds, a.recovery_orders = 8, 5.0, 5.0, 4
    res = measure_peer(window=a.window, saturation_seconds=a.saturation_seconds, latency_seconds=a.latency_seconds,
                       rate=a.rate, fraction=a.fraction, recovery_orders=a.recovery_orders,
                       recovery_hang=a.recovery_hang, skip_recovery=a.skip_recovery, echo=a.echo, peer=a.peer)
    out = Path(a.out or RESULTS / ("peer-temporal.json" if a.peer == "temporal" else "peer.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    sat, lat = res["phases"]["saturation"], res["phases"]["latency"]
    log(f"peer: saturation {sat['steady_orders_per_s']} orders/s; at {lat['arrival_rate']} orders/s p50 "
        f"{lat['latency_ms']['p50']} ms, p99 {lat['latency_ms']['p99']} ms; peer CPU "
        f"{sat['peer_cpu_ms_per_order']} ms/order at saturation; recovery "
        f"{res.get('recovery', {}).get('kill_to_all_done_s')} s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
