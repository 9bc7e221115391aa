"""Hostile input on the query endpoints: GET /api/orders (search) and GET /api/orders/{id}/history.

Two customers' orders (A: three, B: two) are the ground truth. Every bad query parameter
gets 400 problem+json naming it; every continuation token that was tampered with, truncated,
forged or comes from another query gets 400 ``invalid-continuation-token``; no answer ever
holds an order the query did not ask for; a search writes nothing.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from shared.core.workflows import DEFAULT_WORKFLOW
from tests.hostile.fuzz_queries import parse_instant, tamper
from tests.hostile.stackutil import (
    GOOD_BODY,
    NOTHING_NEW,
    Params,
    RawResponse,
    Tables,
    get,
    search_all,
    send,
    submit,
    wait_searchable,
    wait_settled,
    with_query,
)

pytestmark = pytest.mark.integration

SEARCH = "/api/orders"
CATEGORIES = ("inFlight", "attention", "processed", "error")
SUMMARY_KEYS = {"orderId", "processState", "outcome", "customerId", "createdAt", "updatedAt", "failureCount",
                "priority", "category", "workflow", "failedStep"}


@dataclass(frozen=True)
class Customers:
    a: str
    b: str
    a_orders: list[dict[str, Any]]  # as the search shows them, newest first
    b_orders: list[dict[str, Any]]

    @property
    def a_ids(self) -> list[str]:
        return [o["orderId"] for o in self.a_orders]

    @property
    def b_ids(self) -> list[str]:
        return [o["orderId"] for o in self.b_orders]


@pytest.fixture(scope="module")
def customers(hostile_stack: Any, tables: Tables) -> Customers:
    tag = uuid.uuid4().hex[:10]
    a, b = f"hs-a-{tag}", f"hs-b-{tag}"
    a_ids = [submit(hostile_stack, {**GOOD_BODY, "customerId": a}) for _ in range(3)]
    b_ids = [submit(hostile_stack, {**GOOD_BODY, "customerId": b}) for _ in range(2)]
    for oid in a_ids + b_ids:
        wait_settled(tables, oid)
    a_orders = wait_searchable(hostile_stack, {"customerId": a, "state": "processed"}, a_ids)
    b_orders = wait_searchable(hostile_stack, {"customerId": b, "state": "processed"}, b_ids)
    return Customers(a, b, a_orders, b_orders)


def search(stack: Any, params: Params) -> RawResponse:
    return get(stack, SEARCH, params)


def assert_400(r: RawResponse, *named: str) -> dict[str, Any]:
    """A 400 problem+json whose text names each of ``named``."""
    assert r.status == 400 and r.is_problem, (r.status, r.content_type, r.body[:300])
    doc: dict[str, Any] = r.json()
    assert doc["status"] == 400 and doc["title"] and doc["type"].startswith("http"), doc
    text = json.dumps(doc)
    for name in named:
        assert name in text, (name, doc)
    return doc


def assert_bad_token(r: RawResponse) -> None:
    doc = assert_400(r)
    assert doc["type"].endswith("/invalid-continuation-token"), doc


def assert_leaks_nothing(r: RawResponse, *order_ids: str) -> None:
    for oid in order_ids:
        assert oid.encode() not in r.body, (oid, r.body[:300])


def page(stack: Any, params: Params) -> dict[str, Any]:
    r = search(stack, params)
    assert r.status == 200, (params, r.status, r.body[:300])
    body: dict[str, Any] = r.json()
    assert set(body) >= {"orders", "continuationToken"}
    return body


def ids_of(stack: Any, params: Params) -> list[str]:
    return [o["orderId"] for o in search_all(stack, params)]


# ------------------------------------------------------------------ what a search returns


def test_a_customer_gets_exactly_their_orders_newest_first(hostile_stack: Any, customers: Customers) -> None:
    found = search_all(hostile_stack, {"customerId": customers.a})
    assert [o["orderId"] for o in found] == customers.a_ids and len(found) == 3
    created = [parse_instant(o["createdAt"]) for o in found]
    assert all(c is not None for c in created) and created == sorted(created, reverse=True), created
    for o in found:
        assert set(o) >= SUMMARY_KEYS, o
        assert o["customerId"] == customers.a and o["category"] == "processed" and o["processState"] == "Processed"
    r = search(hostile_stack, {"customerId": customers.a})
    assert_leaks_nothing(r, *customers.b_ids)


def test_pages_of_one_cover_the_customer_once(hostile_stack: Any, customers: Customers) -> None:
    seen: list[str] = []
    token = None
    for _ in range(5):
        body = page(hostile_stack, [("customerId", customers.a), ("limit", "1")]
                    + ([("continuationToken", token)] if token else []))
        assert len(body["orders"]) <= 1
        seen += [o["orderId"] for o in body["orders"]]
        token = body["continuationToken"]
        if token is None:
            break
    assert seen == customers.a_ids and token is None


def test_the_same_token_gives_the_same_page(hostile_stack: Any, customers: Customers) -> None:
    token = page(hostile_stack, {"customerId": customers.a, "limit": "1"})["continuationToken"]
    assert isinstance(token, str) and token
    query = {"customerId": customers.a, "limit": "1", "continuationToken": token}
    first, again = page(hostile_stack, query), page(hostile_stack, query)
    assert first == again and [o["orderId"] for o in first["orders"]] == customers.a_ids[1:2]


@pytest.mark.parametrize("state", CATEGORIES)
def test_state_filter(hostile_stack: Any, customers: Customers, state: str) -> None:
    found = ids_of(hostile_stack, {"customerId": customers.a, "state": state})
    assert found == (customers.a_ids if state == "processed" else [])
    for o in page(hostile_stack, {"state": state, "limit": "200"})["orders"]:
        assert o["category"] == state, o


UNKNOWN_PARAMS = [("$filter", "PartitionKey ne ''"), ("$top", "1000"), ("$select", "*"), ("filter", "RowKey gt ''"),
                  ("partitionKey", "orders"), ("rowKey", "all-"), ("foo", "bar"), ("failedstep", "charge-payment"),
                  ("Workflow", "order"), ("STATE", "processed"), ("customerid", "x"), ("workflowVersion", "1")]


@pytest.mark.parametrize(("name", "value"), UNKNOWN_PARAMS, ids=lambda v: repr(v)[:30])
def test_an_unknown_query_parameter_is_400_naming_it(hostile_stack: Any, customers: Customers, name: str,
                                                       value: str) -> None:
    """OData system query options and friends are not the API's: refused, never passed on, never ignored
    (a misspelt filter answered with every order would look like an answer)."""
    r = search(hostile_stack, [("customerId", customers.a), (name, value)])
    doc = assert_400(r, name, "workflow", "failedStep", "continuationToken")
    assert doc["type"].endswith("/invalid-query") and [e["field"] for e in doc["errors"]] == [name], doc
    assert_leaks_nothing(r, *customers.a_ids, *customers.b_ids)


def test_every_unknown_query_parameter_is_named(hostile_stack: Any, customers: Customers) -> None:
    r = search(hostile_stack, [("customerId", customers.a), *UNKNOWN_PARAMS])
    doc = assert_400(r)
    assert sorted(e["field"] for e in doc["errors"]) == sorted(n for n, _ in UNKNOWN_PARAMS), doc


def test_the_function_key_in_the_query_is_no_unknown_parameter(hostile_stack: Any, customers: Customers) -> None:
    """``code``: how a caller may pass the function key; whatever its value, not a filter."""
    assert ids_of(hostile_stack, [("customerId", customers.a), ("code", "x' or 1 eq 1")]) == customers.a_ids


def test_a_search_writes_nothing(hostile_stack: Any, tables: Tables, customers: Customers) -> None:
    rows = {oid: tables.partition(oid) for oid in customers.a_ids}
    before = tables.snapshot()
    for params in ({"customerId": customers.a}, {"state": "attention"}, {"customerId": "x' or PartitionKey ne '"},
                   {"limit": "0"}, {"continuationToken": "AAAA"}):
        search(hostile_stack, params)
    assert before.new_rows(tables.snapshot()) == NOTHING_NEW
    assert {oid: tables.partition(oid) for oid in customers.a_ids} == rows  # ETags included


# ------------------------------------------------------------------ dates


def _instant(order: dict[str, Any]) -> datetime:
    parsed = parse_instant(order["createdAt"])
    assert parsed is not None, order
    return parsed


def test_created_from_is_inclusive_and_created_to_exclusive(hostile_stack: Any, customers: Customers) -> None:
    newest, middle, oldest = customers.a_orders
    a = customers.a
    assert ids_of(hostile_stack, {"customerId": a, "createdFrom": newest["createdAt"]}) == [newest["orderId"]]
    assert ids_of(hostile_stack, {"customerId": a, "createdTo": newest["createdAt"]}) == customers.a_ids[1:]
    assert ids_of(hostile_stack, {"customerId": a, "createdFrom": oldest["createdAt"],
                                  "createdTo": newest["createdAt"]}) == customers.a_ids[1:]
    assert ids_of(hostile_stack, {"customerId": a, "createdFrom": middle["createdAt"],
                                  "createdTo": middle["createdAt"]}) == []  # empty range: 200, nothing


def test_the_same_instant_in_any_offset_or_as_a_date(hostile_stack: Any, customers: Customers) -> None:
    a = customers.a
    oldest = _instant(customers.a_orders[-1])
    for form in (oldest.astimezone(UTC).isoformat().replace("+00:00", "Z"),
                 oldest.astimezone(UTC).isoformat(),
                 oldest.astimezone(timezone(timedelta(hours=2))).isoformat(),
                 oldest.astimezone(timezone(-timedelta(hours=9, minutes=30))).isoformat()):
        assert ids_of(hostile_stack, {"customerId": a, "createdFrom": form}) == customers.a_ids, form
    today = oldest.astimezone(UTC).date()
    assert ids_of(hostile_stack, {"customerId": a, "createdFrom": today.isoformat()}) == customers.a_ids
    tomorrow = (today + timedelta(days=1)).isoformat()
    assert ids_of(hostile_stack, {"customerId": a, "createdTo": tomorrow}) == customers.a_ids
    assert ids_of(hostile_stack, {"customerId": a, "createdFrom": tomorrow}) == []
    assert ids_of(hostile_stack, {"customerId": a, "createdTo": "2000-01-01"}) == []


BAD_DATES = [
    "2020-13-01", "2020-02-30", "2020-00-10", "2020-01-01T00:00:00", "2020-01-01T25:00:00Z",
    "2020-01-01T00:00:00+25:00", "9999-12-31T23:59:60Z", "0000-01-01", "10000-01-01", "-2020-01-01",
    "yesterday", "now", "1e10", "1700000000", "2020/01/01", "01/02/2020", "2020-01-01Z", "2020-01-01T",
    "2020-01-01T00:00:00ZZ", "2020-01-01T00:00:00Z ", " 2020-01-01", "2020-01-01\n", "2020-01-01\x00",
    "\u0662\u0660\u0662\u0660-01-01", "\uff12020-01-01", "2" * 5000, "null", "[]",
]


@pytest.mark.parametrize("param", ["createdFrom", "createdTo"])
@pytest.mark.parametrize("value", BAD_DATES, ids=lambda v: repr(v)[:40])
def test_bad_dates_are_400(hostile_stack: Any, customers: Customers, param: str, value: str) -> None:
    r = search(hostile_stack, {param: value, "customerId": customers.a})
    assert_400(r, param)
    assert_leaks_nothing(r, *customers.a_ids)


@pytest.mark.parametrize("param", ["createdFrom", "createdTo"])
@pytest.mark.parametrize("value", ["9999-12-31T23:59:59-12:00", "9999-12-31T23:59:59.999999-23:59",
                                   "9999-12-31", "9999-12-31T23:59:59Z", "1970-01-01", "1970-01-01T00:00:00Z",
                                   "1970-01-01T00:00:00+14:00", "1970-01-01T00:00:00.000001-00:01",
                                   "1969-12-31", "1579-06-06", "0001-01-01"])
def test_dates_at_the_ends_of_the_range(hostile_stack: Any, customers: Customers, param: str, value: str) -> None:
    """Valid ISO-8601 instants near the ends of what a key can hold (an offset may move them
    past year 9999 or before 1970 in UTC): 400, or the right answer; never a 5xx."""
    r = search(hostile_stack, {param: value, "customerId": customers.a})
    assert r.status in (200, 400), (r.status, r.body[:300])
    if r.status == 400:
        assert_400(r, param)
        return
    instant = parse_instant(value)
    assert instant is not None
    everything = (param == "createdFrom") == (instant.astimezone(UTC).year < 2000)
    assert [o["orderId"] for o in r.json()["orders"]] == (customers.a_ids if everything else []), value


def test_an_unencoded_plus_is_a_space_and_400(hostile_stack: Any) -> None:
    r = send(hostile_stack, "GET", "/api/orders?createdFrom=2020-01-01T00:00:00+02:00")
    assert_400(r, "createdFrom")


def test_from_after_to_is_400(hostile_stack: Any) -> None:
    for params in ({"createdFrom": "2020-01-02", "createdTo": "2020-01-01"},
                   {"createdFrom": "2020-01-01T00:00:00.000001Z", "createdTo": "2020-01-01T00:00:00Z"},
                   {"createdFrom": "2020-01-01T01:00:00+02:00", "createdTo": "2020-01-01T00:00:00+02:00"}):
        doc = assert_400(search(hostile_stack, params))
        assert "createdFrom" in json.dumps(doc) or "createdTo" in json.dumps(doc), doc
    # The same instant twice is an empty range, not an error.
    assert search(hostile_stack, {"createdFrom": "2020-01-01", "createdTo": "2020-01-01"}).status == 200


# ------------------------------------------------------------------ limits, states, customers

BAD_LIMITS = ["0", "-1", "-0", "201", "1000", "1000000000", "1" + "0" * 40, "abc", "1.5", "1.0", "1e2", "0x10",
              "1_0", "\u0663", "\uff15", "5abc", "NaN", "Infinity", "true", "[]", "5\x00", "9" * 5000]


@pytest.mark.parametrize("value", BAD_LIMITS, ids=lambda v: repr(v)[:30])
def test_bad_search_limits_are_400(hostile_stack: Any, value: str) -> None:
    assert_400(search(hostile_stack, {"limit": value}), "limit")


@pytest.mark.parametrize("value", ["1", "50", "200"])
def test_search_limits_in_range(hostile_stack: Any, customers: Customers, value: str) -> None:
    body = page(hostile_stack, {"limit": value})
    assert 1 <= len(body["orders"]) <= int(value)  # the session's stack holds the customers' orders at least


def test_a_repeated_limit_never_passes_the_maximum(hostile_stack: Any) -> None:
    r = send(hostile_stack, "GET", "/api/orders?limit=1&limit=1000000")
    assert r.status in (200, 400), r.status
    if r.status == 200:
        assert len(r.json()["orders"]) <= 200


BAD_STATES = ["unknown", "held", "failed", "cancelled", "terminated", "Pending", "Processed", "PROCESSED",
              "inflight", "INFLIGHT", "in_flight", "in flight", "processed ", " processed", "processed\n",
              "processed\x00", "processed,error", "*", "%", "all", "cat-processed", "x' or Category ne '",
              "s" * 5000]


@pytest.mark.parametrize("value", BAD_STATES, ids=lambda v: repr(v)[:30])
def test_unknown_states_are_400_naming_the_allowed_values(hostile_stack: Any, value: str) -> None:
    assert_400(search(hostile_stack, {"state": value}), "state", *CATEGORIES)


def test_a_repeated_state_is_not_two_states(hostile_stack: Any, customers: Customers) -> None:
    r = send(hostile_stack, "GET",
             with_query(SEARCH, [("state", "attention"), ("state", "processed"), ("customerId", customers.a)]))
    assert r.status in (200, 400), r.status
    if r.status == 200:  # the last (or first) value, never a union with another category's orders
        states = {o["category"] for o in r.json()["orders"]}
        assert len(states) <= 1, states


def test_workflow_and_failed_step_filters(hostile_stack: Any, customers: Customers) -> None:
    found = search_all(hostile_stack, {"customerId": customers.a, "workflow": DEFAULT_WORKFLOW})
    assert [o["orderId"] for o in found] == customers.a_ids
    assert all(o["workflow"] == DEFAULT_WORKFLOW and o["failedStep"] is None for o in found), found
    for params in ({"workflow": "no-such-workflow"}, {"failedStep": "charge-payment"},
                   {"workflow": DEFAULT_WORKFLOW, "failedStep": "create-shipment"}):
        assert ids_of(hostile_stack, {"customerId": customers.a, **params}) == [], params
    for o in page(hostile_stack, {"failedStep": "charge-payment", "limit": "200"})["orders"]:
        assert o["failedStep"] == "charge-payment", o


BAD_NAMES = ["Order", "ORDER", "1order", "-order", "order_x", "order x", "order/x", "order'", "o" * 64,
             "order\n", "ord\u00e9r", "order@1", "order:1", "*", "order' or 'a' eq 'a", "%", "\U0001f600"]


@pytest.mark.parametrize("param", ["workflow", "failedStep"])
@pytest.mark.parametrize("value", BAD_NAMES, ids=lambda v: repr(v)[:30])
def test_bad_workflow_or_step_names_are_400(hostile_stack: Any, customers: Customers, param: str,
                                            value: str) -> None:
    r = search(hostile_stack, {"customerId": customers.a, param: value.encode().decode("unicode_escape")})
    assert_400(r, param)
    assert_leaks_nothing(r, *customers.a_ids, *customers.b_ids)


BAD_CUSTOMERS = ["c/1", "c\\1", "c#1", "c?1", "c 1", "c'1", "-c", "c" * 65, "kund\u00e9", "\U0001f600", "c\n",
                 "c\x00", "c\u200b1", "\uff11", "c%2F1"]


@pytest.mark.parametrize("value", BAD_CUSTOMERS, ids=lambda v: repr(v)[:30])
def test_bad_customer_ids_are_400(hostile_stack: Any, customers: Customers, value: str) -> None:
    r = search(hostile_stack, {"customerId": value})
    assert_400(r, "customerId")
    assert_leaks_nothing(r, *customers.a_ids, *customers.b_ids)


def test_a_customer_id_differing_in_case_or_prefix_is_another_customer(hostile_stack: Any,
                                                                         customers: Customers) -> None:
    for other in (customers.a.upper(), customers.a[:-1], customers.a + "0", customers.a[: len("hs-a-")]):
        r = search(hostile_stack, {"customerId": other})
        assert r.status == 200 and r.json()["orders"] == [], (other, r.body[:300])


# ------------------------------------------------------------------ continuation tokens


def _token(stack: Any, params: Params) -> str:
    token = page(stack, params)["continuationToken"]
    assert isinstance(token, str) and token, params
    return token


@pytest.fixture(scope="module")
def a_token(hostile_stack: Any, customers: Customers) -> str:
    return _token(hostile_stack, {"customerId": customers.a, "limit": "1"})


@pytest.mark.parametrize("how", range(8))
def test_a_tampered_token_is_400(hostile_stack: Any, customers: Customers, a_token: str, how: int) -> None:
    bad = tamper(a_token, how)
    assert bad != a_token
    r = search(hostile_stack, {"customerId": customers.a, "limit": "1", "continuationToken": bad})
    assert_bad_token(r)
    assert_leaks_nothing(r, *customers.a_ids)


def test_every_bit_flip_is_400(hostile_stack: Any, customers: Customers, a_token: str) -> None:
    """One bit of each of the token's characters flipped (staying printable): all 400, the
    last one too (a flip in its spare bits decodes to the same bytes: not a token this app wrote)."""
    accepted = []
    for i, ch in enumerate(a_token):
        flipped = chr(ord(ch) ^ 0x01)
        if not flipped.isprintable() or flipped == ch:
            continue
        bad = a_token[:i] + flipped + a_token[i + 1:]
        r = search(hostile_stack, {"customerId": customers.a, "limit": "1", "continuationToken": bad})
        if r.status != 400:
            accepted.append((i, ch, flipped, r.status))
        else:
            assert_bad_token(r)
    # The last character included: its spare bits are another spelling of the same bytes.
    assert accepted == [], accepted


def test_another_spelling_of_the_same_bytes_is_400(hostile_stack: Any, customers: Customers, a_token: str) -> None:
    """Padded, in the standard base64 alphabet, or with other spare bits: the same bytes, but not
    a token this app wrote (a token is compared as issued)."""
    raw = base64.urlsafe_b64decode(a_token + "=" * (-len(a_token) % 4))
    spellings = {a_token + "=" * (-len(a_token) % 4), base64.b64encode(raw).decode(),
                 base64.b64encode(raw).decode().rstrip("="), a_token + "\n", " " + a_token, a_token + "%"}
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(a_token[-1])
    spare = {1: 0, 2: 0b1111, 3: 0b11}.get(len(a_token) % 4, 0)  # unused low bits of the last character
    for bits in range(1, spare + 1):
        spellings.add(a_token[:-1] + alphabet[last ^ bits])
    spellings.discard(a_token)
    assert spellings
    for token in sorted(spellings):
        r = search(hostile_stack, {"customerId": customers.a, "limit": "1", "continuationToken": token})
        assert_bad_token(r)


@pytest.mark.parametrize("cut", [1, 2, 4, 8, "half", "one-left"])
def test_a_truncated_token_is_400(hostile_stack: Any, customers: Customers, a_token: str, cut: Any) -> None:
    stem = a_token.rstrip("=")
    bad = stem[:1] if cut == "one-left" else stem[: len(stem) // 2] if cut == "half" else stem[:-cut]
    assert_bad_token(search(hostile_stack, {"customerId": customers.a, "limit": "1", "continuationToken": bad}))


def test_another_querys_token_is_400(hostile_stack: Any, customers: Customers, a_token: str) -> None:
    b_token = _token(hostile_stack, {"customerId": customers.b, "limit": "1"})
    processed_token = _token(hostile_stack, {"state": "processed", "limit": "1"})
    all_token = _token(hostile_stack, {"limit": "1"})
    workflow_token = _token(hostile_stack, {"customerId": customers.a, "workflow": DEFAULT_WORKFLOW, "limit": "1"})
    cases = [
        ({"customerId": customers.a, "limit": "1"}, b_token),
        ({"customerId": customers.b, "limit": "1"}, a_token),
        ({"limit": "1"}, a_token),
        ({"customerId": customers.a, "limit": "1"}, all_token),
        ({"customerId": customers.a, "limit": "1"}, processed_token),
        ({"customerId": customers.a, "state": "processed", "limit": "1"}, a_token),
        ({"customerId": customers.a, "createdFrom": "2020-01-01", "limit": "1"}, a_token),
        ({"state": "error", "limit": "1"}, processed_token),
        ({"customerId": customers.a, "workflow": DEFAULT_WORKFLOW, "limit": "1"}, a_token),
        ({"customerId": customers.a, "failedStep": "charge-payment", "limit": "1"}, a_token),
        ({"customerId": customers.a, "limit": "1"}, workflow_token),
        ({"customerId": customers.a, "workflow": "other", "limit": "1"}, workflow_token),
        ({"customerId": customers.a, "workflow": DEFAULT_WORKFLOW, "failedStep": "x", "limit": "1"}, workflow_token),
    ]
    for params, token in cases:
        r = search(hostile_stack, {**params, "continuationToken": token})
        assert_bad_token(r)
        if params.get("customerId") == customers.a:
            assert_leaks_nothing(r, *customers.b_ids)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


FORGED = {
    "empty-json": _b64(b"{}"),
    "null-json": _b64(b"null"),
    "row-key": _b64(json.dumps({"rk": "all-", "pk": "orders"}).encode()),
    "next-keys": _b64(json.dumps({"NextPartitionKey": "orders", "NextRowKey": "all-0"}).encode()),
    "customer-range": _b64(json.dumps({"prefix": "cust-", "after": ""}).encode()),
    "zeros": _b64(b"\x00" * 48),
    "ones": _b64(b"\xff" * 48),
    "random": _b64(uuid.uuid4().bytes * 3),
    "short": "AAAA",
    "padding-only": "====",
    "not-base64": "!!!!",
    "odata-quote": "x' or PartitionKey ne '",
    "odata-rowkey": "all-' or RowKey gt '",
    "percent": "%00",
    "unicode": "\u00e9\u00e9\u00e9\u00e9",
    "newline": "AAAA\nAAAA",
    "nul": "AAAA\x00AAAA",
    "dots": "../../..",
    "long-8k": _b64(b"\x01" * 6000),
}


@pytest.mark.parametrize("name", sorted(FORGED))
def test_a_forged_token_is_400(hostile_stack: Any, customers: Customers, name: str) -> None:
    r = search(hostile_stack, {"continuationToken": FORGED[name], "limit": "200"})
    assert_bad_token(r)
    assert_leaks_nothing(r, *customers.a_ids, *customers.b_ids)


def stack_keys(stack: Any) -> Any:
    """The token keys the stack's app was given (its TokenKeys setting)."""
    from shared.settings import TOKEN_KEYS, parse_token_keys

    return parse_token_keys(stack.settings[TOKEN_KEYS])


