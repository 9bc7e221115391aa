"""``bench.sdk_cpu``'s oversubscribed cases: P processes at once, each with K threads, as the app's
host instances (4 processes x 32 invoke threads on 2 CPUs) run; CPU per op summed over them.

Each child (spawned) runs one threaded case of ``bench.sdk_cpu_bus`` / ``bench.sdk_cpu_tables`` and
measures its own CPU; all start their timed part together (a shared event), so their threads
compete for the CPUs as the instances' do.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

from bench.sdk_cpu_measure import Result


def _child(kind: str, conn: str, ops: int, threads: int, start: Any, out: Any) -> None:
    from bench import sdk_cpu_bus, sdk_cpu_tables

    start.wait()
    try:
        if kind == "sb":
            r = sdk_cpu_bus.sync_send_threaded(conn, ops, threads)
        else:
            r = sdk_cpu_tables.threaded_mixed(conn, ops, threads)
        out.put(r.as_dict())
    except Exception as exc:  # reported, not hidden: the parent counts it as all errors
        out.put({"error": repr(exc), "ops": ops})


def oversubscribed(kind: str, conn: str, ops: int, threads: int, procs: int) -> Result:
    """``procs`` processes x ``threads`` threads, ``ops`` operations each; CPU summed, wall the longest."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    children = [ctx.Process(target=_child, args=(kind, conn, ops, threads, start, out)) for _ in range(procs)]
    for c in children:
        c.start()
    start.set()
    reports = [out.get(timeout=900) for _ in children]
    for c in children:
        c.join(timeout=60)
    ok = [r for r in reports if "error" not in r]
    what = "sb sync send" if kind == "sb" else "tables sync get/$batch alternating"
    return Result(f"{what}, {procs} procs x {threads} threads", sum(r["ops"] for r in ok),
                  sum(r["cpu_s"] for r in ok), max((r["wall_s"] for r in ok), default=0.0),
                  sum(r["errors"] for r in ok) + sum(r["ops"] for r in reports if "error" in r), procs * threads,
                  "; ".join(r["error"] for r in reports if "error" in r), sum(r["sys_s"] for r in ok))
