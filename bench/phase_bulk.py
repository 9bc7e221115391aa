"""The bulk phase (issue 30): what a bulk retry costs live traffic.

``--bulk-orders`` N orders of the customer ``bench-bulk`` fail on a SKU the inventory refuses and
wait in ``attention``; the SKU is restocked. The latency phase's fixed-rate load (``--bulk-fraction``
of saturation, ``--bulk-seconds``) then runs twice: **alone**, and **beside** ONE bulk retry of the
N (``POST /api/operations``) at the default's pace in orders/s (``BulkOrdersPerTick`` scaled to the
run's Supervisor period). In ``bench.json`` ``bulk``: the live p50/p99 in each load and their
ratio, and the operation's own orders/s.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import requests

from bench.logline import log
from bench.poll import wait_for
from local.host.keys import ADMIN, FUNCTION
from local.stack import demo_order

if TYPE_CHECKING:
    from bench.bench_state import BenchState

SKU = "SKU-BENCH-BULK"  # the inventory refuses it until the phase restocks it
CUSTOMER = "bench-bulk"
DEFAULT_TICK_ORDERS, DEFAULT_TICK_SECONDS = 100, 15  # BulkOrdersPerTick and SupervisorSchedule's defaults
FAIL_TIMEOUT = 300.0
DONE_TIMEOUT = 600.0
ALONE, BESIDE = "bulk: live alone", "bulk: live beside a bulk retry"


def per_tick(args: Any) -> int:
    """BulkOrdersPerTick of the run: the default's pace (orders/s) at the run's Supervisor period."""
    return max(1, round(DEFAULT_TICK_ORDERS * args.supervisor_period / DEFAULT_TICK_SECONDS))


def run(bench: BenchState) -> None:
    a = bench.args
    log(f"phase: bulk: {a.bulk_orders} orders in attention, then the fixed-rate load ({a.bulk_fraction:.0%} of "
        f"saturation, {a.bulk_seconds:g}s) alone and beside a bulk retry of them")
    t0 = time.time()
    try:
        bench.result["bulk"] = _measure(bench)
    except Exception as e:  # noqa: BLE001 - the phase's failure is reported, the run goes on
        log(f"  bulk phase failed: {e!r}")
        bench.result["bulk"] = {"error": repr(e)}
    finally:
        bench.stack.remotes.reset_faults()
    bench.phase_windows.append(("bulk", t0, time.time()))


def _api(bench: BenchState, method: str, path: str, level: str = ADMIN, **kw: Any) -> tuple[int, dict[str, Any]]:
    """One call to the API with the key of ``level``: the master key by default, for the phase's
    operator routes (``/operations``); the orders it posts go as a client's (``FUNCTION``)."""
    r = requests.request(method, f"{bench.stack.api_url}{path}", timeout=120, headers=bench.stack.key_headers(level),
                         **kw)
    try:
        body = r.json()
    except ValueError:
        body = {"detail": r.text[:300]}
    return r.status_code, body if isinstance(body, dict) else {}


def _fail_batch(bench: BenchState, n: int) -> float:
    """Post ``n`` orders the inventory refuses; wait until search lists them all in attention."""
    import random

    rng = random.Random(30)
    bench.stack.remotes.set_faults("inventory", reject_skus=[SKU])
    bodies = []
    for _ in range(n):
        body = demo_order(rng)
        body["customerId"] = CUSTOMER
        body["items"].append({"sku": SKU, "quantity": 1, "unitPrice": 3})
        bodies.append(body)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(lambda b: _api(bench, "POST", "/orders", FUNCTION, json=b)[0], bodies))
    if any(s != 202 for s in statuses):
        raise RuntimeError(f"batch posts not accepted: {sorted(set(statuses))}")
    dry = {"action": "retry", "filter": {"state": "attention", "customerId": CUSTOMER}, "dryRun": True}
    matched = 0

    def all_matched() -> bool:
        nonlocal matched
        matched = int(_api(bench, "POST", "/operations", json=dry)[1].get("matched") or 0)
        return matched == n

    if not wait_for(all_matched, FAIL_TIMEOUT, every=1.0):
        raise RuntimeError(f"only {matched} of {n} batch orders in attention after {FAIL_TIMEOUT:g}s")
    bench.stack.remotes.reset_faults()  # the operator's fix: restocked
    return round(time.monotonic() - t0, 1)


def _load(bench: BenchState, name: str, rate: float, seconds: float) -> dict[str, Any]:
    r = bench.new_run(name)
    before = bench.snapshot()
    t0 = time.time()
    r.open_loop(rate, seconds, threads=8, progress=lambda s: print(s, flush=True))
    res = bench._measured(name, r, before, t0, drain_timeout=180)
    res["arrival_rate"] = round(rate, 2)
    res["load_window"] = [t0, t0 + seconds]
    return res