def test_a_token_made_with_the_apps_own_key_stays_in_its_query(hostile_stack: Any, customers: Customers) -> None:
    """Whoever holds the token MAC's key (the stack's TokenKeys, as a leaked key would be) can make
    a token that passes it. What the token holds is checked again: a position outside the query's
    own key range (another customer's, every order's, before or after the range), or not a
    position at all, is 400; one inside it pages through that customer's orders only."""
    from shared.api.search import parse_query
    from shared.api.tokens import issue as issue_with
    from shared.core.statemachine.search_index import customer_key

    def issue(scope: str, position: Any) -> str:
        return issue_with(stack_keys(hostile_stack), scope, position)

    query = parse_query({"customerId": customers.a})
    scope = query.scope  # type: ignore[union-attr]
    a_prefix, b_prefix = f"cust-{customer_key(customers.a)}-", f"cust-{customer_key(customers.b)}-"
    outside: list[Any] = [b_prefix, "all-", "cat-processed-", "fin-", "", "~", a_prefix[:-1], a_prefix[:-1] + ".",
                          5, None, True, ["x"], {"k": a_prefix}, "x" * 600]
    for position in [{"k": k} for k in outside] + [{}, {"after": 1}]:
        r = search(hostile_stack, {"customerId": customers.a, "continuationToken": issue(scope, position)})
        assert_bad_token(r)
        assert_leaks_nothing(r, *customers.b_ids)
    r = search(hostile_stack, {"customerId": customers.a, "continuationToken": issue(scope, {"k": a_prefix})})
    assert r.status == 200 and [o["orderId"] for o in r.json()["orders"]] == customers.a_ids


