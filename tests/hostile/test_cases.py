"""Explicit hostile inputs on every HTTP entry point, through the local host and the app.

Each rejected case must get the right 4xx as application/problem+json naming the bad fields,
and write nothing: the state table and the deadline index are compared before and after.
Requests are sent byte for byte (tests.hostile.stackutil.send), so paths, headers and bodies
reach the host exactly as written here, each with the key its route takes (the function key on a
client route, the master key on an operator route, none on the fallback's answers): a hostile
request reaches the app, not the host's 401.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import pytest

from tests.hostile.stackutil import (
    GOOD_BODY,
    NOTHING_NEW,
    ROWS_PER_ORDER,
    RawResponse,
    Tables,
    order_rows,
    send,
)

pytestmark = pytest.mark.integration

JSON = [("Content-Type", "application/json")]
LIMIT = 65536  # MaxRequestBytes (default) in the session stack



def body_of(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def with_item(**fields: Any) -> dict[str, Any]:
    item = {**GOOD_BODY["items"][0], **fields}
    return {**GOOD_BODY, "items": [{k: v for k, v in item.items() if v is not _DROP}]}


_DROP = object()


def assert_rejected(stack: Any, tables: Tables, method: str, path: bytes | str, body: bytes,
                    headers: Iterable[tuple[str, str | bytes]], status: int | set[int],
                    fields: Iterable[str] = (), problem: bool = True) -> RawResponse:
    before = tables.snapshot()
    r = send(stack, method, path, body, headers)
    after = tables.snapshot()
    statuses = {status} if isinstance(status, int) else status
    assert r.status in statuses, (r.status, r.body[:300])
    if problem:
        assert r.is_problem, (r.status, r.content_type, r.body[:300])
        doc = r.json()
        assert doc["status"] == r.status and doc["title"] and doc["type"].startswith("http")
        named = {e["field"] for e in doc.get("errors", [])}
        text = json.dumps(doc.get("errors", []), ensure_ascii=False)
        for f in fields:
            assert f in named or f in text, (f, doc)
    assert before.new_rows(after) == NOTHING_NEW
    return r


def post_rejected(stack: Any, tables: Tables, body: bytes, status: int | set[int], fields: Iterable[str] = (),
                  headers: Iterable[tuple[str, str | bytes]] = tuple(JSON)) -> RawResponse:
    return assert_rejected(stack, tables, "POST", "/api/orders", body, headers, status, fields)


def post_ok(stack: Any, body: bytes, headers: Iterable[tuple[str, str | bytes]] = tuple(JSON)) -> RawResponse:
    r = send(stack, "POST", "/api/orders", body, headers)
    assert r.status == 202, (r.status, r.body[:300])
    return r


# ------------------------------------------------------------------ ids in routes

BAD_IDS = {
    "slash-encoded": "a%2Fb",
    "slash-encoded-lower": "abc%2fdef",
    "backslash": "a\\b",
    "backslash-encoded": "a%5Cb",
    "hash-encoded": "a%23b",
    "question-encoded": "a%3Fb",
    "nul": "a%00b",
    "newline": "a%0Ab",
    "crlf-header-injection": "a%0D%0ASet-Cookie:%20x=1",
    "tab": "a%09b",
    "del": "a%7Fb",
    "long": "a" * 8000,
    "long-hex": "0" * 33,
    "short-hex": "0" * 31,
    "upper-hex": "A" * 32,  # the undashed form is the one responses use: lower case only
    "uuid-braces": "{0f8fad5b-d9cb-469f-a165-70867728950e}",
    "uuid-urn": "urn:uuid:0f8fad5b-d9cb-469f-a165-70867728950e",
    "uuid-misplaced-dashes": "0f8fad5bd-9cb-469f-a165-70867728950e",
    "uuid-short": "0f8fad5b-d9cb-469f-a165-70867728950",
    "unicode": "%C3%A9" * 16,
    "unicode-digits": "%D9%A3" * 32,
    "odata-quote": "x'%20or%20PartitionKey%20ne%20'",
    "dot-dot": "..",
    "percent": "%25",
    "space-padded": "%20" + "0" * 32,
    "hex-with-newline": "0" * 32 + "%0A",
}


ID_CASES = sorted(BAD_IDS)

# Every route that takes an order id, and its method.
ID_ROUTES = {"": "GET", "/history": "GET", "/retry": "POST", "/cancel": "POST", "/terminate": "POST",
             "/suspend": "POST", "/resume": "POST"}
OPERATOR_ROUTES = ["/retry", "/cancel", "/terminate", "/suspend", "/resume"]


@pytest.mark.parametrize("route", sorted(ID_ROUTES))
@pytest.mark.parametrize("name", ID_CASES)
def test_malformed_order_id(hostile_stack: Any, tables: Tables, route: str, name: str) -> None:
    method = ID_ROUTES[route]
    assert_rejected(hostile_stack, tables, method, f"/api/orders/{BAD_IDS[name]}{route}", b"", [], 400, ["id"])


@pytest.mark.parametrize("raw_path", ["/api/orders/a#b", "/api/orders/a?b=c"])
def test_hash_and_question_mark_end_the_path(hostile_stack: Any, tables: Tables, raw_path: str) -> None:
    # '#' starts a fragment and '?' a query: the id the app sees is 'a', malformed.
    assert_rejected(hostile_stack, tables, "GET", raw_path, b"", [], 400, ["id"])


def test_unencoded_slash_in_id_matches_no_function(hostile_stack: Any, tables: Tables) -> None:
    # An unencoded '/' makes a path no route matches: the app's fallback route answers 404
    # problem+json naming the path (functions/fallback.py); nothing reaches the store.
    for path in ("/api/orders/a/b", "/api/orders/a/b/retry", "/api/orders/" + "0" * 32 + "/x/cancel",
                 "/api/orders/a/b/terminate", "/api/orders/a/b/history"):
        method = "POST" if path.endswith(("retry", "terminate")) else "GET"
        r = assert_rejected(hostile_stack, tables, method, path, b"", [], 404)
        assert r.json()["type"].endswith("/no-route") and path in r.json()["detail"], r.json()


@pytest.mark.parametrize("route", sorted(ID_ROUTES))
@pytest.mark.parametrize("unknown", ["0" * 32, "0f8fad5b-d9cb-469f-a165-70867728950e",
                                     "0F8FAD5B-D9CB-469F-A165-70867728950E"])
def test_unknown_order_is_404(hostile_stack: Any, tables: Tables, route: str, unknown: str) -> None:
    assert_rejected(hostile_stack, tables, ID_ROUTES[route], f"/api/orders/{unknown}{route}", b"", [], 404)


def _dashed(oid: str) -> str:
    return f"{oid[:8]}-{oid[8:12]}-{oid[12:16]}-{oid[16:20]}-{oid[20:]}"


def test_an_order_id_with_dashes_in_any_case_names_the_same_order(hostile_stack: Any, tables: Tables) -> None:
    oid = post_ok(hostile_stack, body_of(GOOD_BODY)).json()["orderId"]
    for form in (_dashed(oid), _dashed(oid).upper()):
        r = send(hostile_stack, "GET", f"/api/orders/{form}")
        assert r.status == 200 and r.json()["orderId"] == oid, (form, r.status, r.body[:300])
        r = send(hostile_stack, "GET", f"/api/orders/{form}/history")
        assert r.status == 200 and r.json()["orderId"] == oid, (form, r.status, r.body[:300])
        for route in OPERATOR_ROUTES:  # found: done (202) or the wrong state (409), never 400/404
            before = tables.snapshot()
            r = send(hostile_stack, "POST", f"/api/orders/{form}{route}")
            assert r.status in (202, 409) and r.json()["orderId"] == oid, (route, r.status, r.body[:300])
            if r.status == 409:
                assert before.new_rows(tables.snapshot()) == NOTHING_NEW


# ------------------------------------------------------------------ dead-letter actions (queue, sequence number)

# POST /api/deadletters/{queue}/{sequenceNumber}/{action}: every action route.
DEAD_LETTER_ACTIONS = ["/resubmit", "/discard"]
BAD_QUEUES = {**{name: raw for name, raw in BAD_IDS.items() if name != "dot-dot"},
              "dead-letter-queue": "scheduler%2F%24DeadLetterQueue", "dollar": "%24DeadLetterQueue",
              "setting-prefix": "SchedulerQueu", "other-namespace": "sb:%2F%2Fx%2Fscheduler", "star": "*"}
BAD_SEQUENCES = {"zero": "0", "negative": "-1", "decimal": "1.5", "hex": "0x10", "exponent": "1e3", "plus": "+1",
                 "too-big": str(2**63), "long": "1" * 40, "arabic-indic": "%D9%A3", "space": "%201",
                 "nul": "1%00", "newline": "1%0A", "crlf": "1%0D%0AX:%201", "letters": "abc", "blank": "%20",
                 "fullwidth": "%EF%BC%91"}


@pytest.mark.parametrize("action", DEAD_LETTER_ACTIONS)
@pytest.mark.parametrize("name", sorted(BAD_QUEUES))
def test_a_bad_dead_letter_queue_is_400(hostile_stack: Any, tables: Tables, action: str, name: str) -> None:
    assert_rejected(hostile_stack, tables, "POST", f"/api/deadletters/{BAD_QUEUES[name]}/1{action}", b"", [], 400,
                    ["queue"])


@pytest.mark.parametrize("action", DEAD_LETTER_ACTIONS)
@pytest.mark.parametrize("name", sorted(BAD_SEQUENCES))
def test_a_bad_sequence_number_is_400(hostile_stack: Any, tables: Tables, action: str, name: str) -> None:
    assert_rejected(hostile_stack, tables, "POST", f"/api/deadletters/scheduler/{BAD_SEQUENCES[name]}{action}", b"",
                    [], 400, ["sequenceNumber"])


@pytest.mark.parametrize("action", DEAD_LETTER_ACTIONS)
@pytest.mark.parametrize("queue,seq", [("scheduler", str(2**63 - 1)), ("SCHEDULERQUEUE", "999999999"),
                                       ("agent-payment", "0" + str(10**17))])
def test_no_such_dead_letter_is_404(hostile_stack: Any, tables: Tables, action: str, queue: str, seq: str) -> None:
    # a body, headers or a query are ignored: the path says what to act on
    r = assert_rejected(hostile_stack, tables, "POST", f"/api/deadletters/{queue}/{seq}{action}?queue=alerts",
                        body_of({"sequenceNumber": 1}), JSON, 404)
    assert r.json()["type"].endswith("/not-found"), r.json()


# ------------------------------------------------------------------ Idempotency-Key

BAD_KEYS: dict[str, bytes] = {
    "control-soh": b"a\x01b",
    "tab": b"a\tb",
    "del": b"a\x7fb",
    "nul": b"a\x00b",
    "unicode-utf8": "schl\u00fcssel".encode(),
    "unicode-emoji": "\U0001f511".encode(),
    "latin1-byte": b"a\xe9b",
    "space": b"a b",
    "too-long": b"k" * 201,
    "very-long": b"k" * 7000,
}


@pytest.mark.parametrize("name", sorted(BAD_KEYS))
def test_bad_idempotency_key(hostile_stack: Any, tables: Tables, name: str) -> None:
    post_rejected(hostile_stack, tables, body_of(GOOD_BODY), 400, ["Idempotency-Key"],
                  headers=[*JSON, ("Idempotency-Key", BAD_KEYS[name])])


@pytest.mark.parametrize("key", ["a/b", "a\\b", "a#b", "a?b", "a%2Fb", "x'or'1'eq'1", "k" * 200])
def test_idempotency_key_with_table_forbidden_characters_is_safe(hostile_stack: Any, tables: Tables,
                                                                  key: str) -> None:
    """Keys are printable ASCII; the characters Table keys forbid never reach a key (the order
    id is derived from the key): accepted, one order of exactly its rows, replayed the same."""
    unique = f"{key}-{hostile_stack.ports['host']}-{len(tables.state_keys())}"[:200]
    r1 = post_ok(hostile_stack, body_of(GOOD_BODY), [*JSON, ("Idempotency-Key", unique)])
    oid = r1.json()["orderId"]
    assert len(oid) == 32 and all(c in "0123456789abcdef" for c in oid)
    rows = tables.partition(oid)
    assert set(rows) >= {"order", "state"} and len(order_rows(rows)) == ROWS_PER_ORDER
    assert rows["order"]["IdempotencyKey"] == unique
    before = tables.snapshot()
    r2 = send(hostile_stack, "POST", "/api/orders", body_of(GOOD_BODY), [*JSON, ("Idempotency-Key", unique)])
    assert r2.status == 200 and r2.json()["orderId"] == oid
    changed = body_of({**GOOD_BODY, "customerId": "c-2"})
    post_rejected(hostile_stack, tables, changed, 409, headers=[*JSON, ("Idempotency-Key", unique)])
    assert before.new_rows(tables.snapshot()) == NOTHING_NEW
    assert tables.partition(oid)["order"]["CustomerId"] == "c-1"


# ------------------------------------------------------------------ size, media type, encoding


def test_body_over_the_limit_is_413(hostile_stack: Any, tables: Tables) -> None:
    pad = LIMIT + 1 - len(body_of(GOOD_BODY))
    body = body_of(GOOD_BODY)[:-1] + b" " * pad + b"}"
    assert len(body) == LIMIT + 1
    post_rejected(hostile_stack, tables, body, 413)
    post_rejected(hostile_stack, tables, b"[" * 100_000, 413)
    post_rejected(hostile_stack, tables, b"x" * (1024 * 1024), 413, headers=[("Content-Type", "text/plain")])


def test_body_at_the_limit_is_accepted(hostile_stack: Any, tables: Tables) -> None:
    pad = LIMIT - len(body_of(GOOD_BODY))
    body = body_of(GOOD_BODY)[:-1] + b" " * pad + b"}"
    assert len(body) == LIMIT
    oid = post_ok(hostile_stack, body).json()["orderId"]
    assert len(order_rows(tables.partition(oid))) == ROWS_PER_ORDER


@pytest.mark.parametrize("content_type", [
    None, "", "text/plain", "application/xml", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
    "application/json; charset=latin-1", "application/json; charset=utf-16", "application/jsonx", "json",
    "application/octet-stream", "text/json", "*/*",
])
def test_wrong_or_missing_content_type_is_415(hostile_stack: Any, tables: Tables, content_type: str | None) -> None:
    headers = [] if content_type is None else [("Content-Type", content_type)]
    post_rejected(hostile_stack, tables, body_of(GOOD_BODY), 415, headers=headers)


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/problem+json",
                                          "APPLICATION/JSON", "application/merge-patch+json"])
def test_json_content_types_are_accepted(hostile_stack: Any, content_type: str) -> None:
    post_ok(hostile_stack, body_of(GOOD_BODY), [("Content-Type", content_type)])


NOT_JSON = {
    "empty": b"",
    "text": b"hello",
    "truncated": body_of(GOOD_BODY)[:-1],
    "trailing-garbage": body_of(GOOD_BODY) + b"x",
    "single-quotes": b"{'customerId': 'c-1'}",
    "nan": b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":1,"unitPrice":NaN}]}',
    "infinity": b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":1,"unitPrice":Infinity}]}',
    "minus-infinity": b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":-Infinity,"unitPrice":1}]}',
    "comment": b'{"customerId":"c-1" /* x */}',
    "non-utf8-byte": b'{"customerId":"c-\xff","currency":"EUR","items":[]}',
    "latin1": '{"customerId":"c-\u00e9","currency":"EUR","items":[]}'.encode("latin-1"),
    "utf16": json.dumps(GOOD_BODY).encode("utf-16"),
    "utf32": json.dumps(GOOD_BODY).encode("utf-32"),
    "utf8-bom": b"\xef\xbb\xbf" + body_of(GOOD_BODY),
    "overlong-utf8": b'{"customerId":"c\xc0\xafx","currency":"EUR","items":[]}',
    "lone-surrogate-bytes": b'{"customerId":"c\xed\xa0\x80","currency":"EUR","items":[]}',
    "nul-bytes": b"\x00" * 64,
}


@pytest.mark.parametrize("name", sorted(NOT_JSON))
def test_not_json_or_not_utf8_declared_as_json_is_400(hostile_stack: Any, tables: Tables, name: str) -> None:
    # Content-Type says JSON, the body is not: the body is at fault (400), not the media type (415).
    r = post_rejected(hostile_stack, tables, NOT_JSON[name], 400, ["(body)"])
    assert r.json()["type"].endswith("/invalid-json") and r.json()["detail"].startswith("the body is not valid JSON")


# ------------------------------------------------------------------ numbers

BAD_NUMBERS: dict[str, tuple[dict[str, Any] | bytes, list[str]]] = {
    "price-1e400": (b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":1,"unitPrice":1e400}]}',
                    ["items[0].unitPrice"]),
    "price-1e-400": (b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":1,"unitPrice":1e-400}]}',
                     ["items[0].unitPrice"]),
    "price-huge-exponent": (b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":1,'
                            b'"unitPrice":1e999999999999999999}]}', ["items[0].unitPrice"]),
    "price-negative": (with_item(unitPrice=-1), ["items[0].unitPrice"]),
    "price-negative-string": (with_item(unitPrice="-1"), ["items[0].unitPrice"]),
    "price-too-many-places": (b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":1,'
                              b'"unitPrice":9.99999}]}', ["items[0].unitPrice"]),
    "price-too-many-places-string": (with_item(unitPrice="9.99999"), ["items[0].unitPrice"]),
    "price-over-max": (with_item(unitPrice=1000000.0001), ["items[0].unitPrice"]),
    "price-string-exponent": (with_item(unitPrice="1E2"), ["items[0].unitPrice"]),
    "price-string-nan": (with_item(unitPrice="NaN"), ["items[0].unitPrice"]),
    "price-string-infinity": (with_item(unitPrice="Infinity"), ["items[0].unitPrice"]),
    "price-bool": (with_item(unitPrice=True), ["items[0].unitPrice"]),
    "price-missing": (with_item(unitPrice=_DROP), ["items[0].unitPrice"]),
    "quantity-googol": (with_item(quantity=10**100), ["items[0].quantity"]),
    "quantity-2-64": (with_item(quantity=2**64), ["items[0].quantity"]),
    "quantity-zero": (with_item(quantity=0), ["items[0].quantity"]),
    "quantity-negative": (with_item(quantity=-1), ["items[0].quantity"]),
    "quantity-minus-zero": (b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":-0,"unitPrice":1}]}',
                            ["items[0].quantity"]),
    "quantity-over-max": (with_item(quantity=10_001), ["items[0].quantity"]),
    "quantity-float": (b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":2.0,"unitPrice":1}]}',
                       ["items[0].quantity"]),
    "quantity-fraction": (b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":2.5,"unitPrice":1}]}',
                          ["items[0].quantity"]),
    "quantity-exponent": (b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":1e2,"unitPrice":1}]}',
                          ["items[0].quantity"]),
    "quantity-string": (with_item(quantity="2"), ["items[0].quantity"]),
    "quantity-bool": (with_item(quantity=True), ["items[0].quantity"]),
    "quantity-null": (with_item(quantity=None), ["items[0].quantity"]),
}


@pytest.mark.parametrize("name", sorted(BAD_NUMBERS))
def test_bad_numbers_are_400_naming_the_field(hostile_stack: Any, tables: Tables, name: str) -> None:
    body, fields = BAD_NUMBERS[name]
    post_rejected(hostile_stack, tables, body if isinstance(body, bytes) else body_of(body), 400, fields)


def test_integer_of_5000_digits_is_400_naming_the_field(hostile_stack: Any, tables: Tables) -> None:
    body = (b'{"customerId":"c-1","currency":"EUR","items":[{"sku":"S","quantity":' + b"9" * 5000
            + b',"unitPrice":1}]}')
    post_rejected(hostile_stack, tables, body, 400, ["items[0].quantity"])


def test_amounts_are_decimals(hostile_stack: Any, tables: Tables) -> None:
    """0.1 + 0.2 style amounts stay exact; trailing zeros past 4 places are accepted and dropped."""
    body = {**GOOD_BODY, "items": [{"sku": "A", "quantity": 3, "unitPrice": 0.1},
                                   {"sku": "B", "quantity": 1, "unitPrice": "0.2000000"}]}
    oid = post_ok(hostile_stack, body_of(body)).json()["orderId"]
    row = tables.partition(oid)["order"]
    assert isinstance(row["Total"], str) and Decimal(row["Total"]) == Decimal("0.5")  # never 0.5000000000000001
    assert [Decimal(i["unitPrice"]) for i in json.loads(row["Items"])] == [Decimal("0.1"), Decimal("0.2")]


# ------------------------------------------------------------------ structure


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("where", ["body", "items", "customerId"])
def test_deeply_nested_json_under_the_limit(hostile_stack: Any, tables: Tables, where: str) -> None:
    depth = 30_000  # 60,000 bytes: under MaxRequestBytes, far past any recursion limit
    if where == "body":
        body, fields = nested(depth), ["(body)"]
    else:
        parts = {"customerId": b'"c-1"', "currency": b'"EUR"',
                 "items": b'[{"sku":"S","quantity":1,"unitPrice":1}]'}
        parts[where] = nested(depth)
        body = b"{" + b",".join(b'"%s":%s' % (k.encode(), v) for k, v in parts.items()) + b"}"
        fields = [where]
    assert len(body) <= LIMIT
    post_rejected(hostile_stack, tables, body, {400, 415}, fields)


def test_moderately_nested_json_is_400(hostile_stack: Any, tables: Tables) -> None:
    post_rejected(hostile_stack, tables, nested(500), 400, ["(body)"])
    body = b'{"customerId":"c-1","currency":"EUR","items":' + nested(200) + b"}"
    post_rejected(hostile_stack, tables, body, 400, ["items"])


STRUCTURE: dict[str, tuple[bytes | dict[str, Any] | list[Any] | None, list[str]]] = {
    "null": (None, ["(body)"]),
    "array": ([GOOD_BODY], ["(body)"]),
    "string": (b'"order"', ["(body)"]),
    "number": (b"1", ["(body)"]),
    "empty-object": ({}, ["customerId", "currency", "items"]),
    "empty-items": ({**GOOD_BODY, "items": []}, ["items"]),
    "items-null": ({**GOOD_BODY, "items": None}, ["items"]),
    "items-object": ({**GOOD_BODY, "items": {"sku": "S"}}, ["items"]),
    "item-not-object": ({**GOOD_BODY, "items": ["SKU-1"]}, ["items[0]"]),
    "too-many-items": ({**GOOD_BODY, "items": [GOOD_BODY["items"][0]] * 101}, ["items"]),
    "extra-field": ({**GOOD_BODY, "discount": 100}, ["discount"]),
    "extra-item-field": (with_item(price=1), ["items[0].price"]),
    "proto-pollution": ({**GOOD_BODY, "__proto__": {"admin": True}}, ["__proto__"]),
    "duplicate-key": (b'{"customerId":"c-1","customerId":"c-2","currency":"EUR",'
                      b'"items":[{"sku":"S","quantity":1,"unitPrice":1}]}', ["customerId"]),
    "duplicate-item-key": (b'{"customerId":"c-1","currency":"EUR",'
                           b'"items":[{"sku":"S","quantity":1,"quantity":1000,"unitPrice":1}]}', ["quantity"]),
    "every-field-bad": ({"customerId": "", "currency": "euro", "items": [{"sku": "S/1", "quantity": 0,
                                                                       "unitPrice": -1}], "priority": "urgent",
                         "statusQueue": "a/b"},
                        ["customerId", "currency", "items[0].sku", "items[0].quantity", "items[0].unitPrice",
                         "priority", "statusQueue"]),
    "priority-unknown": ({**GOOD_BODY, "priority": "HIGH"}, ["priority"]),
    "own-status-queue": ({**GOOD_BODY, "statusQueue": "scheduler"}, ["statusQueue"]),
    "own-replies-queue": ({**GOOD_BODY, "statusQueue": "replies"}, ["statusQueue"]),
    "own-agent-queue": ({**GOOD_BODY, "statusQueue": "agent-payment"}, ["statusQueue"]),
    "status-queue-path": ({**GOOD_BODY, "statusQueue": "scheduler/$DeadLetterQueue"}, ["statusQueue"]),
}


@pytest.mark.parametrize("name", sorted(STRUCTURE))
def test_bad_structure_is_400_naming_every_field(hostile_stack: Any, tables: Tables, name: str) -> None:
    body, fields = STRUCTURE[name]
    raw = body if isinstance(body, bytes) else body_of(body)
    post_rejected(hostile_stack, tables, raw, 400, fields)


# ------------------------------------------------------------------ identifiers and unicode

BAD_ID_VALUES = {
    "slash": "c/1", "backslash": "c\\1", "hash": "c#1", "question": "c?1", "percent-2f": "c%2F1",
    "nul": "c\x001", "newline-inside": "c\n1", "tab": "c\t1", "escape": "c\x1b[31m", "del": "c\x7f",
    "leading-dash": "-c", "space": "c 1", "quote": "c'1", "empty": "", "too-long": "c" * 65,
    "very-long": "c" * 50_000, "unicode-latin": "kund\u00e9", "unicode-cjk": "\u9867\u5ba2",
    "unicode-emoji": "\U0001f600", "unicode-rtl-override": "c\u202e1", "zero-width": "c\u200b1",
    "fullwidth-digit": "\uff11", "surrogate-escape": "\ud800",
}


@pytest.mark.parametrize("field", ["customerId", "items[0].sku"])
@pytest.mark.parametrize("name", sorted(BAD_ID_VALUES))
def test_bad_identifiers_are_400(hostile_stack: Any, tables: Tables, field: str, name: str) -> None:
    value = BAD_ID_VALUES[name]
    body = {**GOOD_BODY, "customerId": value} if field == "customerId" else with_item(sku=value)
    raw = json.dumps(body).encode()  # \u escapes: the JSON itself is valid (lone surrogates too)
    if len(raw) > LIMIT:
        post_rejected(hostile_stack, tables, raw, 413)
    else:
        post_rejected(hostile_stack, tables, raw, 400, [field])


@pytest.mark.parametrize("field,value", [("currency", "\u20acUR"), ("currency", "EU"), ("currency", "E\u00dcR"),
                                         ("currency", "ABC"), ("currency", "XTS"), ("currency", "\u0131nr"),
                                         ("statusQueue", "\u961f\u5217"), ("statusQueue", "q\x00"),
                                         ("statusQueue", "-q"), ("statusQueue", "q" * 261),
                                         ("priority", "n\u00f6rmal")])
def test_bad_other_fields_are_400(hostile_stack: Any, tables: Tables, field: str, value: str) -> None:
    post_rejected(hostile_stack, tables, body_of({**GOOD_BODY, field: value}), 400, [field])


def test_currency_is_from_the_iso_4217_list_in_any_case(hostile_stack: Any, tables: Tables) -> None:
    r = post_rejected(hostile_stack, tables, body_of({**GOOD_BODY, "currency": "QQQ"}), 400, ["currency"])
    [message] = [e["message"] for e in r.json()["errors"] if e["field"] == "currency"]
    assert "ISO 4217" in message and "EUR" in message and "USD" in message  # lists what is expected
    oid = post_ok(hostile_stack, body_of({**GOOD_BODY, "currency": "chf"})).json()["orderId"]
    assert tables.partition(oid)["order"]["Currency"] == "CHF"


def test_unicode_is_handled_consistently(hostile_stack: Any, tables: Tables) -> None:
    """The same unicode body gets the same answer each time, raw UTF-8 or \\u-escaped."""
    body = {**GOOD_BODY, "customerId": "kund\u00e9-\U0001f600"}
    answers = []
    for raw in (body_of(body), json.dumps(body).encode(), body_of(body)):
        r = post_rejected(hostile_stack, tables, raw, 400, ["customerId"])
        answers.append(r.json()["errors"])
    assert answers[0] == answers[1] == answers[2]


@pytest.mark.parametrize("field", ["customerId", "currency", "items[0].sku", "statusQueue", "items[0].unitPrice"])
def test_trailing_newline_is_rejected(hostile_stack: Any, tables: Tables, field: str) -> None:
    if field == "customerId":
        body = {**GOOD_BODY, "customerId": "c-1\n"}
    elif field == "currency":
        body = {**GOOD_BODY, "currency": "EUR\n"}
    elif field == "statusQueue":
        body = {**GOOD_BODY, "statusQueue": "my-status\n"}
    elif field == "items[0].sku":
        body = with_item(sku="SKU-1\n")
    else:
        body = with_item(unitPrice="9.99\n")
    post_rejected(hostile_stack, tables, body_of(body), 400, [field])


@pytest.mark.parametrize("price", ["\u0663", "\uff19.99", "\u0969"])
def test_unicode_digits_in_price_are_rejected(hostile_stack: Any, tables: Tables, price: str) -> None:
    post_rejected(hostile_stack, tables, body_of(with_item(unitPrice=price)), 400, ["items[0].unitPrice"])


@pytest.mark.parametrize("queue", ["Scheduler", "REPLIES", "Agent-Payment", "ALERTS"])
def test_own_queue_in_another_case_is_rejected(hostile_stack: Any, tables: Tables, queue: str) -> None:
    post_rejected(hostile_stack, tables, body_of({**GOOD_BODY, "statusQueue": queue}), 400, ["statusQueue"])


# ------------------------------------------------------------------ methods


@pytest.mark.parametrize("method,path,allow", [("PUT", "/api/orders", "GET, POST"),
                                               ("DELETE", "/api/orders", "GET, POST"),
                                               ("DELETE", "/api/orders/" + "0" * 32, "GET"),
                                               ("GET", "/api/orders/" + "0" * 32 + "/retry", "POST"),
                                               ("PATCH", "/api/orders/" + "0" * 32 + "/cancel", "POST"),
                                               ("GET", "/api/orders/" + "0" * 32 + "/terminate", "POST"),
                                               ("DELETE", "/api/orders/" + "0" * 32 + "/history", "GET"),
                                               ("POST", "/api/orders/" + "0" * 32 + "/history", "GET"),
                                               ("PUT", "/api/Orders/", "GET, POST"),
                                               ("POST", "/api/console", "GET"),
                                               ("DELETE", "/api/openapi.yaml", "GET"),
                                               ("HEAD", "/api/overview", "GET"),
                                               ("GET", "/api/deadletters/scheduler/1/resubmit", "POST"),
                                               ("DELETE", "/api/deadletters/scheduler/1/discard", "POST")])
def test_other_methods_write_nothing(hostile_stack: Any, tables: Tables, method: str, path: str, allow: str) -> None:
    # No function takes these: the app's fallback route answers 405 problem+json with the route's
    # methods in Allow (HEAD too: the Functions host gives a GET route no HEAD).
    r = assert_rejected(hostile_stack, tables, method, path, body_of(GOOD_BODY), JSON, 405,
                        problem=method != "HEAD")
    assert r.headers.get("allow") == allow, r.headers
    if method == "HEAD":
        assert r.is_problem and r.body == b"", (r.headers, r.body)


@pytest.mark.parametrize("method,path", [("GET", "/api/order"), ("POST", "/api/order"), ("DELETE", "/api/nothing"),
                                         ("GET", "/api"), ("GET", "/api/"), ("GET", "/api/orders//history"),
                                         ("GET", "/api/console/assets"), ("OPTIONS", "/api/nowhere")])
def test_a_path_no_route_matches_is_404_problem(hostile_stack: Any, tables: Tables, method: str, path: str) -> None:
    r = assert_rejected(hostile_stack, tables, method, path, body_of(GOOD_BODY), JSON, 404)
    doc = r.json()
    assert doc["type"].endswith("/no-route") and path in doc["detail"] and "/api/openapi.yaml" in doc["detail"], doc
    assert "allow" not in r.headers


@pytest.mark.parametrize("path,allow", [("/api/orders", "GET, POST"), ("/api/orders/" + "0" * 32 + "/retry", "POST"),
                                        ("/api/openapi.yaml", "GET")])
def test_options_on_a_route_is_204_with_allow(hostile_stack: Any, tables: Tables, path: str, allow: str) -> None:
    before = tables.snapshot()
    r = send(hostile_stack, "OPTIONS", path)
    assert (r.status, r.headers.get("allow"), r.body) == (204, allow, b""), (r.status, r.headers, r.body[:300])
    assert before.new_rows(tables.snapshot()) == NOTHING_NEW
