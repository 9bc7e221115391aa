"""Our app against the DBOS and Temporal peers in the same run (issues 15 and 31).

Once every process of our stack has stopped, :func:`measure` runs a peer (``bench.peer``) with our
window, phase durations and fixed arrival rate, and checks its counts (every order processed, no
effect twice). :func:`summarize` sets the figures side by side (``versusPeer``, ``versusTemporal``
in bench.json: ours, the peer's, ours/peer) and draws ``versus-peer.png``.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from pathlib import Path
from typing import Any

from bench.figures import pyplot, save
from bench.peer import measure_peer

PLOT_NAME = "versus-peer.png"
# (key, label, the plot's short label, unit, which way is better); every ratio is ours / peer
MEASURES = (
    ("saturation_orders_per_s", "saturation", "saturation", "orders/s", "higher"),
    ("p50_ms_at_fixed_rate", "p50 submit→done at the fixed rate", "p50, fixed rate", "ms", "lower"),
    ("p99_ms_at_fixed_rate", "p99 submit→done at the fixed rate", "p99, fixed rate", "ms", "lower"),
    ("app_cpu_ms_per_order", "CPU per order, the app's processes (saturation)", "CPU/order, app", "ms", "lower"),
    ("stack_cpu_ms_per_order", "CPU per order, the whole stack (saturation)", "CPU/order, stack", "ms", "lower"),
    ("recovery_s", "recovery after SIGKILL mid-step", "recovery, SIGKILL", "s", "lower"),
)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--skip-peer", action="store_true", help="do not measure the peers after our stack")
    ap.add_argument("--peers", default="dbos,temporal",
                    help="the peers measured after our stack, comma-separated (dbos, temporal)")
    ap.add_argument("--peer-recovery-orders", type=int, default=10,
                    help="orders in flight when the peer is SIGKILLed (the smoke run: 3)")


def smoke_args(args: argparse.Namespace) -> None:
    args.peer_recovery_orders = min(args.peer_recovery_orders, 3)


# the peer's name → its key in bench.json, its ratios' key, its label
PEERS = {"dbos": ("peer", "versusPeer", "DBOS"), "temporal": ("peer_temporal", "versusTemporal", "Temporal")}


def measure_all(args: argparse.Namespace, result: dict[str, Any], windows: list[tuple[str, float, float]]) -> None:
    """Each peer of ``--peers`` in turn, into bench.json's ``peer`` (DBOS) and ``peer_temporal``."""
    for name in [p.strip() for p in args.peers.split(",") if p.strip()]:
        result[PEERS[name][0]] = measure(args, result, windows, peer=name)


def measure(args: argparse.Namespace, result: dict[str, Any],
            windows: list[tuple[str, float, float]], peer: str = "dbos") -> dict[str, Any]:
    """The peer's phases, sized like ours, at our latency phase's arrival rate. Call it only once
    our stack is stopped. A failure is recorded, not raised: our figures stand without the peer's."""
    ours_latency = (result.get("phases") or {}).get("latency") or {}
    t0 = time.time()
    label = PEERS[peer][2]
    print(f"[{time.strftime('%H:%M:%S')}] phase: the {label} peer (our stack stopped; load average "
          f"{os.getloadavg()[0]:.2f})", flush=True)
    try:
        out = measure_peer(peer=peer, window=args.window, saturation_seconds=args.saturation_seconds,
                           latency_seconds=args.latency_seconds, rate=ours_latency.get("arrival_rate"),
                           warmup=args.warmup, recovery_orders=args.peer_recovery_orders,
                           recovery_hang=args.recovery_hang, skip_recovery=args.skip_recovery)
        out["consistency"] = consistency(out)
    except Exception as e:  # noqa: BLE001 - reported in bench.json; our own figures are kept
        out = {"error": repr(e), "traceback": traceback.format_exc()}
    windows.append((f"peer ({label})", t0, time.time()))
    return out


