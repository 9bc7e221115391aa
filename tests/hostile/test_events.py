"""Hostile inputs on ``POST /api/orders/{id}/events/{name}``: the named external event for an
order's wait step (workflows/order.v2.yaml: an order over 1000 waits for ``approval``, decided
by its ``approved`` field; a smaller one skips the wait).

Each rejected request gets its status as application/problem+json naming the bad part (``id``,
``name``, ``(body)``, ``Idempotency-Key``) and writes nothing: no new row anywhere
(test_cases.assert_rejected) and, for an order that exists, every row of its partition, history
included, unchanged, ETags included. The route checks, in this order: the id, the name, the
body (size, media type, JSON, an object), the Idempotency-Key; then the order (404), its
workflow's wait and its state (409), and last the decision field (400).

The events that are taken: an order waiting for its approval is approved and Processed, or
declined and compensated; an event sent before the wait started is kept for it; the same event
again (same Idempotency-Key, else same body) is a copy (202 ``event-duplicate``, nothing
written) and any other one is 409; the same event sent four times at once is taken once.
No timing is asserted: orders are polled until they get somewhere, within a generous bound.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pytest

from local.host.keys import ADMIN, KEY_HEADER
from tests.hostile.stackutil import (
    GOOD_BODY,
    RawResponse,
    Tables,
    history_rows,
    key_of,
    send,
    submit,
    wait_settled,
)
from tests.hostile.test_cases import BAD_IDS, BAD_KEYS, ID_CASES, JSON, assert_rejected, body_of

pytestmark = pytest.mark.integration

EVENT = "approval"  # what order v2 waits for, over 1000
DECISION = "approved"  # its decision field: true goes on, false compensates the order
BIG_ITEMS = [{"sku": "SKU-1", "quantity": 2, "unitPrice": 600}]  # 1200 EUR: over 1000, it waits
APPROVE = body_of({DECISION: True})
MAX_EVENT_BYTES = 16 * 1024
WAIT_SECONDS = 90.0  # a bound for an order to reach its wait or to settle, not a timing assertion


# ------------------------------------------------------------------ helpers


def path_of(oid: str, name: str = EVENT) -> str:
    return f"/api/orders/{oid}/events/{name}"


def post_event(stack: Any, oid: str, body: bytes = APPROVE, name: str = EVENT,
               headers: Iterable[tuple[str, str | bytes]] = tuple(JSON)) -> RawResponse:
    return send(stack, "POST", path_of(oid, name), body, headers)


def view(stack: Any, oid: str) -> dict[str, Any]:
    r = send(stack, "GET", f"/api/orders/{oid}")
    assert r.status == 200, (r.status, r.body[:300])
    doc: dict[str, Any] = r.json()
    return doc


def wait_view(stack: Any, oid: str, ok: Callable[[dict[str, Any]], bool], what: str,
              timeout: float = WAIT_SECONDS) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        v = view(stack, oid)
        if ok(v):
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"order {oid} did not get to {what} within {timeout}s: {json.dumps(v)[:800]}")
        time.sleep(0.3)


def step_of(v: dict[str, Any], name: str = EVENT) -> dict[str, Any]:
    return next(s for s in v["steps"] if s["name"] == name)


def history(stack: Any, oid: str) -> Counter[str]:
    r = send(stack, "GET", f"/api/orders/{oid}/history?limit=1000")
    assert r.status == 200, (r.status, r.body[:300])
    return Counter(e["event"] for e in r.json()["history"])


def customer(who: str) -> str:
    return f"he-{who}-{uuid.uuid4().hex[:10]}"


def big_order(stack: Any, who: str) -> str:
    return submit(stack, {**GOOD_BODY, "customerId": customer(who), "items": BIG_ITEMS})


def small_order(stack: Any, who: str, **fields: Any) -> str:
    return submit(stack, {**GOOD_BODY, "customerId": customer(who), **fields})


def is_waiting(v: dict[str, Any]) -> bool:
    return (v.get("awaiting") or {}).get("kind") == "event"


def waiting_order(stack: Any, who: str) -> str:
    """A new order of 1200 EUR, once it waits for its approval."""
    oid = big_order(stack, who)
    v = wait_view(stack, oid, is_waiting, "its approval wait")
    a = v["awaiting"]
    assert (a["step"], a["event"], a["decision"], a["onTimeout"]) == (EVENT, EVENT, DECISION, "compensate"), a
    assert a["until"] and v["currentStep"] == EVENT and step_of(v)["state"] == "Running", v
    return oid


def rejected(stack: Any, tables: Tables, oid: str, status: int | set[int], fields: Iterable[str] = (), *,
             name: str = EVENT, body: bytes = APPROVE, headers: Iterable[tuple[str, str | bytes]] = tuple(JSON),
             problem: bool = True) -> RawResponse:
    """The event is rejected with ``status`` (assert_rejected: problem+json naming ``fields``, no
    new row anywhere) and the order's partition is exactly as it was, ETags included."""
    before = tables.partition(oid)
    r = assert_rejected(stack, tables, "POST", path_of(oid, name), body, headers, status, fields, problem)
    assert tables.partition(oid) == before, "a rejected event changed the order's rows"
    return r