def test_a_history_token_made_with_the_apps_own_key(hostile_stack: Any, customers: Customers) -> None:
    """The same for history: only a non-negative event number of this order's history; any
    other order's events never appear."""
    from shared.api.tokens import issue as issue_with

    def issue(scope: str, position: Any) -> str:
        return issue_with(stack_keys(hostile_stack), scope, position)

    oid, other = customers.a_ids[0], customers.b_ids[0]
    scope = f"history:{oid}"
    for position in ({"after": -1}, {"after": "1"}, {"after": True}, {"after": None}, {"after": 1.5}, {},
                     {"after": [1]}):
        assert_bad_token(_history(hostile_stack, oid, {"continuationToken": issue(scope, position)}))
    assert_bad_token(_history(hostile_stack, other, {"continuationToken": issue(scope, {"after": 1})}))
    for after in (10**30, 2**63, 99_999_999, 100_000_000):
        r = _history(hostile_stack, oid, {"continuationToken": issue(scope, {"after": after})})
        assert r.status in (200, 400), (after, r.status, r.body[:300])
        if r.status == 200:
            assert r.json()["history"] == [] and r.json()["orderId"] == oid, r.body[:300]
    r = _history(hostile_stack, oid, {"continuationToken": issue(scope, {"after": 1})})
    assert r.status == 200 and r.json()["history"][0]["seq"] == 2


