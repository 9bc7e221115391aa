"""POST /api/orders, GET /api/orders/{id}: validation, 413/415, idempotency, nothing written on rejection."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from shared.api.operator import cancel_order, retry_order
from shared.api.orders import get_order, submit
from shared.core.effects import DEADLINE_SHARDS, order_bucket
from shared.core.orders import CURRENCIES, order_id_for_key
from tests.unit.harness import BODY, T0, make_runtime, post, state, steps


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
    # index row + ONE transaction (order, state, 3 steps: the first one claimed in it, and its
    # history) + its search index rows (issue 11: written after it, group-committed)
    assert rt.store.writes == 3
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
    assert idx["RowKey"] == f"{oid}:20261122T080030000000" and idx["PartitionKey"] == order_bucket(T0, oid)
    assert idx["PartitionKey"] in {f"202611220800-{n}" for n in range(DEADLINE_SHARDS)}  # the minute, a shard
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
    # The order row stores the submission's server span: a child of the request's, same trace.
    stored = rt.store.read_row(r.body["orderId"], "order")["Traceparent"]
    assert stored.split("-")[1] == tp.split("-")[1] and stored != tp
    # GET shows the trace id: the operation id of the order's telemetry in Application Insights
    assert get_order(rt, r.body["orderId"]).body["traceId"] == "0af7651916cd43dd8448eb211c80319c"


@pytest.mark.parametrize("content_type,body", [
    (None, json.dumps(BODY).encode()),
    ("text/plain", json.dumps(BODY).encode()),
    ("application/xml", b"<order/>"),
    ("application/json; charset=latin-1", json.dumps(BODY).encode()),
    ("text/plain", b"{not json"),
])
def test_a_content_type_that_is_not_json_is_415(content_type: str | None, body: bytes) -> None:
    rt = make_runtime()
    headers = {"Content-Type": content_type} if content_type else {}
    r = submit(rt, body, headers, max_bytes=65536)
    assert r.status == 415
    assert r.content_type == "application/problem+json"
    assert r.body["status"] == 415 and r.body["type"] and r.body["title"]
    _nothing_written(rt)


# Declared JSON, but not: 400 (the body is at fault, not the Content-Type), saying where.
@pytest.mark.parametrize("content_type,body,says", [
    ("application/json", b"{not json", "Expecting property name enclosed in double quotes at line 1, column 2"),
    ("application/json", b'{"customerId": "c-1",\n "currency" "EUR"}', "Expecting ':' delimiter at line 2, column 13"),
    ("application/json", json.dumps(BODY).encode() + b"x", "Extra data at line 1, column"),
    ("application/json", b"\xff\xfe{}", "byte 0xff at offset 0 is not UTF-8"),
    ("application/json", b'{"customerId": "c-\xe9"}', "byte 0xe9 at offset 18 is not UTF-8"),
    ("application/json", b"", "the body is empty"),
    ("application/json", b" \n ", "the body is empty"),
    ("application/json", b'{"a": NaN}', "NaN is not valid JSON"),
    ("application/json", b"\xef\xbb\xbf" + json.dumps(BODY).encode(), "byte order mark"),
    ("application/json; charset=utf-8", b"{'a': 1}", "Expecting property name"),
    ("application/merge-patch+json", b"[1,]", "Expecting value"),
])
def test_invalid_json_declared_as_json_is_400_saying_where(content_type: str, body: bytes, says: str) -> None:
    rt = make_runtime()
    r = submit(rt, body, {"Content-Type": content_type}, max_bytes=65536)
    assert r.status == 400, r.body
    assert r.content_type == "application/problem+json"
    assert r.body["type"].endswith("/invalid-json") and r.body["title"] == "Invalid JSON" and r.body["status"] == 400
    assert says in r.body["detail"] and r.body["detail"].startswith("the body is not valid JSON: ")
    assert r.body["errors"] == [{"field": "(body)", "message": r.body["errors"][0]["message"]}]
    assert says in r.body["errors"][0]["message"]
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


@pytest.mark.parametrize("given,stored", [("EUR", "EUR"), ("eur", "EUR"), ("Jpy", "JPY"), ("chf", "CHF"),
                                          ("XOF", "XOF"), ("ZWG", "ZWG")])
def test_currency_from_the_iso_4217_list_any_case_is_stored_upper_case(given: str, stored: str) -> None:
    rt = make_runtime()
    r = post(rt, {**BODY, "currency": given})
    assert r.status == 202, r.body
    assert rt.store.read_row(r.body["orderId"], "order")["Currency"] == stored
    [req] = rt.bus.peek("agent-inventory")
    assert req.body["order"]["currency"] == stored


@pytest.mark.parametrize("currency", ["ABC", "EU", "EURO", "", " EUR", "EUR ", "E1R", "QQQ", "ANG", "DEM",
                                      "\u0131nr", "\u20acUR", "usd\n"])
def test_currency_not_in_the_list_is_400_listing_the_codes(currency: str) -> None:
    rt = make_runtime()
    r = post(rt, {**BODY, "currency": currency})
    assert r.status == 400, r.body
    [err] = [e for e in r.body["errors"] if e["field"] == "currency"]
    assert err["message"].startswith("must be one of the ISO 4217 codes (list of 20")
    assert "lower case is accepted" in err["message"]
    listed = set(err["message"].rsplit(": ", 1)[1].split(", "))
    assert listed == CURRENCIES and {"EUR", "USD", "JPY", "GBP", "CHF"} <= listed
    _nothing_written(rt)


@pytest.mark.parametrize("code", ["XAU", "xts", "XXX", "XDR", "XBA"])
def test_iso_4217_codes_without_a_minor_unit_are_not_money(code: str) -> None:
    rt = make_runtime()
    r = post(rt, {**BODY, "currency": code})
    assert r.status == 400
    [err] = [e for e in r.body["errors"] if e["field"] == "currency"]
    assert err["message"].startswith(f"{code.upper()} has no minor unit") and "EUR" in err["message"]
    _nothing_written(rt)


def test_currency_case_is_one_body_for_idempotency() -> None:
    rt = make_runtime()
    first = post(rt, {**BODY, "currency": "EUR"}, headers={"Idempotency-Key": "k-case"})
    again = post(rt, {**BODY, "currency": "eur"}, headers={"Idempotency-Key": "k-case"})
    assert (first.status, again.status) == (202, 200) and again.body["orderId"] == first.body["orderId"]


def test_currency_list_is_the_one_the_openapi_document_enumerates() -> None:
    import yaml

    from local.procs import REPO_ROOT

    doc = yaml.safe_load((REPO_ROOT / "functions" / "openapi.yaml").read_text())
    listed = doc["components"]["schemas"]["OrderRequest"]["properties"]["currency"]["enum"]
    assert listed == sorted(CURRENCIES), "update the currency enum of functions/openapi.yaml"
    assert 150 < len(CURRENCIES) < 200 and "XTS" not in CURRENCIES and "XXX" not in CURRENCIES


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


def test_a_replay_leaves_no_deadline_row_of_its_own() -> None:
    """The submission puts its deadline row before its create; a replay's create conflicts, and
    the row it put is deleted again: the existing order keeps only its own (none, once ended)."""
    rt = make_runtime()
    oid = post(rt, headers={"Idempotency-Key": "key-7"}).body["orderId"]
    own = [(r["PartitionKey"], r["RowKey"]) for r in rt.store.index_rows()]
    assert len(own) == 1 and own[0][1].startswith(oid)
    rt.clock.advance(1)  # a later request: another due instant, another row key
    assert post(rt, headers={"Idempotency-Key": "key-7"}).status == 200
    sent = len(rt.bus.all())
    assert post(rt, {**BODY, "currency": "USD"}, headers={"Idempotency-Key": "key-7"}).status == 409
    assert [(r["PartitionKey"], r["RowKey"]) for r in rt.store.index_rows()] == own
    assert len(rt.bus.all()) == sent  # another body under the key: nothing is re-sent
    rt.store.delete_index(*own[0])  # the order ended: its last transition deleted its row
    rt.clock.advance(1)
    assert post(rt, headers={"Idempotency-Key": "key-7"}).status == 200
    assert rt.store.index_rows() == []


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


def _dashed(oid: str) -> str:
    return f"{oid[:8]}-{oid[8:12]}-{oid[12:16]}-{oid[16:20]}-{oid[20:]}"


def test_an_order_id_as_a_uuid_with_dashes_in_any_case_is_the_same_order() -> None:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    for form in (oid, _dashed(oid), _dashed(oid).upper(), _dashed(oid).title()):
        r = get_order(rt, form)
        assert r.status == 200 and r.body["orderId"] == oid, (form, r.body)
    missing = _dashed("ab" * 16).upper()
    r = get_order(rt, missing)
    assert r.status == 404 and r.body["detail"] == f"no order {'ab' * 16}"


@pytest.mark.parametrize("operate", [retry_order, cancel_order])
def test_operator_routes_take_the_dashed_form_too(operate) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    r = operate(rt, _dashed(oid).upper())
    assert r.status == 409 and r.body["orderId"] == oid  # found: in flight, so the wrong state
    assert operate(rt, _dashed("cd" * 16)).status == 404


@pytest.mark.parametrize("bad", [
    "A" * 32,  # the 32-digit form is the one responses use: lower case only
    "{" + _dashed("ab" * 16) + "}", "urn:uuid:" + _dashed("ab" * 16), _dashed("ab" * 16)[:-1],
    _dashed("ab" * 16) + "0", "ab" * 4 + "-" + "ab" * 12, "abababab-abab-abab-abab-ababababab-ab",
    _dashed("ab" * 16).replace("a", "g", 1), _dashed("ab" * 16) + "\n", " " + "ab" * 16,
    "\uff10" * 32, "0" * 32 + "\n",
])
@pytest.mark.parametrize("route", [get_order, retry_order, cancel_order])
def test_any_other_id_is_400_showing_both_forms(route, bad: str) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    r = route(rt, bad)
    assert r.status == 400 and r.content_type == "application/problem+json"
    assert r.body["type"].endswith("/invalid-order-id")
    for shown in ("32 lower-case hex digits", "0f8fad5bd9cb469fa16570867728950e",
                  "0f8fad5b-d9cb-469f-a165-70867728950e", "any case"):
        assert shown in r.body["detail"] and shown in r.body["errors"][0]["message"]
    assert r.body["errors"][0]["field"] == "id"
    assert rt.store.reads == []


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