def wrong_state(stack: Any, tables: Tables, oid: str, *, name: str = EVENT, body: bytes = APPROVE,
                headers: Iterable[tuple[str, str | bytes]] = tuple(JSON)) -> dict[str, Any]:
    r = rejected(stack, tables, oid, 409, name=name, body=body, headers=headers)
    doc: dict[str, Any] = r.json()
    assert doc["type"].endswith("/wrong-state") and doc["orderId"] == oid and doc["detail"], doc
    assert f"{name!r}" in doc["title"], doc
    return doc


def taken(r: RawResponse, oid: str, result: str) -> dict[str, Any]:
    assert r.status == 202, (r.status, r.body[:300])
    doc: dict[str, Any] = r.json()
    assert set(doc) == {"orderId", "event", "result", "processState"}, doc
    assert (doc["orderId"], doc["event"], doc["result"]) == (oid, EVENT, result), doc
    assert r.headers.get("location") == f"/api/orders/{oid}", r.headers
    return doc


def padded(obj: dict[str, Any], size: int) -> bytes:
    """``obj`` as JSON of exactly ``size`` bytes (spaces before its closing brace)."""
    raw = body_of(obj)
    assert len(raw) <= size
    return raw[:-1] + b" " * (size - len(raw)) + b"}"


def declared_length(stack: Any, path: str, declared: bytes, body: bytes, timeout: float = 30.0) -> RawResponse:
    """POST ``body`` with a Content-Length header of ``declared`` (not its length), then close the
    sending side (the server gets no more bytes); the answer, parsed as raw_request does. The
    master key goes along (the events route is an operator's)."""
    u = urlsplit(stack.base_url)
    key = key_of(stack, ADMIN)
    head = (f"POST {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nConnection: close\r\n"
            "Content-Type: application/json\r\n" + (f"{KEY_HEADER}: {key}\r\n" if key else "")).encode() \
        + b"Content-Length: " + declared + b"\r\n\r\n"
    chunks = []
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=timeout) as s:
        s.sendall(head + body)
        s.shutdown(socket.SHUT_WR)
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    top, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return RawResponse(int(status_line.split()[1]), headers, rest[: int(headers.get("content-length", len(rest)))])


@pytest.fixture(scope="module")
def waiting_orders() -> list[str]:
    return []


@pytest.fixture
def waiting(hostile_stack: Any, waiting_orders: list[str]) -> str:
    """An order of 1200 EUR waiting for its approval, with no event yet: the rejected events below
    are sent to it. It waits a day (its timeoutSeconds) and nothing else writes to it meanwhile;
    one order serves the whole module, unless a test got an event through (that test fails on
    it, and the next one gets a new order rather than failing with it)."""
    if waiting_orders:
        v = view(hostile_stack, waiting_orders[-1])
        if is_waiting(v) and step_of(v)["event"]["receivedAt"] is None:
            return waiting_orders[-1]
    waiting_orders.append(waiting_order(hostile_stack, "waiting"))
    return waiting_orders[-1]


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


# ------------------------------------------------------------------ the order id


