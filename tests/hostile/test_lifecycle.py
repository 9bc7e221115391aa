"""Hostile use of the operator actions (POST /api/orders/{id}/retry | cancel | terminate).

An action that does not apply gets 409 problem+json (``wrong-state``) with the reason and
changes nothing; the same action sent several times at once is done once (one 202, one
history event); terminate, retry and cancel refuse each other's orders as the contract says.
Malformed and unknown ids are in test_cases.py (400 / 404 on every route).

The remote services' faults make the orders: ``rejectSkus`` (inventory) a failed order,
``hangSkus`` (payment) an order stuck in flight; each test sets them for its own SKU only.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.hostile.stackutil import (
    GOOD_BODY,
    RawResponse,
    Tables,
    history_rows,
    order_rows,
    send,
    submit,
    wait_settled,
)

pytestmark = pytest.mark.integration

ACTIONS = ("retry", "cancel", "terminate")


def act(stack: Any, oid: str, action: str, body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = ()) -> RawResponse:
    return send(stack, "POST", f"/api/orders/{oid}/{action}", body, headers)


def at_once(stack: Any, oid: str, action: str, n: int) -> list[RawResponse]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: act(stack, oid, action), range(n)))


def view(stack: Any, oid: str) -> dict[str, Any]:
    r = send(stack, "GET", f"/api/orders/{oid}")
    assert r.status == 200, (r.status, r.body[:300])
    body: dict[str, Any] = r.json()
    return body


def events(stack: Any, oid: str) -> Counter[str]:
    r = send(stack, "GET", f"/api/orders/{oid}/history?limit=1000")
    assert r.status == 200, (r.status, r.body[:300])
    return Counter(e["event"] for e in r.json()["history"])


def assert_wrong_state(r: RawResponse, oid: str, action: str) -> dict[str, Any]:
    assert r.status == 409 and r.is_problem, (action, r.status, r.body[:300])
    doc: dict[str, Any] = r.json()
    assert doc["type"].endswith("/wrong-state") and doc["orderId"] == oid and doc["detail"], doc
    return doc


def assert_accepted(r: RawResponse, oid: str, action: str) -> dict[str, Any]:
    assert r.status == 202, (action, r.status, r.body[:300])
    doc: dict[str, Any] = r.json()
    assert doc["orderId"] == oid and doc["action"] == action and doc["result"], doc
    assert r.headers.get("location") == f"/api/orders/{oid}", r.headers
    return doc


def one_accepted(responses: list[RawResponse], oid: str, action: str) -> dict[str, Any]:
    """Of the same action sent at once: exactly one 202, every other one 409 (never 5xx)."""
    statuses = sorted(r.status for r in responses)
    assert statuses.count(202) == 1 and set(statuses) <= {202, 409}, (action, statuses,
                                                                     [r.body[:200] for r in responses])
    for r in responses:
        if r.status == 409:
            assert r.is_problem and r.json()["orderId"] == oid, r.body[:300]
    return assert_accepted(next(r for r in responses if r.status == 202), oid, action)


def wait_view(stack: Any, oid: str, ok: Any, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        v = view(stack, oid)
        if ok(v):
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"order {oid} never got there: {json.dumps(v)[:600]}")
        time.sleep(0.3)


def order_with(stack: Any, sku: str, customer: str) -> str:
    return submit(stack, {**GOOD_BODY, "customerId": customer,
                          "items": [{"sku": sku, "quantity": 1, "unitPrice": 5}]})


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def faults(hostile_stack: Any) -> Iterator[Any]:
    """The remote services' fault control; every service's faults back to none afterwards."""
    client = hostile_stack.remotes
    try:
        yield client
    finally:
        for service in ("inventory", "payment", "shipping"):
            client.set_faults(service)
        client.close()


def failed_order(stack: Any, tables: Tables, faults: Any, tag: str) -> str:
    """An order rejected by inventory (its first step): failed, nothing to undo, attention."""
    sku = f"HS-REJECT-{tag}"
    faults.set_faults("inventory", rejectSkus=[sku])
    oid = order_with(stack, sku, f"hl-failed-{tag}")
    rows = wait_settled(tables, oid)
    faults.set_faults("inventory")
    assert rows["state"]["ProcessState"] == "Error", rows["state"]
    v = view(stack, oid)
    assert v["outcome"] == "failed" and v["category"] == "attention" and v["generation"] == 0, v
    return oid


# ------------------------------------------------------------------ a processed order


@pytest.fixture(scope="module")
def processed(hostile_stack: Any, tables: Tables) -> str:
    oid = submit(hostile_stack, {**GOOD_BODY, "customerId": f"hl-done-{uuid.uuid4().hex[:10]}"})
    assert wait_settled(tables, oid)["state"]["ProcessState"] == "Processed"
    return oid


@pytest.mark.parametrize("action", ACTIONS)
def test_no_action_applies_to_a_processed_order(hostile_stack: Any, tables: Tables, processed: str,
                                                action: str) -> None:
    before = tables.partition(processed)
    for _ in range(2):
        doc = assert_wrong_state(act(hostile_stack, processed, action), processed, action)
        assert doc["processState"] == "Processed", doc
    assert tables.partition(processed) == before  # every row, history included, ETags included


@pytest.mark.parametrize("action", ACTIONS)
def test_a_body_or_query_changes_nothing(hostile_stack: Any, tables: Tables, processed: str, action: str) -> None:
    """An action takes no body and no parameter: whatever is sent along, the answer is the same."""
    before = tables.partition(processed)
    junk = [(b'{"force": true, "processState": "Pending"}', (("Content-Type", "application/json"),)),
            (b"\x00\xff" * 100, (("Content-Type", "application/octet-stream"),)),
            (b"[" * 10_000, (("Content-Type", "application/json"),))]
    for body, headers in junk:
        assert_wrong_state(act(hostile_stack, processed, action, body, headers), processed, action)
    r = send(hostile_stack, "POST", f"/api/orders/{processed}/{action}?force=true&generation=0")
    assert_wrong_state(r, processed, action)
    unknown = uuid.uuid4().hex
    for body, headers in junk:
        r = act(hostile_stack, unknown, action, body, headers)
        assert r.status == 404 and r.is_problem, (r.status, r.body[:300])
    assert tables.partition(processed) == before


# ------------------------------------------------------------------ a failed order


def test_a_failed_order_is_cancelled_once_and_never_terminated(hostile_stack: Any, tables: Tables, faults: Any,
                                                               tag: str) -> None:
    oid = failed_order(hostile_stack, tables, faults, tag)
    before = tables.partition(oid)
    assert_wrong_state(act(hostile_stack, oid, "terminate"), oid, "terminate")  # not in flight
    assert tables.partition(oid) == before
    one_accepted(at_once(hostile_stack, oid, "cancel", 4), oid, "cancel")
    v = wait_view(hostile_stack, oid, lambda v: v["category"] == "error")
    assert v["processState"] == "Error" and v["outcome"] == "cancelled", v
    assert events(hostile_stack, oid)["cancelled"] == 1
    settled = wait_settled(tables, oid)
    for action in ACTIONS:
        assert_wrong_state(act(hostile_stack, oid, action), oid, action)
    assert tables.partition(oid) == settled


def test_a_failed_order_is_restarted_once(hostile_stack: Any, tables: Tables, faults: Any, tag: str) -> None:
    """Retries sent at once restart it once: generation 1, one ``restarted`` event, the old
    rows kept (no new step rows, history appended)."""
    oid = failed_order(hostile_stack, tables, faults, tag)
    rows_before = order_rows(tables.partition(oid))
    history_before = len(history_rows(tables.partition(oid)))
    doc = one_accepted(at_once(hostile_stack, oid, "retry", 4), oid, "retry")
    assert doc["result"] == "restarted", doc
    rows = wait_settled(tables, oid)
    assert rows["state"]["ProcessState"] == "Processed", rows["state"]
    v = view(hostile_stack, oid)
    assert v["generation"] == 1 and v["category"] == "processed" and v["outcome"] == "processed", v
    assert events(hostile_stack, oid)["restarted"] == 1
    assert set(order_rows(rows)) == set(rows_before) and len(history_rows(rows)) > history_before
    for action in ACTIONS:
        assert_wrong_state(act(hostile_stack, oid, action), oid, action)


# ------------------------------------------------------------------ an order in flight


def test_an_order_in_flight_is_terminated_once(hostile_stack: Any, tables: Tables, faults: Any, tag: str) -> None:
    sku = f"HS-HANG-{tag}"
    faults.set_faults("payment", hangSkus=[sku])
    oid = order_with(hostile_stack, sku, f"hl-flight-{tag}")
    wait_view(hostile_stack, oid, lambda v: v["currentStep"] == "charge-payment" and any(
        s["name"] == "charge-payment" and s["state"] == "Running" for s in v["steps"]), timeout=30)
    assert view(hostile_stack, oid)["category"] == "inFlight"
    doc = assert_wrong_state(act(hostile_stack, oid, "cancel"), oid, "cancel")
    assert "terminate" in doc["detail"], doc
    assert_wrong_state(act(hostile_stack, oid, "retry"), oid, "retry")
    doc = one_accepted(at_once(hostile_stack, oid, "terminate", 4), oid, "terminate")
    assert doc["result"] in ("terminated", "terminating"), doc  # not held: the step in flight has a refund
    faults.set_faults("payment")  # the refund must get through
    rows = wait_settled(tables, oid, timeout=120)
    assert rows["state"]["ProcessState"] == "Error", rows["state"]
    v = view(hostile_stack, oid)
    assert v["outcome"] == "terminated" and v["category"] == "error", v
    assert events(hostile_stack, oid)["terminated"] == 1
    for action in ACTIONS:
        assert_wrong_state(act(hostile_stack, oid, action), oid, action)
    effects = faults.effects_by_order().get(oid, Counter())
    assert effects["inventory/reserve"] == effects["inventory/release"] == 1, effects
    assert effects["payment/charge"] == effects["payment/refund"] and effects["shipping/ship"] == 0, effects