def test_a_huge_token_is_rejected(hostile_stack: Any) -> None:
    """60 kB of token: 400 from the app (or 414 from the host: the URL is too long), never 5xx."""
    r = search(hostile_stack, {"continuationToken": "A" * 60_000})
    assert r.status in (400, 414), (r.status, r.body[:300])
    if r.status == 400:
        assert_bad_token(r)


# ------------------------------------------------------------------ history


def _history(stack: Any, oid: str, params: Params = ()) -> RawResponse:
    return get(stack, f"/api/orders/{oid}/history", params)


def test_history_pages_oldest_first(hostile_stack: Any, customers: Customers) -> None:
    oid = customers.a_ids[0]
    view = get(hostile_stack, f"/api/orders/{oid}").json()
    full = _history(hostile_stack, oid, {"limit": "1000"}).json()
    assert full["orderId"] == oid and full["continuationToken"] is None
    events = full["history"]
    assert events == view["history"] and view["historyContinuationToken"] is None
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["event"] == "accepted" and events[-1]["event"] == "processed"
    paged: list[dict[str, Any]] = []
    token = None
    for _ in range(len(events) + 2):
        body = _history(hostile_stack, oid, [("limit", "1")] + ([("continuationToken", token)] if token else []))
        assert body.status == 200, body.body[:300]
        paged += body.json()["history"]
        token = body.json()["continuationToken"]
        if token is None:
            break
    assert paged == events