@pytest.mark.parametrize("name", ID_CASES)
def test_malformed_order_id_is_400(hostile_stack: Any, tables: Tables, name: str) -> None:
    assert_rejected(hostile_stack, tables, "POST", path_of(BAD_IDS[name]), APPROVE, JSON, 400, ["id"])


@pytest.mark.parametrize("name", ["dot-dot", "slash-encoded", "upper-hex", "long", "crlf-header-injection"])
def test_the_order_id_is_checked_first(hostile_stack: Any, tables: Tables, name: str) -> None:
    """A bad id with everything else bad too: the id is named (and only the id)."""
    r = assert_rejected(hostile_stack, tables, "POST", path_of(BAD_IDS[name], "APPROVAL"), b"[" * 20_000,
                        [("Content-Type", "text/plain"), ("Idempotency-Key", b"a\x01b")], 400, ["id"])
    assert {e["field"] for e in r.json().get("errors", [])} == {"id"}, r.json()


@pytest.mark.parametrize("unknown", ["0" * 32, "0f8fad5b-d9cb-469f-a165-70867728950e",
                                     "0F8FAD5B-D9CB-469F-A165-70867728950E"])
def test_unknown_order_is_404(hostile_stack: Any, tables: Tables, unknown: str) -> None:
    r = assert_rejected(hostile_stack, tables, "POST", path_of(unknown), APPROVE, JSON, 404)
    assert r.json()["type"].endswith("/not-found"), r.json()


def test_the_request_is_checked_before_the_order_is_read(hostile_stack: Any, tables: Tables) -> None:
    """An unknown order: a bad name, body, media type or key is named (400/413/415); a well-formed
    event is 404, whatever its decision field (only the order's workflow says what it needs)."""
    unknown = uuid.uuid4().hex
    cases: list[tuple[str, bytes, list[tuple[str, str | bytes]], int, list[str]]] = [
        ("Approval", APPROVE, JSON, 400, ["name"]),
        (EVENT, b"[]", JSON, 400, ["(body)"]),
        (EVENT, b"{", JSON, 400, ["(body)"]),
        (EVENT, padded({DECISION: True}, MAX_EVENT_BYTES + 1), JSON, 413, []),
        (EVENT, APPROVE, [], 415, []),
        (EVENT, APPROVE, [*JSON, ("Idempotency-Key", b"k" * 201)], 400, ["Idempotency-Key"]),
        (EVENT, body_of({DECISION: "yes"}), JSON, 404, []),
        ("shipment", APPROVE, JSON, 404, []),
    ]
    for name, body, headers, status, fields in cases:
        assert_rejected(hostile_stack, tables, "POST", path_of(unknown, name), body, headers, status, fields)


# ------------------------------------------------------------------ the event's name

BAD_NAMES = {
    "upper": "Approval",
    "all-upper": "APPROVAL",
    "too-long": "a" * 64,
    "very-long": "a" * 5000,
    "leading-digit": "1approval",
    "leading-dash": "-approval",
    "underscore": "appro_val",
    "dotted": "approval.v2",
    "dot": ".",
    "dot-dot": "..",
    "dot-dot-encoded": "%2E%2E",
    "dot-dot-encoded-lower": "%2e%2e",
    "dot-dot-slash-encoded": "..%2F..%2Fretry",
    "slash-encoded": "approval%2Fx",
    "slash-encoded-trailing": "approval%2F",
    "slash-only-encoded": "%2F",
    "backslash-encoded": "approval%5C",
    "question-encoded": "approval%3Fx",
    "hash-encoded": "approval%23",
    "percent": "%25",
    "space": "%20",
    "space-leading": "%20approval",
    "space-trailing": "approval%20",
    "tab": "approval%09",
    "newline": "approval%0A",
    "crlf-header-injection": "approval%0D%0ASet-Cookie:%20x=1",
    "nul": "approval%00",
    "nul-only": "%00",
    "del": "approval%7F",
    "quote": "approval'",
    "plus": "approval+x",
    "odata-quote": "x'%20or%20RowKey%20ne%20'",
    "unicode-latin": "%C3%A9v%C3%A9nement",
    "unicode-dotless-i": "approval%C4%B1",
    "unicode-cyrillic-a": "%D0%B0pproval",  # looks like "approval"
    "unicode-fullwidth": "%EF%BD%81pproval",
    "unicode-zero-width": "approval%E2%80%8B",
    "unicode-emoji": "%F0%9F%91%8D",
    "not-utf8": "approval%FF",
}


