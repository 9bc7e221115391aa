"""Client-side CPU per Azure SDK operation on the local stack, sync against aio
(``.venv/bin/python -m bench.sdk_cpu [--ops 2000] [--threads 8,32] [--procs 4] [--rounds 1] [--quick]``).

Starts Azurite (in memory, tables only) and the Service Bus emulator (``local.servicebus``) on
free loopback ports, runs every case of ``bench.sdk_cpu_bus`` and ``bench.sdk_cpu_tables`` in
this process, and the oversubscribed ones (``bench.sdk_cpu_procs``: ``--procs`` processes x the
largest thread count) in children; reports CPU per operation (``getrusage``, user + system, every
thread; the emulator's and Azurite's CPU is not in it; the system share apart) and operations/s
of wall time. With ``--rounds`` > 1 each case's median round (by CPU per op) is kept. Then it
estimates the client CPU of one order (``--sends`` sends, ``--batches`` $batch transactions and
``--reads`` point reads) for each way of sending. Printed, and written to
``bench/results/sdk_cpu.json``. It is a measurement, not a test: nothing asserts on the numbers.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import sdk_cpu_bus as bus
from bench import sdk_cpu_tables as tables
from bench.jsonfile import write_json
from bench.sdk_cpu_measure import Result, machine
from bench.sdk_cpu_procs import oversubscribed
from local.azurite import start_azurite
from local.connections import servicebus_connection_string
from local.procs import REPO_ROOT, Proc, free_port

OUT = REPO_ROOT / "bench" / "results" / "sdk_cpu.json"


def sb_config() -> dict[str, Any]:
    """The emulator's Config.json: the bench queues, with duplicate detection as the app's queues."""
    props = {"DeadLetteringOnMessageExpiration": False, "DefaultMessageTimeToLive": "PT1H",
             "DuplicateDetectionHistoryTimeWindow": "PT5M", "LockDuration": "PT1M", "MaxDeliveryCount": 10,
             "RequiresDuplicateDetection": True, "RequiresSession": False}
    queues = [{"Name": q, "Properties": props} for q in (*bus.QUEUES, bus.RECEIVE_QUEUE)]
    return {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": queues, "Topics": []}],
                           "Logging": {"Type": "File"}}}


def start_servicebus(work: Path) -> tuple[Proc, str]:
    cfg = work / "Config.json"
    cfg.write_text(json.dumps(sb_config()), encoding="utf-8")
    port = free_port()
    proc = Proc("servicebus", [sys.executable, "-m", "local.servicebus", "--config", str(cfg), "--host", "127.0.0.1",
                               "--port", str(port), "--data-dir", str(work / "data")]).start("ready", timeout=60)
    return proc, servicebus_connection_string("127.0.0.1", port)


def one_round(sb_conn: str, az: Any, ops: int, threads: list[int], procs: int) -> list[Result]:
    results: list[Result] = []
    for _key, run in bus.cases(sb_conn, threads):
        results.append(run(ops))
        print_row(results[-1])
    if procs > 1:
        results.append(oversubscribed("sb", sb_conn, ops // procs, max(threads), procs))
        print_row(results[-1])
    for r in [*tables.sync_cases(az.connection_string, ops, threads),
              *([oversubscribed("tables", az.connection_string, ops // procs, max(threads), procs)] if procs > 1
                else []),
              *tables.aio_cases(az.connection_string, ops, threads),
              *tables.raw_cases(az.host, az.table_port, ops)]:
        results.append(r)
        print_row(r)
    return results


def median_rounds(rounds: list[list[Result]]) -> list[Result]:
    """Per case, the round whose CPU per op is the median."""
    out = []
    for same in zip(*rounds, strict=True):
        ranked = sorted(same, key=lambda r: r.cpu_us_per_op)
        out.append(ranked[(len(ranked) - 1) // 2])
    return out


def print_row(r: Result) -> None:
    err = f"  errors {r.errors}" if r.errors else ""
    print(f"  {r.name:<58} {r.cpu_us_per_op:>7.0f} us CPU/op (sys {r.sys_us_per_op:>5.0f}) "
          f"{r.ops_per_s:>7.0f} ops/s{err}", flush=True)


def by_name(results: list[Result], prefix: str) -> Result | None:
    return next((r for r in results if r.name.startswith(prefix)), None)


def estimate(results: list[Result], sends: int, batches: int, reads: int, k: int, procs: int) -> dict[str, Any]:
    """Client CPU (ms) per order for each way of sending, from the measured per-op figures."""
    def us(prefix: str) -> float:
        r = by_name(results, prefix)
        return r.cpu_us_per_op if r else float("nan")

    sync_batch, sync_get = us("tables sync $batch"), us("tables sync get_entity")
    ways = {
        "sync, sequential": (us("sb sync send, sequential"), sync_batch, sync_get),
        f"sync, {k} threads": (us(f"sb sync send, {k} threads"), us(f"tables sync get/$batch alternating, {k} "),
                               us(f"tables sync get/$batch alternating, {k} ")),
        f"sync, {procs} procs x {k} threads": (us(f"sb sync send, {procs} procs"),
                                               us(f"tables sync get/$batch alternating, {procs} procs"),
                                               us(f"tables sync get/$batch alternating, {procs} procs")),
        "aio, sequential (tables: aio get for reads, sync $batch)": (us("sb aio send, sequential"), sync_batch,
                                                                      us("tables aio get_entity")),
        f"aio, {k} tasks on one loop (tables as above)": (us(f"sb aio send, {k} tasks"), sync_batch,
                                                          us(f"tables aio get_entity, {k} tasks")),
        "sync bus + raw http.client tables": (us("sb sync send, sequential"), us("raw http.client $batch"),
                                              us("raw http.client get")),
    }
    out = {}
    for name, (send, batch, read) in ways.items():
        bus_ms, tab_ms = sends * send / 1000, (batches * batch + reads * read) / 1000
        out[name] = {"bus_ms": round(bus_ms, 2), "tables_ms": round(tab_ms, 2), "total_ms": round(bus_ms + tab_ms, 2)}
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.sdk_cpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=2000, help="operations per case")
    ap.add_argument("--threads", default="8,32", help="thread / task counts of the concurrent cases")
    ap.add_argument("--procs", type=int, default=4,
                    help="processes of the oversubscribed cases (each with the largest thread count); 1: none")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every case; the median round is kept")
    ap.add_argument("--quick", action="store_true", help="smoke run: 60 ops, 1 round, 8 threads")
    ap.add_argument("--sends", type=int, default=11, help="bus sends per order (estimate)")
    ap.add_argument("--batches", type=int, default=4, help="$batch transactions per order (estimate)")
    ap.add_argument("--reads", type=int, default=2, help="point reads per order (estimate)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    if args.quick:
        args.ops, args.rounds, args.threads, args.procs = 60, 1, "8", 2
    args.threads = [int(t) for t in str(args.threads).split(",") if t]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-sdkcpu-"))
    before = machine()
    sb_proc, sb_conn = start_servicebus(work)
    az = None
    try:
        az = start_azurite(in_memory=True, services=("table",))
        print(f"{args.ops} ops per case, {args.rounds} round(s), threads {args.threads}; load {before['loadavg_1m']}")
        rounds = []
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            rounds.append(one_round(sb_conn, az, args.ops, args.threads, args.procs))
    finally:
        if az is not None:
            az.stop()
        sb_proc.stop()
    results = median_rounds(rounds)
    k = max(args.threads)
    per_order = estimate(results, args.sends, args.batches, args.reads, k, args.procs)
    print(f"\nclient CPU per order ({args.sends} sends, {args.batches} $batch, {args.reads} reads), "
          f"median round of {args.rounds}:")
    for name, e in per_order.items():
        print(f"  {name:<58} bus {e['bus_ms']:>6.2f} ms + tables {e['tables_ms']:>5.2f} ms = {e['total_ms']:>6.2f} ms")
    doc = {"ops": args.ops, "rounds": args.rounds, "threads": args.threads,
           "machine": {**before, "loadavg_1m_after": machine()["loadavg_1m"], "python": platform.python_version()},
           "results": [r.as_dict() for r in results],
           "rounds_cpu_us_per_op": {r0.name: [round(x.cpu_us_per_op, 1) for x in same]
                                    for r0, same in zip(results, zip(*rounds, strict=True), strict=True)},
           "per_order_estimate": {"sends": args.sends, "batches": args.batches, "reads": args.reads,
                                  "ways": per_order}}
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
