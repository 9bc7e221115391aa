"""Client CPU per table operation, the app's urllib3 transport against azure-core's requests transport
(``.venv/bin/python -m bench.sdk_cpu_transport [--ops 2000] [--rounds 3] [--threads 32]``).

Starts Azurite (in memory, tables only) on a free port. Each round runs, for each transport
(``shared.clients.http_transport`` / ``shared.clients.requests_transport``, the fallback; the order
alternates from round to round), one ``TableClient`` on it: ``--ops`` point reads
(``get_entity``), ``--ops`` ``$batch`` transactions of 3 upserts (the app's fast path,
``shared.table_batch.sender_for``) and, with ``--threads``, ``--ops`` of the two alternating over
that many threads. CPU per operation: ``getrusage`` (``bench.sdk_cpu_measure``), median round.
Printed, and written to ``--out``. A measurement, not a test: nothing asserts on the numbers.
"""

from __future__ import annotations

import argparse
import platform
import uuid
from collections.abc import Callable

from bench.jsonfile import write_json
from bench.sdk_cpu_measure import Result, in_threads, machine, sequential, timed
from bench.sdk_cpu_tables import BATCH_WRITES, WARMUP, _writes, entity, mixed_op
from local.azurite import start_azurite
from local.procs import REPO_ROOT

OUT = REPO_ROOT / "bench" / "results" / "sdk_cpu_transport.json"
TRANSPORTS = ("requests_transport", "http_transport")


def cases(conn_str: str, builder: str, ops: int, threads: int) -> list[Result]:
    """One transport's cases on a table of its own."""
    from shared import clients
    from shared.settings import Connection
    from shared.table_batch import sender_for

    transport = getattr(clients, builder)()
    label = type(transport).__name__
    service = clients.table_service_client(Connection("StateStorage", connection_string=conn_str), transport=transport)
    table = service.create_table_if_not_exists(f"sdkcputr{uuid.uuid4().hex[:8]}")
    batch = sender_for(table)
    for i in range(WARMUP):
        table.upsert_entity(entity("p", f"u{i}"))
        table.get_entity("p", f"u{i}")
        batch(f"w{i}", _writes(i))

    out = [timed(f"{label}: get_entity", ops, sequential(ops, lambda i: table.get_entity("p", f"u{i % WARMUP}"))),
           timed(f"{label}: $batch {batch.path} path ({BATCH_WRITES} upserts)", ops,
                 sequential(ops, lambda i: batch(f"b{i}", _writes(i))))]
    if threads > 1:
        out.append(timed(f"{label}: get/$batch alternating, {threads} threads", ops,
                         in_threads(threads, ops, mixed_op(table, batch)),
                         concurrency=threads))
    service.delete_table(table.table_name)
    return out


def median(rounds: list[list[Result]]) -> list[Result]:
    """Each case's median round by CPU per operation."""
    by_name: dict[str, list[Result]] = {}
    for r in (r for one in rounds for r in one):
        by_name.setdefault(r.name, []).append(r)
    return [sorted(rs, key=lambda r: r.cpu_us_per_op)[(len(rs) - 1) // 2] for rs in by_name.values()]


def run(conn_str: str, ops: int, rounds: int, threads: int, report: Callable[[Result], None]) -> list[list[Result]]:
    out = []
    for n in range(rounds):
        order = TRANSPORTS if n % 2 == 0 else TRANSPORTS[::-1]
        one = [r for builder in order for r in cases(conn_str, builder, ops, threads)]
        for r in one:
            report(r)
        out.append(one)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=32, help="threads of the concurrent case; 1: none")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    before = machine()
    az = start_azurite(in_memory=True, services=("table",))
    try:
        print(f"{args.ops} ops per case, {args.rounds} round(s); load {before['loadavg_1m']}", flush=True)
        rounds = run(az.connection_string, args.ops, args.rounds, args.threads,
                     lambda r: print(f"  {r.name:<60} {r.cpu_us_per_op:>7.0f} us CPU/op (sys {r.sys_us_per_op:>4.0f})"
                                     f" {r.ops_per_s:>6.0f} ops/s{f'  errors {r.errors}' if r.errors else ''}",
                                     flush=True))
    finally:
        az.stop()
    results = median(rounds)
    print(f"median of {args.rounds}:")
    for r in results:
        print(f"  {r.name:<60} {r.cpu_us_per_op:>7.0f} us CPU/op")
    doc = {"ops": args.ops, "rounds": args.rounds, "threads": args.threads,
           "machine": {**before, "loadavg_1m_after": machine()["loadavg_1m"], "python": platform.python_version()},
           "results": [r.as_dict() for r in results],
           "rounds_cpu_us_per_op": {r.name: [round(x.cpu_us_per_op, 1) for one in rounds for x in one
                                             if x.name == r.name] for r in results}}
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