@pytest.mark.parametrize("name", sorted(BAD_NAMES))
def test_bad_event_name_is_400(hostile_stack: Any, tables: Tables, waiting: str, name: str) -> None:
    r = rejected(hostile_stack, tables, waiting, 400, ["name"], name=BAD_NAMES[name])
    assert r.json()["title"] == "Invalid event name", r.json()


@pytest.mark.parametrize("suffix", ["/events", "/events/", "/events//approval", "/events/approval/x",
                                    "/events/approval/approval", "/event/approval"])
def test_a_path_without_one_name_matches_no_route(hostile_stack: Any, tables: Tables, waiting: str,
                                                  suffix: str) -> None:
    # An unencoded '/' (or none at all) makes a path no route matches: the fallback's 404.
    before = tables.partition(waiting)
    path = f"/api/orders/{waiting}{suffix}"
    r = assert_rejected(hostile_stack, tables, "POST", path, APPROVE, JSON, 404)
    assert r.json()["type"].endswith("/no-route") and path in r.json()["detail"], r.json()
    assert tables.partition(waiting) == before


@pytest.mark.parametrize("name", ["a" * 63, "a", "approval-2", "approved", "shipment", "cancel"])
def test_an_event_the_workflow_does_not_wait_for_is_409(hostile_stack: Any, tables: Tables, waiting: str,
                                                        name: str) -> None:
    """A well-formed name (63 characters is the longest) that the order's workflow waits for no
    event of: 409, naming the event it does wait for."""
    doc = wrong_state(hostile_stack, tables, waiting, name=name)
    assert f"waits for no event {name!r}" in doc["detail"] and f"{EVENT!r}" in doc["detail"], doc
    assert doc["processState"] == "Processing", doc


# ------------------------------------------------------------------ the body

NOT_AN_OBJECT = {
    "array": b"[]",
    "array-of-the-event": b'[{"approved": true}]',
    "string": b'"approved"',
    "number": b"1",
    "null": b"null",
    "true": b"true",
    "false": b"false",
}


@pytest.mark.parametrize("name", sorted(NOT_AN_OBJECT))
def test_a_body_that_is_not_an_object_is_400(hostile_stack: Any, tables: Tables, waiting: str, name: str) -> None:
    r = rejected(hostile_stack, tables, waiting, 400, ["(body)"], body=NOT_AN_OBJECT[name])
    assert "JSON object" in r.json()["detail"], r.json()


NOT_JSON = {
    "empty": b"",
    "whitespace": b" \r\n\t ",
    "truncated": b'{"approved": true',
    "trailing-garbage": b'{"approved": true}x',
    "two-objects": b'{"approved": true}{"approved": true}',
    "single-quotes": b"{'approved': true}",
    "python-true": b'{"approved": True}',
    "unquoted-key": b"{approved: true}",
    "trailing-comma": b'{"approved": true,}',
    "nan": b'{"approved": true, "n": NaN}',
    "infinity": b'{"approved": true, "n": Infinity}',
    "comment": b'{"approved": true /* yes */}',
    "non-utf8-byte": b'{"approved": true, "by": "\xff"}',
    "latin1": '{"approved": true, "by": "\u00e9"}'.encode("latin-1"),
    "utf16": json.dumps({"approved": True}).encode("utf-16"),
    "utf32": json.dumps({"approved": True}).encode("utf-32"),
    "utf8-bom": b"\xef\xbb\xbf" + APPROVE,
    "overlong-utf8": b'{"approved": true, "by": "\xc0\xaf"}',
    "surrogate-bytes": b'{"approved": true, "by": "\xed\xa0\x80"}',
    "nul-bytes": b"\x00" * 64,
}


@pytest.mark.parametrize("name", sorted(NOT_JSON))
def test_not_json_or_not_utf8_is_400(hostile_stack: Any, tables: Tables, waiting: str, name: str) -> None:
    # Content-Type says JSON, the body is not: the body is at fault (400), not the media type (415).
    r = rejected(hostile_stack, tables, waiting, 400, ["(body)"], body=NOT_JSON[name])
    assert r.json()["type"].endswith("/invalid-json"), r.json()


