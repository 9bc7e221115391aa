"""POST /api/orders, GET /api/orders/{id}: validation, 413/415, idempotency, nothing written on rejection."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from shared.models import order_id_for_key
from shared.submission import get_order
from tests.unit.harness import BODY, make_runtime, post, state, steps


def _nothing_written(rt) -> None:  # type: ignore[no-untyped-def]
    assert rt.store.writes == 0
    assert rt.store.snapshot() == {}
    assert rt.bus.all() == []


def test_accepts_order_and_writes_one_transaction() -> None:
    rt = make_runtime()
    r = post(rt)
    assert r.status == 202
    oid = r.body["orderId"]
    assert r.body == {"orderId": oid, "processState": "Processing"}
    assert r.headers["Location"] == f"/api/orders/{oid}"
    # index row + ONE transaction (order, state, 3 steps: the first one claimed in it)
    assert rt.store.writes == 2
    st = state(rt, oid)
    assert (st["OrderID"], st["ProcessState"], st["LockedBy"], st["FailureCount"]) == (oid, "Processing",
                                                                                      "instance-a", 0)
    assert set(steps(rt, oid)) == {"reserve-inventory", "charge-payment", "create-shipment"}
    assert [s["State"] for s in steps(rt, oid).values()] == ["Running", "Pending", "Pending"]
    # the Scheduler is told in-process: the first request is sent, no schedule message
    assert rt.bus.peek("scheduler") == []
    [req] = rt.bus.peek("agent-inventory")
    assert req.body["orderId"] == oid and req.application_properties["traceparent"].startswith("00-")
    [idx] = rt.store.index_rows()
    assert idx["RowKey"] == f"{oid}:20261122T080030000000" and idx["PartitionKey"] == "202611220800"
    assert idx["Due"] == st["CompleteBy"] == st["IndexDue"]  # covers the deadline the state row holds


def test_amounts_are_decimal_strings_never_floats() -> None:
    rt = make_runtime()
    body = {**BODY, "items": [{"sku": "A", "quantity": 3, "unitPrice": 0.1}, {"sku": "B", "quantity": 1,
                                                                             "unitPrice": "0.2"}]}
    r = post(rt, body)
    assert r.status == 202
    view = get_order(rt, r.body["orderId"]).body
    assert view["order"]["total"] == "0.5"  # 0.1*3 + 0.2 exactly (a float gives 0.5000000000000001)
    assert [i["unitPrice"] for i in view["order"]["items"]] == ["0.1", "0.2"]
    assert Decimal(view["order"]["total"]) == Decimal("0.5")


def test_traceparent_from_request_is_carried() -> None:
    rt = make_runtime()
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    r = post(rt, headers={"traceparent": tp})
    msg = rt.bus.peek("agent-inventory")[0]
    child = msg.application_properties["traceparent"]
    assert child.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert child != tp
    assert rt.store.read_row(r.body["orderId"], "order")["Traceparent"] == tp


@pytest.mark.parametrize("content_type,body", [
    (None, json.dumps(BODY).encode()),
    ("text/plain", json.dumps(BODY).encode()),
    ("application/xml", b"<order/>"),
    ("application/json", b"{not json"),
    ("application/json", b"\xff\xfe{}"),
    ("application/json; charset=latin-1", json.dumps(BODY).encode()),
    ("application/json", b""),
    ("application/json", b'{"a": NaN}'),
])
def test_not_json_is_415(content_type: str | None, body: bytes) -> None:
    rt = make_runtime()
    from shared.submission import submit

    headers = {"Content-Type": content_type} if content_type else {}
    r = submit(rt, body, headers, max_bytes=65536)
    assert r.status == 415
    assert r.content_type == "application/problem+json"
    assert r.body["status"] == 415 and r.body["type"] and r.body["title"]
    _nothing_written(rt)


def test_too_large_is_413() -> None:
    rt = make_runtime()
    body = {**BODY, "items": [{"sku": f"S{i}", "quantity": 1, "unitPrice": 1} for i in range(60)]}
    r = post(rt, body, max_bytes=200)
    assert r.status == 413
    assert r.content_type == "application/problem+json"
    _nothing_written(rt)


def test_every_bad_field_is_named_400() -> None:
    rt = make_runtime()
    body = {"customerId": "c/1", "currency": "euro", "priority": "urgent", "statusQueue": "bad queue!",
            "items": [{"sku": "ok", "quantity": 0, "unitPrice": -1},
                      {"sku": "a#b", "quantity": 1.5, "unitPrice": 1.23456},
                      {"sku": "x", "quantity": True, "unitPrice": "abc", "extra": 1}],
            "unknown": 1}
    r = post(rt, body)
    assert r.status == 400
    assert r.content_type == "application/problem+json"
    fields = {e["field"] for e in r.body["errors"]}
    assert fields >= {"customerId", "currency", "priority", "statusQueue", "items[0].quantity",
                      "items[0].unitPrice", "items[1].sku", "items[1].quantity", "items[1].unitPrice",
                      "items[2].quantity", "items[2].unitPrice", "items[2].extra", "unknown"}
    assert all(e["message"] for e in r.body["errors"])
    assert {"type", "title", "status", "detail"} <= set(r.body)
    _nothing_written(rt)


@pytest.mark.parametrize("body,field", [
    ({k: v for k, v in BODY.items() if k != "customerId"}, "customerId"),
    ({**BODY, "items": []}, "items"),
    ({**BODY, "items": [{"sku": "a", "quantity": 1, "unitPrice": 1}] * 101}, "items"),
    ({**BODY, "items": [{"sku": "a", "quantity": 10001, "unitPrice": 1}]}, "items[0].quantity"),
    ({**BODY, "items": [{"sku": "a", "quantity": 1, "unitPrice": 1000001}]}, "items[0].unitPrice"),
    ({**BODY, "customerId": "c\x01"}, "customerId"),
    ({**BODY, "customerId": "a" * 65}, "customerId"),
    ({**BODY, "currency": "EU"}, "currency"),
    ({**BODY, "items": "SKU-1"}, "items"),
    ([BODY], "(body)"),
])
def test_single_bad_field(body: object, field: str) -> None:
    rt = make_runtime()
    r = post(rt, body)
    assert r.status == 400, r.body
    assert field in {e["field"] for e in r.body["errors"]}
    _nothing_written(rt)


def test_duplicate_json_keys_rejected() -> None:
    rt = make_runtime()
    r = post(rt, b'{"customerId": "a", "customerId": "b", "currency": "EUR", "items": []}')
    assert r.status == 400
    _nothing_written(rt)


def test_optional_fields() -> None:
    rt = make_runtime()
    body = {"customerId": "c-1", "currency": "USD", "items": [{"sku": "S", "quantity": 1, "unitPrice": 0}]}
    r = post(rt, body)
    assert r.status == 202
    order = rt.store.read_row(r.body["orderId"], "order")
    assert order["Priority"] == "normal" and "StatusQueue" not in order


def test_idempotency_key_same_body_returns_same_order() -> None:
    rt = make_runtime()
    first = post(rt, headers={"Idempotency-Key": "key-123"})
    assert first.status == 202
    oid = first.body["orderId"]
    assert oid == order_id_for_key("key-123")
    # same body, different formatting/number spelling -> same canonical order
    again = post(rt, json.dumps(BODY, indent=2).encode(), headers={"Idempotency-Key": "key-123"})
    assert again.status == 200
    assert again.body["orderId"] == oid and again.headers["Location"] == f"/api/orders/{oid}"
    orders = {k[1] for k in rt.store.snapshot() if k[0] == "state"}
    assert orders == {oid}


def test_idempotency_key_different_body_conflicts() -> None:
    rt = make_runtime()
    post(rt, headers={"Idempotency-Key": "key-9"})
    before = {k: v for k, v in rt.store.snapshot().items() if k[0] == "state"}
    r = post(rt, {**BODY, "currency": "USD"}, headers={"Idempotency-Key": "key-9"})
    assert r.status == 409
    assert r.content_type == "application/problem+json"
    assert {k: v for k, v in rt.store.snapshot().items() if k[0] == "state"} == before


def test_bad_idempotency_key() -> None:
    rt = make_runtime()
    r = post(rt, headers={"Idempotency-Key": "has space"})
    assert r.status == 400 and r.body["errors"][0]["field"] == "Idempotency-Key"
    _nothing_written(rt)


def test_lost_first_request_still_answers_202_and_a_replay_resends_it() -> None:
    rt = make_runtime()
    rt.bus.fail.add("agent-inventory")
    r = post(rt, headers={"Idempotency-Key": "k-lost"})
    assert r.status == 202  # the order is stored; the request is re-sent by a replay or redriven
    oid = r.body["orderId"]
    assert state(rt, oid)["LeaseKey"] == "reserve-inventory:1" and rt.bus.peek("agent-inventory") == []
    rt.bus.fail.clear()
    again = post(rt, headers={"Idempotency-Key": "k-lost"})
    assert again.status == 200 and again.body == {"orderId": oid, "processState": "Processing"}
    assert [m.message_id for m in rt.bus.peek("agent-inventory")] == [f"{oid}:reserve-inventory:1"]


def test_get_order_404_and_400() -> None:
    rt = make_runtime()
    assert get_order(rt, "0" * 32).status == 404
    for bad in ("abc", "'; drop", "0" * 31, "G" * 32, "../" + "0" * 29, None, ""):
        r = get_order(rt, bad)
        assert r.status == 400 and r.content_type == "application/problem+json"
    assert rt.store.reads == [("state", "0" * 32)]  # malformed ids never reached the store


def test_status_queue_named_by_order() -> None:
    rt = make_runtime()
    r = post(rt, {**BODY, "statusQueue": "my-status"})
    [msg] = rt.bus.peek("my-status")
    assert msg.body["orderId"] == r.body["orderId"] and msg.body["event"] == "received"
    assert rt.bus.peek("order-status") == []


@pytest.mark.parametrize("queue", ["scheduler", "replies", "agent-payment", "alerts"])
def test_status_queue_may_not_be_an_internal_queue(queue: str) -> None:
    rt = make_runtime()
    r = post(rt, {**BODY, "statusQueue": queue})
    assert r.status == 400 and r.body["errors"][0]["field"] == "statusQueue"
    _nothing_written(rt)


def test_store_failure_is_503_problem() -> None:
    rt = make_runtime()

    def down(order_id: str, ops: object) -> None:
        raise ConnectionError("table service unreachable")

    rt.store.transact = down  # type: ignore[method-assign]
    r = post(rt)
    assert r.status == 503 and r.content_type == "application/problem+json" and r.headers["Retry-After"]
    assert rt.bus.all() == []