def consistency(peer: dict[str, Any]) -> dict[str, Any]:
    """Counts only: each phase's orders in were all processed, and the simulator's ledger holds
    every order's three effects once and no effect twice (recovery's orders included)."""
    phases = peer.get("phases") or {}
    in_out = {name: {"posted": ph["orders_posted"], "post_failures": ph["post_failures"],
                     "processed": ph["processed"], "failed": ph["failed"]} for name, ph in phases.items()}
    rec = peer.get("recovery") or {}
    if rec:
        in_out["recovery"] = {"posted": rec["orders"], "post_failures": 0,
                              "processed": rec["orders"] if rec.get("all_finished") else 0, "failed": 0}
    ledger = peer.get("ledger_all_orders") or {}
    ok = (all(c["processed"] == c["posted"] and not c["post_failures"] for c in in_out.values())
          and ledger.get("double_effects") == 0 and ledger.get("orders_without_exactly_one_of_each_effect") == 0
          and (not rec or rec["ledger"]["double_effects"] == 0))
    return {"orders_in_and_processed": in_out, "ledger": ledger, "consistent": ok}


def _ours(result: dict[str, Any]) -> dict[str, float | None]:
    phases = result.get("phases") or {}
    sat, lat = phases.get("saturation") or {}, phases.get("latency") or {}
    cpu = (result.get("where_time_goes") or {}).get("cpu_ms_per_order") or {}
    return {"saturation_orders_per_s": (sat.get("steady") or {}).get("orders_per_s") or sat.get("orders_per_s"),
            "p50_ms_at_fixed_rate": (lat.get("latency_ms") or {}).get("p50"),
            "p99_ms_at_fixed_rate": (lat.get("latency_ms") or {}).get("p99"),
            "app_cpu_ms_per_order": cpu.get("host instances (the app)"),
            "stack_cpu_ms_per_order": round(sum(cpu.values()), 1) if cpu else None,
            "recovery_s": (result.get("recovery") or {}).get("recovered_s")}


def _peer(peer: dict[str, Any]) -> dict[str, float | None]:
    phases = peer.get("phases") or {}
    sat, lat = phases.get("saturation") or {}, phases.get("latency") or {}
    cpu = sat.get("cpu_seconds") or {}
    n = (sat.get("processed") or 0) + (sat.get("failed") or 0)
    # DBOS: its process (SQLite inside it); Temporal: the worker + front and the dev server
    app = cpu.get("peer", 0.0) + cpu.get("temporal server", 0.0)
    return {"saturation_orders_per_s": sat.get("steady_orders_per_s") or sat.get("orders_per_s"),
            "p50_ms_at_fixed_rate": (lat.get("latency_ms") or {}).get("p50"),
            "p99_ms_at_fixed_rate": (lat.get("latency_ms") or {}).get("p99"),
            "app_cpu_ms_per_order": round(1000 * app / n, 1) if n and cpu else None,
            "stack_cpu_ms_per_order": round(1000 * sum(cpu.values()) / n, 1) if n and cpu else None,
            "recovery_s": (peer.get("recovery") or {}).get("kill_to_all_done_s")}


def _peer_machine_share(peer: dict[str, Any]) -> float | None:
    sat = (peer.get("phases") or {}).get("saturation") or {}
    wall, nproc = sat.get("seconds") or 0, peer.get("nproc") or 1
    return round(sum((sat.get("cpu_seconds") or {}).values()) / (wall * nproc), 3) if wall else None