# Valid JSON whose strings hold a lone UTF-16 surrogate (an escape): not Unicode text, so no
# UTF-8 (the event's key hashes its body as UTF-8) and no Table property can hold it.
LONE_SURROGATES = {
    "in-a-value": (b'{"approved": true, "by": "\\ud800"}', None),
    "in-a-value-with-a-key": (b'{"approved": true, "by": "\\ud800"}', "k-surrogate"),
    "in-a-key": (b'{"approved": true, "\\udfff": 1}', None),
}


@pytest.mark.parametrize("name", sorted(LONE_SURROGATES))
def test_a_lone_surrogate_is_400(hostile_stack: Any, tables: Tables, waiting: str, name: str) -> None:
    body, key = LONE_SURROGATES[name]
    headers = [*JSON, ("Idempotency-Key", key)] if key else JSON
    rejected(hostile_stack, tables, waiting, 400, ["(body)"], body=body, headers=headers)


def test_deep_nesting_is_400(hostile_stack: Any, tables: Tables, waiting: str) -> None:
    deep = b"[" * 8000 + b"]" * 8000  # under 16 KiB, far past any recursion limit
    assert len(deep) <= MAX_EVENT_BYTES
    rejected(hostile_stack, tables, waiting, 400, ["(body)"], body=deep)
    rejected(hostile_stack, tables, waiting, 400, body=b'{"approved": true, "a": ' + b"[" * 8000 + b"]" * 8000 + b"}")
    rejected(hostile_stack, tables, waiting, 400, body=b'{"a":' * 2000 + b"1" + b"}" * 2000)
    rejected(hostile_stack, tables, waiting, 400, body=b'{"approved": true, "a": ' + b"[" * 40 + b"]" * 40 + b"}")


def test_a_body_over_16_kib_is_413(hostile_stack: Any, tables: Tables, waiting: str) -> None:
    over = padded({DECISION: True}, MAX_EVENT_BYTES + 1)
    r = rejected(hostile_stack, tables, waiting, 413, body=over)
    assert r.json()["type"].endswith("/too-large"), r.json()
    rejected(hostile_stack, tables, waiting, 413, body=b"[" * 30_000)
    # The size is checked before the media type.
    rejected(hostile_stack, tables, waiting, 413, body=b"x" * (1024 * 1024), headers=[("Content-Type", "text/plain")])


def test_a_declared_length_over_16_kib_is_413(hostile_stack: Any, tables: Tables, waiting: str) -> None:
    """A Content-Length over the limit with a short body (the sender stops): 413 from the app, by
    the declared length. A Content-Length of 20 digits: 413 before the app is even called (the
    local host's own limit answers it, with no body), and nothing is written either way."""
    for declared, problem in ((b"20000", True), (b"99999999999999999999", False)):
        before, rows = tables.snapshot(), tables.partition(waiting)
        r = declared_length(hostile_stack, path_of(waiting), declared, APPROVE)
        assert r.status == 413, (declared, r.status, r.body[:300])
        if problem:
            assert r.is_problem and r.json()["status"] == 413, (r.headers, r.body[:300])
        assert before.new_rows(tables.snapshot()) == {"state": [], "deadlineOrders": [], "indexOrders": []}
        assert tables.partition(waiting) == rows


@pytest.mark.parametrize("content_type", [
    None, "", "text/plain", "application/xml", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
    "application/json; charset=latin-1", "application/json; charset=utf-16", "application/jsonx", "json",
    "application/octet-stream", "text/json", "*/*",
])
def test_wrong_or_missing_content_type_is_415(hostile_stack: Any, tables: Tables, waiting: str,
                                              content_type: str | None) -> None:
    headers = [] if content_type is None else [("Content-Type", content_type)]
    r = rejected(hostile_stack, tables, waiting, 415, headers=headers)
    assert r.json()["type"].endswith("/unsupported-media-type"), r.json()


@pytest.mark.parametrize("name", sorted([*BAD_KEYS, "empty"]))
def test_bad_idempotency_key_is_400(hostile_stack: Any, tables: Tables, waiting: str, name: str) -> None:
    key = b"" if name == "empty" else BAD_KEYS[name]
    rejected(hostile_stack, tables, waiting, 400, ["Idempotency-Key"], headers=[*JSON, ("Idempotency-Key", key)])