@pytest.mark.parametrize("value", ["0", "-1", "1001", "1000000", "abc", "1.5", "\u0663", "1_0", "9" * 5000])
def test_bad_history_limits_are_400(hostile_stack: Any, customers: Customers, value: str) -> None:
    assert_400(_history(hostile_stack, customers.a_ids[0], {"limit": value}), "limit")


@pytest.mark.parametrize("value", ["1", "1000"])
def test_history_limits_in_range(hostile_stack: Any, customers: Customers, value: str) -> None:
    r = _history(hostile_stack, customers.a_ids[0], {"limit": value})
    assert r.status == 200 and 1 <= len(r.json()["history"]) <= int(value)


def test_history_tokens(hostile_stack: Any, customers: Customers, a_token: str) -> None:
    """Tampered, forged, another order's or a search's token: 400; never another order's events."""
    first, second = customers.a_ids[0], customers.b_ids[0]
    token = _history(hostile_stack, first, {"limit": "1"}).json()["continuationToken"]
    assert isinstance(token, str) and token
    bad = [tamper(token, how) for how in range(8)] + [a_token, token.rstrip("=")[:-1], "AAAA",
                                                        FORGED["row-key"], "x' or RowKey ne '"]
    for t in bad:
        assert_bad_token(_history(hostile_stack, first, {"limit": "1", "continuationToken": t}))
    r = _history(hostile_stack, second, {"limit": "1", "continuationToken": token})
    assert_bad_token(r)
    assert_leaks_nothing(r, first)
    assert_bad_token(search(hostile_stack, {"limit": "1", "continuationToken": token}))
    ok = _history(hostile_stack, first, {"limit": "1", "continuationToken": token})
    assert ok.status == 200 and ok.json()["history"][0]["seq"] == 2


def test_history_of_an_unknown_order_is_404_whatever_the_query(hostile_stack: Any) -> None:
    unknown = uuid.uuid4().hex
    r = _history(hostile_stack, unknown)
    assert r.status == 404 and r.is_problem
    r = _history(hostile_stack, unknown, {"limit": "0", "continuationToken": "x"})
    assert r.status in (400, 404) and r.is_problem


@pytest.mark.parametrize("name", ["after", "Limit", "$top", "state", "from"])
def test_an_unknown_history_parameter_is_400_naming_it(hostile_stack: Any, customers: Customers, name: str) -> None:
    r = _history(hostile_stack, customers.a_ids[0], {"limit": "5", name: "1"})
    doc = assert_400(r, name, "continuationToken")
    assert doc["type"].endswith("/invalid-query") and [e["field"] for e in doc["errors"]] == [name], doc
    assert _history(hostile_stack, customers.a_ids[0], {"limit": "5", "code": "x"}).status == 200
