"""Hostile inputs on the bulk operation routes (``POST /api/operations``, ``GET /api/operations/{id}``),
through the local host and the app: each rejected request gets its 4xx as problem+json naming
the field, and writes nothing (no operation rows, no watch in the deadline index). The fuzzer
leaves ``POST /api/operations`` out (tests/hostile/fuzz.py says why); these are its cases."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.hostile.stackutil import GOOD_BODY, Tables, get, send, submit, wait_searchable, wait_settled
from tests.hostile.test_cases import JSON, assert_rejected, body_of

pytestmark = pytest.mark.integration

BAD_BODIES: dict[str, tuple[bytes, str]] = {
    "not-json": (b'{"action": "retry",', "(body)"),
    "not-utf8": (b'{"action": "\xff"}', "(body)"),
    "array": (b"[]", "(body)"),
    "null": (b"null", "(body)"),
    "unknown-field": (body_of({"action": "retry", "where": {}}), "where"),
    "no-action": (body_of({"filter": {}}), "action"),
    "unknown-action": (body_of({"action": "purge"}), "action"),
    "action-not-string": (body_of({"action": ["retry"]}), "action"),
    "filter-not-object": (body_of({"action": "retry", "filter": "state=attention"}), "filter"),
    "filter-paging": (body_of({"action": "retry", "filter": {"continuationToken": "x"}}), "filter.continuationToken"),
    "filter-number": (body_of({"action": "retry", "filter": {"customerId": 7}}), "filter.customerId"),
    "bad-state": (body_of({"action": "retry", "filter": {"state": "Error"}}), "state"),
    "bad-customer": (body_of({"action": "retry", "filter": {"customerId": "a b"}}), "customerId"),
    "bad-workflow": (body_of({"action": "retry", "filter": {"workflow": "../order"}}), "workflow"),
    "bad-instant": (body_of({"action": "retry", "filter": {"createdTo": "2026-13-01"}}), "createdTo"),
    "from-after-to": (body_of({"action": "retry", "filter": {"createdFrom": "2026-02-01", "createdTo": "2026-01-01"}}),
                      "createdFrom"),
    "dry-run-string": (body_of({"action": "retry", "dryRun": "true"}), "dryRun"),
    "lone-surrogate": (b'{"action": "retry", "filter": {"customerId": "\\ud800"}}', "customerId"),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_a_bad_operation_is_refused_and_writes_nothing(hostile_stack: Any, tables: Tables, name: str) -> None:
    body, field = BAD_BODIES[name]
    assert_rejected(hostile_stack, tables, "POST", "/api/operations", body, JSON, 400, [field])


def test_not_declared_json_and_too_large(hostile_stack: Any, tables: Tables) -> None:
    good = body_of({"action": "retry", "dryRun": True})
    assert_rejected(hostile_stack, tables, "POST", "/api/operations", good, [("Content-Type", "text/plain")], 415)
    big = body_of({"action": "retry", "filter": {"customerId": "c" * 5000}})
    assert_rejected(hostile_stack, tables, "POST", "/api/operations", big, JSON, 413)
    assert_rejected(hostile_stack, tables, "POST", "/api/operations", good,
                    [*JSON, ("Idempotency-Key", "two words")], 400, ["Idempotency-Key"])


@pytest.mark.parametrize("raw", ["x", "0" * 31, "0" * 33, "G" * 32, "%00" * 4, "..%2F..%2Fhost"])
def test_a_malformed_operation_id_is_400(hostile_stack: Any, tables: Tables, raw: str) -> None:
    assert_rejected(hostile_stack, tables, "GET", f"/api/operations/{raw}", b"", [], {400, 404})


def test_an_unknown_operation_is_404(hostile_stack: Any, tables: Tables) -> None:
    assert_rejected(hostile_stack, tables, "GET", f"/api/operations/{uuid.uuid4().hex}", b"", [], 404)


def test_an_operation_on_orders_that_cannot_take_it_counts_each_failure(hostile_stack: Any, tables: Tables) -> None:
    """Processed orders cannot be retried: the operation ends done, each order failed with the
    reason, and nothing in their rows changes."""
    customer = f"bulk-{uuid.uuid4().hex[:12]}"
    ids = [submit(hostile_stack, {**GOOD_BODY, "customerId": customer}) for _ in range(2)]
    before = {oid: wait_settled(tables, oid) for oid in ids}
    wait_searchable(hostile_stack, [("customerId", customer)], ids)
    request = body_of({"action": "retry", "filter": {"customerId": customer}})
    dry = send(hostile_stack, "POST", "/api/operations",
               body_of({"action": "retry", "filter": {"customerId": customer}, "dryRun": True}), JSON)
    assert dry.status == 200 and dry.json()["matched"] == 2, dry.body[:300]
    r = send(hostile_stack, "POST", "/api/operations", request, JSON)
    assert r.status == 202 and r.json()["matched"] == 2, r.body[:300]
    location = r.headers["location"]
    deadline = time.monotonic() + 60
    while True:
        progress = get(hostile_stack, location).json()
        if progress["state"] == "done" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert (progress["state"], progress["succeeded"], progress["failed"]) == ("done", 0, 2), progress
    assert sorted(e["orderId"] for e in progress["errors"]) == sorted(ids)
    assert all(e["reason"] for e in progress["errors"])
    for oid in ids:
        assert tables.partition(oid) == before[oid]
    assert progress["by"] == "key"