BAD_DECISIONS: dict[str, dict[str, Any] | bytes] = {
    "string-true": {DECISION: "true"},
    "string-false": {DECISION: "false"},
    "one": {DECISION: 1},
    "zero": {DECISION: 0},
    "float": {DECISION: 1.0},
    "null": {DECISION: None},
    "missing": {},
    "missing-with-others": {"by": "ops", "comment": "ok"},
    "list": {DECISION: [True]},
    "object": {DECISION: {"value": True}},
    "nested": {"decision": {DECISION: True}},
    "other-case": {"Approved": True},
    "padded-name": {f" {DECISION}": True},
}


@pytest.mark.parametrize("name", sorted(BAD_DECISIONS))
def test_a_decision_that_is_not_true_or_false_is_400(hostile_stack: Any, tables: Tables, waiting: str,
                                                      name: str) -> None:
    value = BAD_DECISIONS[name]
    r = rejected(hostile_stack, tables, waiting, 400, ["(body)"],
                 body=value if isinstance(value, bytes) else body_of(value))
    assert f"{DECISION!r}" in r.json()["detail"], r.json()


def test_a_duplicate_decision_field_is_400(hostile_stack: Any, tables: Tables, waiting: str) -> None:
    # Which of two "approved" counts is not for the app to guess.
    for body in (b'{"approved": true, "approved": false}', b'{"approved": false, "approved": true}'):
        r = rejected(hostile_stack, tables, waiting, 400, ["(body)"], body=body)
        assert DECISION in r.json()["detail"], r.json()


# ------------------------------------------------------------------ orders that take no event


def test_a_workflow_without_a_wait_takes_no_event(hostile_stack: Any, tables: Tables) -> None:
    oid = small_order(hostile_stack, "digital", workflow="digital")
    assert wait_settled(tables, oid, WAIT_SECONDS)["state"]["ProcessState"] == "Processed"
    doc = wrong_state(hostile_stack, tables, oid)
    assert "no wait step" in doc["detail"], doc


def test_an_order_that_skips_the_wait_is_409(hostile_stack: Any, tables: Tables) -> None:
    """An order of 19.98 skips its approval (Skipped from the start). Suspended so that it is still
    running its steps when the event comes: 409 (it waits for no approval), not a finished order's
    409; resumed, it is Processed without one."""
    for _ in range(3):  # the suspend may come after the order finished: another order then
        oid = small_order(hostile_stack, "skips")
        r = send(hostile_stack, "POST", f"/api/orders/{oid}/suspend")
        if r.status == 202:
            break
        assert r.status == 409, (r.status, r.body[:300])
    else:
        pytest.fail("three small orders all finished before they could be suspended")
    v = wait_view(hostile_stack, oid, lambda v: v["suspended"] and not any(s["state"] == "Running" for s in v["steps"]),
                  "a suspended order with no step in flight")
    assert step_of(v)["state"] == "Skipped" and v["processState"] in ("Pending", "Processing"), v
    doc = wrong_state(hostile_stack, tables, oid)
    assert "skips step 'approval'" in doc["detail"], doc
    # Its decision field is not even read.
    wrong_state(hostile_stack, tables, oid, body=body_of({DECISION: "maybe"}))
    assert send(hostile_stack, "POST", f"/api/orders/{oid}/resume").status == 202
    rows = wait_settled(tables, oid, WAIT_SECONDS)
    assert rows["state"]["ProcessState"] == "Processed", rows["state"]
    assert history(hostile_stack, oid)["eventReceived"] == 0


def test_a_finished_order_is_409(hostile_stack: Any, tables: Tables) -> None:
    oid = small_order(hostile_stack, "finished")
    assert wait_settled(tables, oid, WAIT_SECONDS)["state"]["ProcessState"] == "Processed"
    for body in (APPROVE, body_of({DECISION: False}), body_of({DECISION: "yes"})):
        doc = wrong_state(hostile_stack, tables, oid, body=body)
        assert doc["processState"] == "Processed", doc


