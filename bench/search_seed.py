"""Orders for the search benchmark (``bench.search_cost``), in the app's own row layout.

Each seeded order is a typed ``OrderRow`` + ``StateRow``; its index rows are exactly those
``shared.core.statemachine.search_index.index_rows`` makes. Finished orders (90% Processed, 10%
cancelled, over the last ``SPAN_DAYS`` days, one in ten customer ``c-big``'s) get only their index
rows (a search never reads their state row): through the table API in transactions of 100 rows
(:func:`seed_api`), or, past a few thousand, loaded into a stopped Azurite's database file by
``bench/loki_bulk.js`` (:func:`bulk_load`): through the API each insert into one partition scans
that partition, so 400,000 index rows would take hours. Live orders (:func:`seed_live`: held,
failed and compensated, in flight) get their ``order`` and ``state`` rows too.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.azraw import TableHttp, run_parallel
from bench.seed import _odata
from local.connections import AZURITE_ACCOUNT

SPAN_DAYS = 20
BIG_CUSTOMER = "c-big"
INDEX_BATCH = 100
ROWS_PER_FINISHED = 4  # all, cust, cat, fin
LOADER = Path(__file__).resolve().parent / "loki_bulk.js"
AZURITE_DB = "__azurite_db_table__.json"
ITEMS = [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}]
Progress = Callable[[str], None]


def _order_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


def _customer(i: int) -> str:
    return BIG_CUSTOMER if i % 10 == 0 else f"c-{i % 997:04d}"


def finished_order(i: int, now: datetime) -> tuple[Any, Any]:
    """(OrderRow, StateRow) of the ``i``-th finished order (deterministic in ``i`` and ``now``)."""
    from shared.core.statemachine import OrderRow, StateRow
    from shared.core.states import Mode, Outcome, ProcessState

    rng = random.Random(i)
    created = now - timedelta(seconds=rng.uniform(3600, SPAN_DAYS * 86400))
    finished = created + timedelta(seconds=rng.uniform(0.2, 5))
    order = OrderRow(customer_id=_customer(i), currency="EUR", items=ITEMS, total="19.98", priority="normal",
                     created_at=created)
    ok = rng.random() < 0.9
    state = StateRow(order_id=_order_id(rng), process_state=ProcessState.PROCESSED if ok else ProcessState.ERROR,
                     mode=Mode.FINISHED, outcome=Outcome.PROCESSED if ok else Outcome.CANCELLED, step_index=3,
                     created_at=created, updated_at=finished, finished_at=finished, event_seq=8 if ok else 2)
    return order, state


def live_order(kind: str, i: int, now: datetime) -> tuple[Any, Any]:
    """(OrderRow, StateRow) of an order that is ``held``, ``failed`` (compensated, waiting for
    an operator's decision) or ``inFlight`` (charging the payment)."""
    from shared.core.statemachine import Lease, OrderRow, StateRow
    from shared.core.states import Mode, OrderCompensation, Outcome, ProcessState

    rng = random.Random(f"{kind}-{i}")
    created = now - timedelta(seconds=rng.uniform(600, SPAN_DAYS * 86400))
    order = OrderRow(customer_id=_customer(i), currency="EUR", items=ITEMS, total="19.98", priority="normal",
                     created_at=created)
    base: dict[str, Any] = {"order_id": _order_id(rng), "created_at": created, "updated_at": created, "step_index": 1,
                            "step_name": "charge-payment", "attempt": 1, "event_seq": 4}
    if kind == "inFlight":
        state = StateRow(process_state=ProcessState.PROCESSING, mode=Mode.FORWARD, locked_by="bench",
                         lease=Lease.for_step("charge-payment", 1), complete_by=now + timedelta(hours=1), **base)
    elif kind == "held":
        state = StateRow(process_state=ProcessState.ERROR, mode=Mode.HELD, outcome=Outcome.HELD, failure_count=3,
                         failed_step="charge-payment", reason="timed out", **base)
    else:
        state = StateRow(process_state=ProcessState.ERROR, mode=Mode.FINISHED, outcome=Outcome.FAILED,
                         compensation_state=OrderCompensation.COMPLETED, failed_step="charge-payment",
                         reason="card declined", finished_at=created, **base)
    return order, state


def index_entities(order: Any, state: Any) -> list[dict[str, Any]]:
    """The order's search index rows as the app writes them, as table entities."""
    from shared.core.statemachine import index_rows
    from shared.storage.store import SEARCH_SHARDS, shard_of

    return [_odata({**row.to_entity(), "PartitionKey": shard_of(row.row_key, SEARCH_SHARDS)})
            for row in index_rows(order, state)]


def _finished_entities(lo: int, hi: int, now: datetime) -> list[dict[str, Any]]:
    return [e for i in range(lo, hi) for e in index_entities(*finished_order(i, now))]


def seed_api(host: str, port: int, index_table: str, start: int, count: int, now: datetime, *,
             threads: int = 6, progress: Progress | None = None) -> dict[str, Any]:
    """Finished orders ``start`` .. ``start + count - 1``: their index rows, ``per_batch`` orders a job,
    one transaction per shard of the index they fall in (an order's rows share one)."""
    per_batch = INDEX_BATCH // ROWS_PER_FINISHED  # an order's rows are never split (they share a shard)
    sent: list[int] = []  # a transaction each (list.append is atomic across the threads)

    def job(lo: int, hi: int) -> Callable[[TableHttp], None]:
        def run(c: TableHttp) -> None:
            shards: dict[str, list[dict[str, Any]]] = {}
            for e in _finished_entities(lo, hi, now):
                shards.setdefault(e["PartitionKey"], []).append(e)
            for rows in shards.values():  # a transaction is one partition's (at most a job's 100 rows)
                c.batch(index_table, rows)
                sent.append(len(rows))
        return run

    def jobs() -> Iterator[Callable[[TableHttp], None]]:
        for lo in range(start, start + count, per_batch):
            yield job(lo, min(lo + per_batch, start + count))

    t0 = time.perf_counter()
    batches = -(-count // per_batch)
    last = [t0]

    def prog(n: int) -> None:
        if progress is not None and (n == batches or time.perf_counter() - last[0] >= 5.0):
            last[0] = time.perf_counter()
            progress(f"  index (API, {per_batch} orders a job): {min(n * per_batch, count):,}/{count:,} "
                     f"finished orders ({n * per_batch / (last[0] - t0):,.0f}/s)")

    run_parallel(host, port, jobs(), threads, prog)
    secs = time.perf_counter() - t0
    return {"method": "api", "orders": count, "index_rows": ROWS_PER_FINISHED * count, "jobs": batches,
            "transactions": len(sent), "rows_sent": sum(sent),
            "threads": threads, "seconds": round(secs, 2), "orders_per_s": round(count / secs, 1) if secs else None}


def _jsonl(bounds: tuple[int, int, str]) -> str:
    lo, hi, now = bounds
    return "".join(json.dumps(e) + "\n" for e in _finished_entities(lo, hi, datetime.fromisoformat(now)))


def bulk_load(azurite: Any, index_table: str, start: int, count: int, now: datetime, *,
              progress: Progress | None = None) -> dict[str, Any]:
    """The same rows as :func:`seed_api`, loaded into a persistent Azurite's database file
    while it is stopped (``bench/loki_bulk.js``); Azurite is restarted on the same ports."""
    node = shutil.which("node")
    if node is None or azurite.location is None:
        raise RuntimeError("bulk loading needs node and a persistent Azurite (a location)")
    t0 = time.perf_counter()
    azurite.stop()  # SIGINT: azurite-table saves its database first
    collection = f"{AZURITE_ACCOUNT}${index_table}"
    loader = subprocess.Popen([node, str(LOADER), str(azurite.location / AZURITE_DB), collection],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert loader.stdin is not None
    chunk = 2000
    ranges = [(lo, min(lo + chunk, start + count), now.isoformat()) for lo in range(start, start + count, chunk)]
    try:
        with multiprocessing.get_context("fork").Pool() as pool:
            for k, text in enumerate(pool.imap(_jsonl, ranges)):
                loader.stdin.write(text)
                if progress is not None and (k + 1) % 10 == 0:
                    progress(f"  index (bulk load): {min((k + 1) * chunk, count):,}/{count:,} finished orders")
        loader.stdin.close()
        assert loader.stdout is not None
        out = loader.stdout.read()
        loader.wait(timeout=600)
    finally:
        if loader.poll() is None:
            loader.kill()
    if loader.returncode != 0:
        raise RuntimeError(f"loki_bulk.js failed ({loader.returncode}): {out[-500:]}")
    loaded = time.perf_counter() - t0
    azurite.restart()
    secs = time.perf_counter() - t0
    return {"method": "bulk", "orders": count, "index_rows": json.loads(out.strip().splitlines()[-1])["inserted"],
            "load_seconds": round(loaded, 2), "seconds": round(secs, 2),
            "orders_per_s": round(count / secs, 1) if secs else None}


def seed_live(host: str, port: int, state_table: str, index_table: str, now: datetime,
              counts: dict[str, int], first: int = 0) -> dict[str, list[str]]:
    """``counts[kind]`` orders of each kind (``held``, ``failed``, ``inFlight``), numbered from
    ``first``: ``order`` + ``state`` rows (one transaction each) and index rows. Their ids."""
    ids: dict[str, list[str]] = {}
    c = TableHttp(host, port)
    try:
        index: list[dict[str, Any]] = []
        for kind, n in counts.items():
            for i in range(first, first + n):
                order, state = live_order(kind, i, now)
                rows = [{**order.to_entity(), "PartitionKey": state.order_id},
                        {**state.to_entity(), "PartitionKey": state.order_id}]
                c.batch(state_table, [_odata(r) for r in rows], op="PUT")
                index += index_entities(order, state)
                ids.setdefault(kind, []).append(state.order_id)
        shards: dict[str, list[dict[str, Any]]] = {}
        for e in index:
            shards.setdefault(e["PartitionKey"], []).append(e)
        for rows in shards.values():  # a transaction is one partition's
            for i in range(0, len(rows), INDEX_BATCH):
                c.batch(index_table, rows[i:i + INDEX_BATCH], op="PUT")
    finally:
        c.close()
    return ids
