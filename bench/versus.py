"""Our app against the DBOS peer in the same benchmark run (issue 15, "A peer in the same run").

bench/run.py measures our stack, stops every process of it, then calls :func:`measure` here: the
peer (bench/peer.py's ``measure_peer``, the same remotes simulator and the same load generator)
runs on the same machine with the same window, phase durations and fixed arrival rate as ours,
so the two never share the CPU. :func:`summarize` then sets the figures side by side
(``versusPeer`` in bench.json: ours, the peer's, and ours/peer), checks the peer's counts
(``peer.consistency``: every order in was processed, no effect twice in the simulator's ledger;
never a speed), prints them and draws ``versus-peer.png``.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from pathlib import Path
from typing import Any

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
    ap.add_argument("--skip-peer", action="store_true", help="do not measure the DBOS peer after our stack")
    ap.add_argument("--peer-db", choices=("sqlite", "postgres"), default="sqlite",
                    help="the peer's system database (postgres: Debian's, started by the run)")
    ap.add_argument("--peer-recovery-orders", type=int, default=10,
                    help="orders in flight when the peer is SIGKILLed (the smoke run: 3)")


def smoke_args(args: argparse.Namespace) -> None:
    args.peer_recovery_orders = min(args.peer_recovery_orders, 3)


def measure(args: argparse.Namespace, result: dict[str, Any],
            windows: list[tuple[str, float, float]]) -> dict[str, Any]:
    """The peer's phases, sized like ours, at our latency phase's arrival rate. Call it only once
    our stack is stopped. A failure is recorded, not raised: our figures stand without the peer's."""
    ours_latency = (result.get("phases") or {}).get("latency") or {}
    t0 = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] phase: the DBOS peer (our stack stopped; load average "
          f"{os.getloadavg()[0]:.2f})", flush=True)
    try:
        peer = measure_peer(window=args.window, saturation_seconds=args.saturation_seconds,
                            latency_seconds=args.latency_seconds, rate=ours_latency.get("arrival_rate"),
                            warmup=args.warmup, recovery_orders=args.peer_recovery_orders,
                            recovery_hang=args.recovery_hang, skip_recovery=args.skip_recovery,
                            system_db=args.peer_db)
        peer["consistency"] = consistency(peer)
    except Exception as e:  # noqa: BLE001 - reported in bench.json; our own figures are kept
        peer = {"error": repr(e), "traceback": traceback.format_exc()}
    windows.append(("peer (DBOS)", t0, time.time()))
    return peer


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
    app = cpu.get("peer", 0.0) + cpu.get("postgres", 0.0)  # SQLite runs inside the peer's process
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


def versus(result: dict[str, Any]) -> dict[str, Any] | None:
    """Ours, the peer's and ours/peer for each measure; None when the peer was not measured."""
    peer = result.get("peer")
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
            "notes": ["ours: the whole local stack (Functions host instances, Service Bus emulator, Azurite, "
                      "remotes, the bench); peer: one DBOS process (its system database inside it with SQLite), "
                      "remotes, the bench; measured one after the other, never together",
                      "recovery: ours, one order's step re-sent after its CompleteBy by the supervisor (no restart); "
                      "peer, every in-flight order done after the bench restarts the killed process at once"]}


def summary_lines(v: dict[str, Any]) -> list[str]:
    share, load = v["machine_cpu_share_at_saturation"], v["loadavg_1m"]
    out = [f"ours vs the DBOS peer ({v['peer_system_database']}), same run, one after the other "
           f"(fixed rate {v['fixed_rate_orders_per_s']} orders/s; share of the machine used at saturation: "
           f"ours {share['ours']}, peer {share['peer']}; 1-min load at start: ours {load['ours_at_start']:.1f}, "
           f"peer {load['peer_at_start']}):"]
    for row in v["measures"].values():
        out.append(f"  {row['label']}: ours {row['ours']} {row['unit']}, peer {row['peer']} {row['unit']}, "
                   f"ours/peer {row['ours_over_peer']} ({row['better']} is better)")
    return out


def plot(v: dict[str, Any], path: Path) -> str:
    """A bar chart per measure, ours beside the peer's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(v["measures"].values())
    fig, axes = plt.subplots(1, len(rows), figsize=(2.0 * len(rows), 3.4), dpi=90)
    for ax, row in zip(axes, rows, strict=True):
        vals = [row["ours"] or 0.0, row["peer"] or 0.0]
        bars = ax.bar(["ours", "peer"], vals, color=["tab:blue", "tab:orange"])
        for bar, val in zip(bars, (row["ours"], row["peer"]), strict=True):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), "n/a" if val is None else f"{val:g}",
                    ha="center", va="bottom", fontsize=7)
        ratio = row["ours_over_peer"]
        ax.set_title(f"{row['short']}\n({row['unit']}, {row['better']} is better)\nours/peer "
                     f"{'n/a' if ratio is None else ratio}", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.margins(y=0.12)
    fig.suptitle(f"Our app vs the DBOS peer, same run (fixed rate {v['fixed_rate_orders_per_s']} orders/s)",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def summarize(bench: Any) -> None:
    """After bench.report's summary: the side-by-side figures, printed, in bench.json and plotted."""
    r = bench.result
    if "peer" not in r:
        return
    v = versus(r)
    r["versusPeer"] = v
    if v is None:
        print(f"DBOS peer: not measured ({(r['peer'] or {}).get('error')})", flush=True)
        return
    if not bench.args.no_plots:
        try:
            r.setdefault("plots", {})["versus_peer"] = plot(v, bench.out_dir / PLOT_NAME)
        except Exception as e:  # noqa: BLE001
            r.setdefault("plots", {})["versus_peer"] = {"error": repr(e)}
    lines = summary_lines(v)
    c = r["peer"].get("consistency") or {}
    lines.append(f"  peer counts consistent (orders in = processed, no double effect): {c.get('consistent')}")
    print("\n".join(lines), flush=True)