def versus(result: dict[str, Any], peer_key: str = "peer") -> dict[str, Any] | None:
    """Ours, the peer's and ours/peer for each measure; None when the peer (bench.json's ``peer_key``)
    was not measured."""
    peer = result.get(peer_key)
    if not peer or "error" in peer or "phases" not in peer:
        return None
    ours, theirs = _ours(result), _peer(peer)
    rows = {}
    for key, label, short, unit, better in MEASURES:
        a, b = ours[key], theirs[key]
        rows[key] = {"label": label, "short": short, "unit": unit, "better": better, "ours": a, "peer": b,
                     "ours_over_peer": round(a / b, 2) if a is not None and b else None}
    lat = (result.get("phases") or {}).get("latency") or {}
    return {"measures": rows, "fixed_rate_orders_per_s": lat.get("arrival_rate"),
            "peer_fixed_rate_orders_per_s": peer["phases"]["latency"].get("arrival_rate"),
            "peer_system_database": peer.get("system_database"),
            "loadavg_1m": {"ours_at_start": result["machine"]["loadavg_at_start"][0],
                           "peer_at_start": peer.get("loadavg_1m_at_start")},
            # how much of the machine each stack got at saturation: well under 1 with other work beside it
            "machine_cpu_share_at_saturation": {"ours": (result.get("where_time_goes") or {}).get(
                "machine_cpu_used_share"), "peer": _peer_machine_share(peer)},
            # bench.calibrate right before each saturation phase (ms; lower is faster): this machine's
            # speed drifts, and ratios of two phases measured at different speeds mislead
            "calibration_ms_before_saturation": {
                "ours": ((result.get("phases") or {}).get("saturation") or {}).get("calibration_ms"),
                "peer": peer["phases"].get("saturation", {}).get("calibration_ms")},
            "peer_name": peer.get("peer"), "notes": NOTES[peer_key]}


NOTES = {
    "peer": ["ours: the whole local stack (Functions host instances, Service Bus emulator, Azurite, "
             "remotes, the bench); peer: one DBOS process (its system database inside it with SQLite), "
             "remotes, the bench; measured one after the other, never together",
             "recovery: ours, one order's step re-sent after its CompleteBy by the supervisor (no restart); "
             "peer, every in-flight order done after the bench restarts the killed process at once"],
    "peer_temporal": ["peer app CPU: the Temporal worker process (the workflow and activity code, the SDK's "
                      "Rust core, and the HTTP front, in one process) plus the dev server (temporal server "
                      "start-dev: frontend, history, matching, its SQLite inside); the stack adds the remotes "
                      "and the bench",
                      "recovery: the worker + front SIGKILLed and restarted at once; a step in flight runs again "
                      "once its attempt timeout (12 s) expires on the server"]}


def plot(vs: dict[str, dict[str, Any]], path: Path) -> str:
    """A bar chart per measure: ours beside each measured peer's (``vs``: label → its versus())."""
    plt = pyplot()
    labels = list(vs)
    first = vs[labels[0]]
    keys = list(first["measures"])
    colors = ["tab:blue", "tab:orange", "tab:green"]
    fig, axes = plt.subplots(1, len(keys), figsize=(2.2 * len(keys), 3.6), dpi=90)
    for ax, key in zip(axes, keys, strict=True):
        row = first["measures"][key]
        names = ["ours", *labels]
        vals = [row["ours"], *(vs[lb]["measures"][key]["peer"] for lb in labels)]
        bars = ax.bar(names, [v or 0.0 for v in vals], color=colors[:len(names)])
        for bar, val in zip(bars, vals, strict=True):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), "n/a" if val is None else f"{val:g}",
                    ha="center", va="bottom", fontsize=7)
        ratios = ", ".join(f"{lb} {vs[lb]['measures'][key]['ours_over_peer']}" for lb in labels)
        ax.set_title(f"{row['short']}\n({row['unit']}, {row['better']} is better)\nours/ {ratios}", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.margins(y=0.12)
    fig.suptitle(f"Our app vs {' and '.join(labels)}, same run, one after the other (fixed rate "
                 f"{first['fixed_rate_orders_per_s']} orders/s)", fontsize=9)
    return save(fig, path)


def summarize(bench: Any) -> None:
    """After bench.report's summary: the side-by-side figures for each peer measured, in bench.json
    (``versusPeer``: DBOS, ``versusTemporal``) and in one plot."""
    r = bench.result
    vs: dict[str, dict[str, Any]] = {}
    for key, vkey, label in PEERS.values():
        if key in r:
            r[vkey] = v = versus(r, key)
            if v is not None:
                vs[label] = v
    if vs and not bench.args.no_plots:
        try:
            r.setdefault("plots", {})["versus_peer"] = plot(vs, bench.out_dir / PLOT_NAME)
        except Exception as e:  # noqa: BLE001
            r.setdefault("plots", {})["versus_peer"] = {"error": repr(e)}
