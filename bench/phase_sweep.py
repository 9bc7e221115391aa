"""The sweep phase: what one Supervisor sweep reads with N finished orders in the store.

After seeding, ``--leftover`` due index rows are put in right after a sweep, so that the next one
finds them; it and the steady sweep after it are measured from the counted requests. The bound is
at most due + 10 index rows read; each due row then costs a state point read and, for an ended
order, a read of its partition (at most 2 state reads per due row, reported apart).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bench import opcount
from bench.azraw import TableHttp
from bench.logline import log
from bench.seed import leftover_index_row, seed_finished

if TYPE_CHECKING:
    from bench.bench_state import BenchState


def state_tables(settings: dict[str, str]) -> tuple[str, str]:
    """The state and deadline tables' names in the stack's settings."""
    return settings.get("StateTable") or "orders", settings.get("DeadlineTable") or "deadlines"


def next_sweep(bench: BenchState, after: float, timeout: float) -> Any:
    """The first Supervisor invocation that started after ``after`` (the host log's)."""
    assert bench.hostlog is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        bench.hostlog.poll()
        got = [i for i in bench.hostlog.of("supervisor") if i.at > after]
        if got:
            return got[0]
        time.sleep(0.1)
    raise RuntimeError(f"no supervisor sweep within {timeout}s")


def _seed(bench: BenchState, label: str, n: int, state_table: str, deadline_table: str) -> None:
    az = bench.stack.azurite

    def progress(done: int, total: int, secs: float) -> None:
        rate = done / secs if secs else 0
        eta = (total - done) / rate if rate else 0
        print(f"  seeded {done:,}/{total:,} ({rate:,.0f} orders/s, ~{eta:,.0f}s left)", flush=True)

    seeding = seed_finished(az.host, az.table_port, state_table=state_table, deadline_table=deadline_table,
                            count=n, leftover=0, threads=bench.args.seed_threads, progress=progress)
    bench.result.setdefault("seeding", {})[label] = seeding
    log(f"  seeded {n:,} orders in {seeding['seconds']}s ({seeding['tx_per_s']} tx/s)")


def _put_leftovers(bench: BenchState, state_table: str, deadline_table: str) -> list[dict[str, Any]]:
    """Due index rows of finished orders (their delete lost); the deadline index as it then is."""
    az = bench.stack.azurite
    c = TableHttp(az.host, az.table_port)
    try:
        ids = [r["PartitionKey"] for r in c.query(state_table, "RowKey eq 'state' and ProcessState eq 'Processed'",
                                                  select="PartitionKey", limit=bench.args.leftover)]
        due = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=3)
        rows = [leftover_index_row(oid, due) for oid in ids]
        for i in range(0, len(rows), 100):
            c.batch(deadline_table, rows[i:i + 100])
        return c.query(deadline_table)
    finally:
        c.close()


def reads(w: dict[str, Any], state_table: str, deadline_table: str) -> dict[str, int]:
    """A sweep window's reads. The Supervisor's pass over the breakers (a point read and a waiting
    listing per remote, every run) is a fixed cost per run, not work on due rows: reported apart."""
    t = w["table"]
    breakers = {k: v for k, v in t.items() if opcount.is_read(k) and opcount.mark_of(k)}
    reading = {k: v for k, v in t.items() if opcount.is_read(k) and k not in breakers}

    def total(field: str, prefix: str = "") -> int:
        return sum(int(v[field]) for k, v in reading.items() if k.startswith(prefix))

    return {"entities_read": total("entities"),
            "index_entities_read": total("entities", deadline_table + "|"),
            "state_entities_read": total("entities", state_table + "|"),
            "state_read_requests": total("requests", state_table + "|"),
            "read_requests": total("requests"),
            "breaker_pass_read_requests": sum(int(v["requests"]) for v in breakers.values()),
            "table_requests": sum(int(v["requests"]) for v in t.values())}


def run(bench: BenchState, label: str, target: int) -> None:
    """Seed up to ``target`` finished orders, put the leftovers, measure the next two sweeps."""
    assert bench.hostlog is not None
    state_table, deadline_table = state_tables(bench.stack.settings)
    seeded_before = sum(v.get("orders", 0) for v in bench.result.get("seeding", {}).values())
    app_orders = sum(len(r.orders) for r in bench.runs)
    n = max(0, target - seeded_before)
    log(f"phase: sweep with {target:,} finished orders: seeding {n:,} finished orders "
        f"(one transaction each, {bench.args.seed_threads} threads)")
    t0 = time.time()
    _seed(bench, label, n, state_table, deadline_table)
    period = bench.args.supervisor_period
    first = next_sweep(bench, time.time(), timeout=period * 3 + 30)
    index_now = _put_leftovers(bench, state_table, deadline_table)
    now = datetime.now(UTC)
    due_rows = sum(1 for r in index_now if datetime.fromisoformat(r["Due"]) <= now)
    before = bench.snapshot()
    sweep_b = next_sweep(bench, first.at + 0.01, timeout=period * 3 + 30)
    mid = bench.snapshot()
    sweep_c = next_sweep(bench, sweep_b.at + 0.01, timeout=period * 3 + 30)
    w1, w2 = bench.window(before, mid), bench.window(mid, bench.snapshot())
    total_finished = seeded_before + n + app_orders
    b = {"duration_ms": sweep_b.duration_ms, **reads(w1, state_table, deadline_table), "table": w1["table"],
         "bus": w1["bus"]}
    c = {"duration_ms": sweep_c.duration_ms, **reads(w2, state_table, deadline_table), "table": w2["table"]}
    res = {"finished_orders_in_store": total_finished, "seeded": seeded_before + n, "app_orders": app_orders,
           "index_rows_in_table": len(index_now), "due_rows": due_rows, "sweep_with_due_rows": b, "sweep_steady": c,
           "reads_within_bound": (b["index_entities_read"] <= due_rows + 10
                                  and b["state_read_requests"] <= 2 * due_rows and c["entities_read"] <= 10)}
    bench.result.setdefault("sweep", {})[label] = res
    log(f"  sweep with {total_finished:,} finished orders and {due_rows} due rows: "
        f"{sweep_b.duration_ms} ms, {b['index_entities_read']} index + {b['state_entities_read']} state entities "
        f"read ({b['read_requests']} read requests, {b['state_read_requests']} of the state table); steady sweep "
        f"{sweep_c.duration_ms} ms, {c['entities_read']} entities read")
    bench.phase_windows.append((f"sweep {label}", t0, time.time()))