class _Operation:
    """The bulk retry, started and watched from a thread of its own (the load is timed meanwhile)."""

    def __init__(self, bench: BenchState) -> None:
        self.bench = bench
        self.started_at = self.answered_at = self.done_at = 0.0
        self.first: dict[str, Any] = {}
        self.last: dict[str, Any] = {}
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="bulk-operation", daemon=True)

    def _run(self) -> None:
        body = {"action": "retry", "filter": {"state": "attention", "customerId": CUSTOMER}}
        try:
            self.started_at = time.time()
            status, self.first = _api(self.bench, "POST", "/operations", json=body)
            self.answered_at = time.time()
            if status != 202:
                raise RuntimeError(f"POST /api/operations: {status} {self.first}")

            def done() -> bool:
                status, self.last = _api(self.bench, "GET", f"/operations/{self.first['operationId']}")
                return status == 200 and self.last.get("state") == "done"

            if not wait_for(done, DONE_TIMEOUT):
                raise RuntimeError(f"not done after {DONE_TIMEOUT:g}s: {self.last}")
            self.done_at = time.time()
        except Exception as e:  # noqa: BLE001
            self.error = repr(e)


def _measure(bench: BenchState) -> dict[str, Any]:
    a = bench.args
    n = a.bulk_orders
    fail_s = _fail_batch(bench, n)
    log(f"  {n} orders in attention after {fail_s}s; the load alone")
    rate = max(0.5, a.bulk_fraction * bench.saturation_rate())
    alone = _load(bench, ALONE, rate, a.bulk_seconds)
    op = _Operation(bench)
    op.thread.start()
    log("  the same load beside a bulk retry of them")
    beside = _load(bench, BESIDE, rate, a.bulk_seconds)
    op.thread.join(DONE_TIMEOUT)
    if op.error or not op.done_at:
        raise RuntimeError(f"the bulk retry: {op.error or 'not done'}")
    processed_s = _all_processed(bench, n, op.started_at)
    start, end = beside["load_window"]
    span = op.done_at - op.started_at
    last = op.last
    res = {
        "orders": n, "batch_failed_in_s": fail_s, "arrival_rate": round(rate, 2), "fraction": a.bulk_fraction,
        "seconds": a.bulk_seconds,
        "bulk_orders_per_tick": per_tick(a), "supervisor_period_s": a.supervisor_period,
        "alone": _brief(alone), "beside": _brief(beside),
        "ratio": {p: _ratio(beside["latency_ms"][p], alone["latency_ms"][p]) for p in ("p50", "p99")},
        "operation": {"operationId": last.get("operationId"), "matched": last.get("matched"),
                      "succeeded": last.get("succeeded"), "failed": last.get("failed"),
                      "post_ms": round(1000 * (op.answered_at - op.started_at)),
                      "first_slice": {k: op.first.get(k) for k in ("succeeded", "failed", "state")},
                      "seconds": round(span, 2),
                      "orders_per_s": round(int(last.get("matched") or 0) / span, 2) if span > 0 else None,
                      "retried_all_processed_s": processed_s,
                      "overlap_of_load": round(max(0.0, min(op.done_at, end) - max(op.started_at, start))
                                               / (end - start), 2)},
    }
    for line in report_lines(res):
        log(line)
    return res


def _all_processed(bench: BenchState, n: int, since: float) -> float | None:
    """Seconds from the POST until search lists every retried order Processed (None: not in time).
    The next phase must not meet them still running."""
    dry = {"action": "retry", "filter": {"state": "processed", "customerId": CUSTOMER}, "dryRun": True}
    if wait_for(lambda: int(_api(bench, "POST", "/operations", json=dry)[1].get("matched") or 0) >= n,
                DONE_TIMEOUT, every=1.0):
        return round(time.time() - since, 1)
    return None


def _brief(ph: dict[str, Any]) -> dict[str, Any]:
    keep = ("orders_posted", "processed", "failed", "unfinished", "orders_per_s", "latency_ms", "post_latency_ms",
            "work_items_per_s", "loadavg_1m_at_end")
    return {k: ph.get(k) for k in keep}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def report_lines(res: dict[str, Any]) -> list[str]:
    """The phase's printed lines (the summary prints them again)."""
    if "error" in res:
        return [f"bulk: ERROR {res['error']}"]
    al, bs, op, ra = res["alone"], res["beside"], res["operation"], res["ratio"]
    return [
        f"bulk: live orders at {res['arrival_rate']} orders/s for {res['seconds']:g}s: alone p50 "
        f"{al['latency_ms']['p50']} ms p99 {al['latency_ms']['p99']} ms ({al['processed']}/{al['orders_posted']}); "
        f"beside a bulk retry of {res['orders']} p50 {bs['latency_ms']['p50']} ms p99 {bs['latency_ms']['p99']} ms "
        f"({bs['processed']}/{bs['orders_posted']}); ratio p50 {ra['p50']}, p99 {ra['p99']}",
        f"  the bulk retry: {op['matched']} matched, {op['succeeded']} succeeded, {op['failed']} failed in "
        f"{op['seconds']}s = {op['orders_per_s']} orders/s ({res['bulk_orders_per_tick']} per "
        f"{res['supervisor_period_s']}s tick, the POST {op['post_ms']} ms for its first slice); it overlapped "
        f"{op['overlap_of_load']:.0%} of the second load; every retried order Processed "
        f"{op['retried_all_processed_s']}s after the POST",
    ]
