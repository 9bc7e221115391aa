"""A remote's outage through the whole local stack (Azurite, the Service Bus emulator, the local
Functions host with two instances, the remote-services simulator): the shipping service goes
down under a burst of orders. Its circuit breaker opens (shared by both instances), the orders'
shipping steps wait instead of failing, the dead service gets about one probe per cool-down, and
once it returns every order is Processed with FailureCount 0 and no redrive.

Counts, not times, are asserted: the calls the simulator saw while down, against the bound the
settings give for the time the outage lasted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from local.stack import Stack
from tests.hostile.stackutil import GOOD_BODY, Tables, send, start_stack, submit, wait_settled

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHIP = "create-shipment"
THRESHOLD, COOL_DOWN = 3, 2
ORDERS = 12


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("breaker-stack"), instances=2,
                    BreakerFailureThreshold=str(THRESHOLD), BreakerCoolDownSeconds=str(COOL_DOWN),
                    BreakerWindowSeconds="10", BreakerProbeLeaseSeconds="5", SupervisorSchedule="*/2 * * * * *")
    try:
        yield s
    finally:
        s.stop()


def view(stack: Stack, oid: str) -> dict[str, Any]:
    r = send(stack, "GET", f"/api/orders/{oid}?historyLimit=1000")  # the function key's
    assert r.status == 200, (r.status, r.body[:300])
    body: dict[str, Any] = r.json()
    return body


def shipping_step(v: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in v["steps"] if s["name"] == SHIP)


def down_calls(stack: Stack) -> int:
    return int(stack.remotes.stats()["injected"].get("shipping", {}).get("down", 0))


def watch_rows(stack: Stack) -> list[str]:
    """The breakers' watch rows in the deadline index (``shared.core.breaker.watch``)."""
    tables = Tables(stack)
    try:
        return [str(e["RowKey"]) for e in tables.deadlines.list_entities(select=["RowKey"])
                if str(e["RowKey"]).startswith("breaker:")]
    finally:
        tables.close()


def wait_for(what: str, ok: Any, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.5)


def test_an_outage_under_load_makes_steps_wait_not_fail(stack: Stack) -> None:
    remotes = stack.remotes
    remotes.set_faults("shipping", down=True)
    try:
        with ThreadPoolExecutor(6) as pool:
            oids = list(pool.map(lambda i: submit(stack, {**GOOD_BODY, "customerId": f"brk-{i}"}), range(ORDERS)))
        wait_for("every shipping step waits on the breaker",
                 lambda: all(shipping_step(view(stack, o)).get("waitingOn") == "shipping" for o in oids))
        tables = Tables(stack)
        try:
            breaker = tables.partition("breakers")["shipping"]
        finally:
            tables.close()
        assert breaker["State"] in ("open", "half-open") and breaker["Opens"] == 1, breaker
        assert watch_rows(stack), "the opening put its watch row in the deadline index"
        # Every order waits now: the dead service gets only probes, about one per cool-down.
        before, started = down_calls(stack), time.monotonic()
        time.sleep(4 * COOL_DOWN)
        probes, elapsed = down_calls(stack) - before, time.monotonic() - started
        assert probes <= math.ceil(elapsed / COOL_DOWN) + 2, (probes, elapsed)
        during = down_calls(stack)
    finally:
        remotes.set_faults("shipping")
    tables = Tables(stack)
    try:
        for oid in oids:
            rows = wait_settled(tables, oid, timeout=120)
            assert rows["state"]["ProcessState"] == "Processed", rows["state"]
            assert rows["state"].get("FailureCount", 0) == 0, rows["state"]
    finally:
        tables.close()
    for oid in oids:
        events = [e["event"] for e in view(stack, oid)["history"]]
        assert "stepWaiting" in events and "resumed" in events, events
        assert not {"redriven", "stepFailed", "alert"} & set(events), events
    # Before every order waited, the calls were the ones in flight when it opened (each order's
    # first shipping call, at most) plus its threshold and the probes counted above.
    assert during <= ORDERS + THRESHOLD + probes, during
    assert remotes.duplicate_effects() == []
    # closed, nothing owed: the Supervisor drops the watch, and its sweeps read no breaker again
    wait_for("the breaker's watch row is gone", lambda: not watch_rows(stack), timeout=60)
    print(f"\nshipping down: {during} calls ({probes} in {elapsed:.1f} s once every order waited)")