def test_a_terminated_order_takes_no_event(hostile_stack: Any, tables: Tables) -> None:
    """Terminated at its wait: compensating (its stock released), then ended; an approval is 409
    all along and leaves no trace."""
    oid = waiting_order(hostile_stack, "terminated")
    r = send(hostile_stack, "POST", f"/api/orders/{oid}/terminate")
    assert r.status == 202, (r.status, r.body[:300])
    r = post_event(hostile_stack, oid)  # compensating, or finished already: 409 either way
    assert r.status == 409 and r.is_problem and r.json()["type"].endswith("/wrong-state"), (r.status, r.body[:300])
    rows = wait_settled(tables, oid, WAIT_SECONDS)
    assert rows["state"]["ProcessState"] == "Error", rows["state"]
    v = view(hostile_stack, oid)
    assert v["outcome"] == "terminated" and step_of(v)["event"]["receivedAt"] is None, v
    wrong_state(hostile_stack, tables, oid)
    assert history(hostile_stack, oid)["eventReceived"] == 0


# ------------------------------------------------------------------ events that are taken


def test_an_approved_order_is_processed(hostile_stack: Any, tables: Tables) -> None:
    """The happy path, then copies and other events on the Processed order."""
    oid = waiting_order(hostile_stack, "approved")
    event = {DECISION: True, "by": "hostile-suite"}
    key = [*JSON, ("Idempotency-Key", f"approve-{oid}")]
    doc = taken(post_event(hostile_stack, oid, body_of(event), headers=key), oid, "step-done")
    assert doc["processState"] == "Processing", doc
    rows = wait_settled(tables, oid, WAIT_SECONDS)
    assert rows["state"]["ProcessState"] == "Processed", rows["state"]
    v = view(hostile_stack, oid)
    assert v["outcome"] == "processed" and v["awaiting"] is None, v
    approval = step_of(v)
    assert approval["state"] == "Done" and approval["result"] == event, approval
    assert approval["event"]["body"] == event and approval["event"]["receivedAt"], approval
    assert [s["state"] for s in v["steps"]] == ["Done"] * 4, v["steps"]
    assert history(hostile_stack, oid)["eventReceived"] == 1

    before = tables.partition(oid)
    events_before = len(history_rows(before))
    # A copy: the same key (whatever the body: the key makes the copy). Nothing written.
    for body in (body_of(event), body_of({DECISION: False})):
        doc = taken(post_event(hostile_stack, oid, body, headers=key), oid, "event-duplicate")
        assert doc["processState"] == "Processed", doc
    # Another event: the same body without the key, or another decision: 409.
    for body, headers in ((body_of(event), JSON), (body_of({DECISION: False}), [*JSON, ("Idempotency-Key", "k2")])):
        doc = wrong_state(hostile_stack, tables, oid, body=body, headers=headers)
        assert "received already" in doc["detail"], doc
    after = tables.partition(oid)
    assert after == before and len(history_rows(after)) == events_before
    assert history(hostile_stack, oid)["eventReceived"] == 1


def test_a_declined_order_is_compensated(hostile_stack: Any, tables: Tables) -> None:
    oid = waiting_order(hostile_stack, "declined")
    declined = body_of({DECISION: False, "reason": "over budget"})
    taken(post_event(hostile_stack, oid, declined), oid, "compensating")
    rows = wait_settled(tables, oid, WAIT_SECONDS)
    assert rows["state"]["ProcessState"] == "Error", rows["state"]
    v = view(hostile_stack, oid)
    assert step_of(v)["state"] == "Failed" and step_of(v, "charge-payment")["state"] == "Pending", v["steps"]
    assert step_of(v, "reserve-inventory")["compensation"]["state"] == "Done", v["steps"]
    before = tables.partition(oid)
    # Without a key, the same body is the copy.
    doc = taken(post_event(hostile_stack, oid, declined), oid, "event-duplicate")
    assert doc["processState"] == "Error", doc
    wrong_state(hostile_stack, tables, oid, body=APPROVE)
    assert tables.partition(oid) == before
    assert history(hostile_stack, oid)["eventReceived"] == 1


