"""App CPU per table transaction and per order: the two ways the store reaches its tables
(``shared.storage.tables``), on Azurite (``python -m bench.table_tx``; 3-5 minutes).

One Azurite (in memory, table service only) is started; each variant runs in its own Python
process (so that nothing one variant does to a module leaks into another), interleaved over
``--rounds`` rounds. A worker drives ``--orders`` whole orders through the app's own core
(``shared.api.orders.submit``, ``shared.scheduler.handle_schedule`` / ``handle_reply``, with the
in-memory bus) over the app's ``TableStore`` on Azurite, one order at a time, after
``--warmup`` orders, and measures with ``time.process_time`` (the worker's CPU, every thread:
Azurite is another process):

* **per order**: the whole order (core, JSON, partition reads, index writes, transactions);
* **per transaction**: inside ``Store.transact`` only (4 per order: the submission, 3 replies).

Variants: ``sdk`` (azure-data-tables' public methods, ``submit_transaction`` for transactions) and
``rest`` (the documented REST requests over azure-core's public pipeline; each run reports the
path it actually took). Medians over the rounds are printed, with JSON on the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from local.procs import REPO_ROOT
from shared.core.workflows.catalog import AGENTS
from shared.settings import TOKEN_KEYS, new_token_key

BODY = {"customerId": "c-1", "currency": "EUR", "priority": "normal", "statusQueue": None,
        "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": 9.99}, {"sku": "SKU-3", "quantity": 1,
                                                                       "unitPrice": 19.0}]}
# the agents are faked: their URLs are never called, but the settings require them
# every agent's (required), and a token key of this run's own
SETTINGS = {**{a.service_url_setting: f"http://127.0.0.1:9/{a.name}" for a in AGENTS}, TOKEN_KEYS: new_token_key()}
RESULTS = {"reserve": {"reservationId": "r-1"}, "charge": {"paymentId": "p-1", "amount": "38.98"},
           "ship": {"shipmentId": "s-1"}}


def make_store(variant: str, connection_string: str) -> Any:
    """A ``TableStore`` on fresh tables whose transactions take the path ``variant`` names."""
    from shared.runtime.clients import table_service_client
    from shared.settings import Settings
    from shared.storage.table_store import TableStore

    conn = Settings.from_env({**SETTINGS, "StateStorage": connection_string}).state_storage
    assert conn is not None
    service = table_service_client(conn)
    suffix = uuid.uuid4().hex[:10]
    state = service.create_table_if_not_exists(f"bench{suffix}")
    deadlines = service.create_table_if_not_exists(f"benchidx{suffix}")
    search = service.create_table_if_not_exists(f"benchsearch{suffix}")
    return TableStore.of(state, deadlines, search, rest=variant == "rest")


def run_order(rt: Any) -> str:
    """One order from submission to Processed through the app's core (the agents' replies faked)."""
    from shared.api.orders import submit
    from shared.scheduler import handle_reply, handle_schedule

    res = submit(rt, json.dumps(BODY).encode(), {"Content-Type": "application/json"}, max_bytes=65536)
    assert res.status == 202, res.body
    oid, q = res.body["orderId"], rt.config.queues
    for _ in range(20):
        for m in rt.bus.take(q["SchedulerQueue"]):
            handle_schedule(rt, json.dumps(m.body).encode(), message_id=m.message_id)
        reqs = [m for s in ("InventoryQueue", "PaymentQueue", "ShippingQueue") for m in rt.bus.take(q[s])]
        if not reqs:
            break
        b = reqs[-1].body
        reply = {"kind": "step", "orderId": oid, "step": b["step"], "attempt": b["attempt"], "outcome": "success",
                 "result": RESULTS[b["operation"]], "reason": None}
        handle_reply(rt, json.dumps(reply).encode(), message_id=f"reply:{reqs[-1].message_id}")
    return str(oid)


def worker(variant: str, connection_string: str, orders: int, warmup: int) -> dict[str, Any]:
    """Measure one variant in this process."""
    from shared.core.statemachine import Config
    from shared.messaging import MemoryBus
    from shared.runtime import Runtime
    from shared.settings import Settings

    store = make_store(variant, connection_string)
    tx_cpu = [0.0, 0]
    transact = store.transact

    def timed(order_id: str, ops: Any) -> None:
        t = time.process_time()
        try:
            transact(order_id, ops)
        finally:
            tx_cpu[0] += time.process_time() - t
            tx_cpu[1] += 1

    store.transact = timed
    settings = Settings.from_env(SETTINGS)
    rt = Runtime(store=store, bus=MemoryBus(), config=Config.from_settings(settings), keys=settings.token_keys,
                 instance_id="bench")
    for _ in range(warmup):
        run_order(rt)
    tx_cpu[:] = [0.0, 0]
    t0, w0 = time.process_time(), time.perf_counter()
    for _ in range(orders):
        last = run_order(rt)
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    assert store.read_row(last, "state")["ProcessState"] == "Processed"
    return {"variant": variant, "path": store.path, "orders": orders, "transactions": tx_cpu[1],
            "cpu_ms_per_order": 1000 * cpu / orders, "cpu_ms_per_tx": 1000 * tx_cpu[0] / max(1, tx_cpu[1]),
            "wall_ms_per_order": 1000 * wall / orders}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--orders", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--variants", default="sdk,rest")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--connection-string", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.worker, a.connection_string, a.orders, a.warmup)))
        return 0
    from local.azurite import start_azurite

    names = a.variants.split(",")
    az = start_azurite(in_memory=True, services=("table",))
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in names}
    try:
        for r in range(a.rounds):
            for v in names:
                proc = subprocess.run([sys.executable, "-m", "bench.table_tx", "--worker", v, "--connection-string",
                                       az.connection_string, "--orders", str(a.orders), "--warmup", str(a.warmup)],
                                      cwd=REPO_ROOT, capture_output=True, text=True)
                if proc.returncode:
                    raise RuntimeError(f"worker {v} failed:\n{proc.stderr}")
                runs[v].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1} {v}: {runs[v][-1]}", flush=True)
    finally:
        az.stop()
    keys = ("cpu_ms_per_order", "cpu_ms_per_tx", "wall_ms_per_order")
    summary = {v: {"path": rs[-1]["path"], **{k: round(statistics.median(x[k] for x in rs), 2) for k in keys}}
               for v, rs in runs.items()}
    for v, s in summary.items():
        print(f"{v:>8} (path {s['path']}): " + ", ".join(f"{k} {s[k]}" for k in keys))
    print(json.dumps({"orders": a.orders, "rounds": a.rounds, "median": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
