"""Seeding finished orders straight into Azurite, in the exact shape the app writes.

One order is run to Processed by the app's own core on the in-memory store; its rows are copied
under new order ids with raw ``$batch`` transactions (one per order), from several threads.
``leftover`` of them also get a due deadline row, as a lost best-effort delete leaves one.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.azraw import TableHttp, run_parallel

_ODATA_SKIP = ("_etag", "Timestamp")


Template = tuple[str, dict[str, dict[str, Any]], list[dict[str, Any]]]


def finished_order_template() -> Template:
    """(order id, rows of the Processed order by RowKey, the index rows the app left)."""
    from shared.api.orders import submit
    from shared.core.statemachine import Config
    from shared.messaging import MemoryBus
    from shared.runtime import Runtime
    from shared.scheduler import handle_reply, handle_schedule
    from shared.settings import REQUIRED_SETTINGS, TOKEN_KEYS, Settings, new_token_key
    from shared.storage.memory import MemoryStore

    # the remote services' URLs are required; the seeder's orders never call them
    settings = Settings.from_env({**{s.name: "http://unused.invalid" for s in REQUIRED_SETTINGS},
                                  TOKEN_KEYS: new_token_key()})
    rt = Runtime(store=MemoryStore(), bus=MemoryBus(), config=Config.from_settings(settings), keys=settings.token_keys,
                 instance_id="seed")
    body = {"customerId": "c-1", "currency": "EUR", "priority": "normal", "statusQueue": None,
            "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": 9.99}, {"sku": "SKU-3", "quantity": 1,
                                                                           "unitPrice": 19.0}]}
    res = submit(rt, json.dumps(body).encode(), {"Content-Type": "application/json"}, max_bytes=65536)
    assert res.status == 202, res.body
    oid = res.body["orderId"]
    q = rt.config.queues
    for _ in range(20):
        for m in rt.bus.take(q["SchedulerQueue"]):  # type: ignore[attr-defined]
            handle_schedule(rt, json.dumps(m.body).encode(), message_id=m.message_id)
        req = None
        for s in ("InventoryQueue", "PaymentQueue", "ShippingQueue"):
            for m in rt.bus.take(q[s]):  # type: ignore[attr-defined]
                req = m
        if req is None:
            break
        b = req.body
        result = {"reserve": {"reservationId": uuid.uuid4().hex}, "charge": {"paymentId": uuid.uuid4().hex,
                  "amount": "38.98"}, "ship": {"shipmentId": uuid.uuid4().hex}}[b["operation"]]
        reply = {"kind": "step", "orderId": oid, "step": b["step"], "attempt": b["attempt"], "outcome": "success",
                 "result": result, "reason": None}
        handle_reply(rt, json.dumps(reply).encode(), message_id=f"reply:{req.message_id}")
    rows = rt.store.read_partition(oid)
    assert rows["state"]["ProcessState"] == "Processed", rows["state"]
    index = rt.store.index_rows()  # type: ignore[attr-defined]
    clean = {rk: {k: v for k, v in r.items() if k not in _ODATA_SKIP} for rk, r in rows.items()}
    return oid, clean, index


def _odata(entity: dict[str, Any]) -> dict[str, Any]:
    """The entity as the table service's JSON takes it: an integer past 32 bits as a typed string."""
    out = dict(entity)
    for k, v in entity.items():
        if isinstance(v, int) and not isinstance(v, bool) and not -2**31 <= v < 2**31:
            out[k], out[f"{k}@odata.type"] = str(v), "Edm.Int64"
    return out


def order_entities(template: Template, new_id: str) -> list[dict[str, Any]]:
    oid, rows, _idx = template
    ents = []
    for rk, r in rows.items():
        e = json.loads(json.dumps(r).replace(oid, new_id))
        e["PartitionKey"] = new_id
        e["RowKey"] = rk
        ents.append(_odata(e))
    return ents


def leftover_index_row(new_id: str, due: datetime) -> dict[str, Any]:
    from shared.core.effects import PutIndex
    from shared.core.times import iso

    put = PutIndex(new_id, due)
    return {"PartitionKey": put.bucket, "RowKey": put.row_key, "OrderId": new_id, "Due": iso(due)}


def seed_finished(host: str, port: int, *, state_table: str, deadline_table: str, count: int, leftover: int,
                  threads: int = 6, progress: Callable[[int, int, float], None] | None = None) -> dict[str, Any]:
    """Insert ``count`` finished orders (one transaction each) and ``leftover`` lazily-left
    index rows (batched by bucket, 100 per transaction). Returns what was written and how fast."""
    template = finished_order_template()
    conn = TableHttp(host, port)
    conn.create_table(state_table)
    conn.create_table(deadline_table)
    conn.close()
    now = datetime.now(UTC)
    ids = [uuid.uuid4().hex for _ in range(count)]
    t0 = time.perf_counter()
    last = [t0]

    def job(oid: str) -> Callable[[TableHttp], None]:
        def run(c: TableHttp) -> None:
            c.batch(state_table, order_entities(template, oid))
        return run

    def prog(n: int) -> None:
        if progress is not None and (n == count or time.perf_counter() - last[0] >= 2.0):
            last[0] = time.perf_counter()
            progress(n, count, last[0] - t0)

    run_parallel(host, port, (job(o) for o in ids), threads, prog)
    seed_s = time.perf_counter() - t0
    # lazily-left index rows of the first `leftover` orders, due 5 minutes ago (one bucket)
    due = now - timedelta(minutes=5)
    rows = [leftover_index_row(oid, due) for oid in ids[:leftover]]
    by_bucket: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_bucket.setdefault(r["PartitionKey"], []).append(r)
    c = TableHttp(host, port)
    try:
        for chunk_rows in by_bucket.values():
            for i in range(0, len(chunk_rows), 100):
                c.batch(deadline_table, chunk_rows[i:i + 100])
    finally:
        c.close()
    return {"orders": count, "entities": count * len(template[1]), "entities_per_order": len(template[1]),
            "index_rows_left_by_app_per_order": len(template[2]),
            "leftover_index_rows": len(rows), "seconds": round(seed_s, 2),
            "tx_per_s": round(count / seed_s, 1) if seed_s > 0 else None}