def test_an_event_of_exactly_16_kib_is_taken(hostile_stack: Any, tables: Tables) -> None:
    oid = waiting_order(hostile_stack, "limit")
    body = padded({DECISION: True, "note": "n" * 1000}, MAX_EVENT_BYTES)
    assert len(body) == MAX_EVENT_BYTES
    taken(post_event(hostile_stack, oid, body), oid, "step-done")
    assert wait_settled(tables, oid, WAIT_SECONDS)["state"]["ProcessState"] == "Processed"
    assert step_of(view(hostile_stack, oid))["result"] == json.loads(body)


def at_once(stack: Any, oid: str, requests: list[tuple[bytes, list[tuple[str, str | bytes]]]]) -> list[RawResponse]:
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda req: post_event(stack, oid, req[0], headers=req[1]), requests))


def test_the_same_event_at_once_is_taken_once(hostile_stack: Any, tables: Tables) -> None:
    oid = waiting_order(hostile_stack, "same-at-once")
    key = [*JSON, ("Idempotency-Key", f"once-{oid}")]
    responses = at_once(hostile_stack, oid, [(APPROVE, key)] * 4)
    assert [r.status for r in responses] == [202] * 4, [(r.status, r.body[:200]) for r in responses]
    assert sorted(r.json()["result"] for r in responses) == ["event-duplicate"] * 3 + ["step-done"], \
        [r.body[:200] for r in responses]
    assert wait_settled(tables, oid, WAIT_SECONDS)["state"]["ProcessState"] == "Processed"
    assert history(hostile_stack, oid)["eventReceived"] == 1


def test_different_events_at_once_one_is_taken(hostile_stack: Any, tables: Tables) -> None:
    oid = waiting_order(hostile_stack, "different-at-once")
    bodies = [body_of({DECISION: True, "n": i}) for i in range(4)]
    responses = at_once(hostile_stack, oid, [(b, JSON) for b in bodies])
    statuses = sorted(r.status for r in responses)
    assert statuses == [202, 409, 409, 409], [(r.status, r.body[:200]) for r in responses]
    winner = next(i for i, r in enumerate(responses) if r.status == 202)
    taken(responses[winner], oid, "step-done")
    for r in responses:
        if r.status == 409:
            assert r.is_problem and r.json()["type"].endswith("/wrong-state"), r.body[:300]
    assert wait_settled(tables, oid, WAIT_SECONDS)["state"]["ProcessState"] == "Processed"
    assert step_of(view(hostile_stack, oid))["result"] == json.loads(bodies[winner])
    assert history(hostile_stack, oid)["eventReceived"] == 1


def test_an_event_before_the_wait_is_kept(hostile_stack: Any, tables: Tables, faults: Any) -> None:
    """The approval comes while the order's first step is still at the inventory service (its
    calls take 8 s here): it is kept on the wait's row, a copy of it writes nothing and another
    event is 409; once the wait starts it ends with the kept event, and the order is Processed."""
    faults.set_faults("inventory", latencyMs=8000)  # under the agent's 10 s call timeout: no failure
    oid = big_order(hostile_stack, "kept")
    event = body_of({DECISION: True, "by": "early"})
    key = [*JSON, ("Idempotency-Key", f"early-{oid}")]
    doc = taken(post_event(hostile_stack, oid, event, headers=key), oid, "event-kept")
    assert doc["processState"] == "Processing", doc
    before = tables.partition(oid)
    v = view(hostile_stack, oid)
    assert step_of(v, "reserve-inventory")["state"] == "Running", v["steps"]
    assert step_of(v)["state"] == "Pending" and step_of(v)["event"]["receivedAt"], v["steps"]
    taken(post_event(hostile_stack, oid, event, headers=key), oid, "event-duplicate")
    doc = wrong_state(hostile_stack, tables, oid, body=body_of({DECISION: False}))
    assert "received already" in doc["detail"], doc
    assert tables.partition(oid) == before
    faults.set_faults("inventory")
    rows = wait_settled(tables, oid, WAIT_SECONDS)
    assert rows["state"]["ProcessState"] == "Processed", rows["state"]
    v = view(hostile_stack, oid)
    assert step_of(v)["state"] == "Done" and step_of(v)["result"] == json.loads(event), v["steps"]
    assert history(hostile_stack, oid)["eventReceived"] == 1
