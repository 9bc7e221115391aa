"""OData injection: no Table filter is built from outside input by string concatenation.

* Every input that reaches the store (order ids in routes, Idempotency-Keys, status queue
  names, and the search's customerId, dates, state and continuation token) is tried with
  injection payloads through the app on the local host; no other order's data leaks and no
  row changes.
* The app's TableStore is queried directly on Azurite with injection payloads as the order id
  and the deadline bucket: a parameterised filter matches nothing, a concatenated one would
  match everything (shown against the same tables).
* A static check (ast) over shared/ and functions/: every ``query_entities``/``list_entities``
  filter is a constant string, with values passed as ``parameters``.
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from local.procs import REPO_ROOT
from tests.hostile.stackutil import (
    GOOD_BODY,
    NOTHING_NEW,
    ROWS_PER_ORDER,
    Tables,
    order_rows,
    send,
    wait_settled,
    with_query,
)

INJECTIONS = [
    "x' or PartitionKey ne '",
    "' or '1' eq '1",
    "00000000000000000000000000000000' or PartitionKey ne '",
    "') or (PartitionKey ne '",
    "x' or RowKey eq 'order",
    "x'; $filter=PartitionKey ne '",
    "x%27%20or%20PartitionKey%20ne%20%27",
    "' or true or '",
    "x'' or PartitionKey ne ''",
]


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


# ---------------------------------------------------------------------------------------------
# Through the app


@pytest.fixture(scope="module")
def victim(hostile_stack: Any, tables: Tables) -> Iterator[str]:
    """An accepted order whose rows must never leak or change."""
    r = send(hostile_stack, "POST", "/api/orders",
             _json({**GOOD_BODY, "customerId": "victim-1"}), [("Content-Type", "application/json")])
    assert r.status == 202
    yield r.json()["orderId"]


def _settled(tables: Tables, order_id: str) -> dict[str, Any]:
    return wait_settled(tables, order_id)


@pytest.mark.integration
@pytest.mark.parametrize("payload", INJECTIONS)
@pytest.mark.parametrize("route", ["", "/history", "/retry", "/cancel", "/terminate"])
def test_injection_through_order_id(hostile_stack: Any, tables: Tables, victim: str, payload: str,
                                    route: str) -> None:
    before_rows = _settled(tables, victim)
    before = tables.snapshot()
    r = send(hostile_stack, "GET" if route in ("", "/history") else "POST",
             f"/api/orders/{quote(payload, safe='')}{route}")
    assert r.status == 400 and r.is_problem, (r.status, r.body[:300])
    assert victim.encode() not in r.body and b"victim-1" not in r.body
    assert before.new_rows(tables.snapshot()) == NOTHING_NEW
    assert tables.partition(victim) == before_rows  # ETags included: nothing was written


@pytest.mark.integration
@pytest.mark.parametrize("payload", [p for p in INJECTIONS if " " not in p and all(0x21 <= ord(c) <= 0x7E for c in p)]
                         + ["x'or'1'eq'1", "'or(PartitionKey)ne('"])
def test_injection_through_idempotency_key(hostile_stack: Any, tables: Tables, victim: str, payload: str) -> None:
    """A key is never part of a filter: the order id is uuid5(key); the victim is untouched and
    the answer names only the new order."""
    before_rows = _settled(tables, victim)
    headers = [("Content-Type", "application/json"), ("Idempotency-Key", payload)]
    r = send(hostile_stack, "POST", "/api/orders", _json(GOOD_BODY), headers)
    assert r.status in (200, 202), r.body[:300]
    from shared.core.orders import order_id_for_key

    oid = r.json()["orderId"]
    assert oid == order_id_for_key(payload) != victim
    assert victim.encode() not in r.body
    rows = tables.partition(oid)
    assert len(order_rows(rows)) == ROWS_PER_ORDER and rows["order"]["IdempotencyKey"] == payload
    g = send(hostile_stack, "GET", f"/api/orders/{oid}")
    assert g.status == 200 and g.json()["orderId"] == oid and b"victim-1" not in g.body
    assert tables.partition(victim) == before_rows


@pytest.mark.integration
@pytest.mark.parametrize("payload", INJECTIONS)
def test_injection_through_status_queue(hostile_stack: Any, tables: Tables, victim: str, payload: str) -> None:
    before_rows = _settled(tables, victim)
    before = tables.snapshot()
    r = send(hostile_stack, "POST", "/api/orders", _json({**GOOD_BODY, "statusQueue": payload}),
             [("Content-Type", "application/json")])
    assert r.status == 400 and r.is_problem
    assert "statusQueue" in {e["field"] for e in r.json()["errors"]}
    assert before.new_rows(tables.snapshot()) == NOTHING_NEW
    assert tables.partition(victim) == before_rows


# Through the search (GET /api/orders): every filter is a key range of the search index, and a
# customer id is hashed into its key; a payload gets 400, or a page of nothing but what it asked.

DATE_INJECTIONS = [
    "2020-01-01' or 1 eq 1",
    "2020-01-01T00:00:00Z' or PartitionKey ne '",
    "datetime'2020-01-01T00:00:00Z'",
    "2020-01-01') or (RowKey ne '",
    "' or CreatedAt ge datetime'1900-01-01T00:00:00Z",
    "2020-01-01 or true",
    "2020-01-01%27%20or%201%20eq%201",
]
STATE_INJECTIONS = ["processed' or RowKey ne '", "' or '1' eq '1", "processed') or (PartitionKey ne '",
                    "attention' or Category ne '", "processed or true"]
SEARCH_INJECTIONS = [("customerId", p) for p in INJECTIONS] + [
    (param, p) for param in ("createdFrom", "createdTo") for p in DATE_INJECTIONS] + [
    ("state", p) for p in STATE_INJECTIONS] + [("continuationToken", p) for p in INJECTIONS]


@pytest.mark.integration
@pytest.mark.parametrize("param,payload", SEARCH_INJECTIONS, ids=lambda v: str(v)[:40])
def test_injection_through_search(hostile_stack: Any, tables: Tables, victim: str, param: str, payload: str) -> None:
    _settled(tables, victim)
    before = tables.snapshot()
    r = send(hostile_stack, "GET", with_query("/api/orders", {param: payload, "limit": "200"}))
    assert r.status in (200, 400) and (r.status == 200 or r.is_problem), (r.status, r.body[:300])
    if r.status == 200:  # only a customer id may be read as a (strange) customer: then it has no orders
        assert param == "customerId", (param, payload, r.body[:300])
        assert r.json()["orders"] == [], r.body[:300]
    elif param == "continuationToken":
        assert r.json()["type"].endswith("/invalid-continuation-token"), r.body[:300]
    assert victim.encode() not in r.body and b"victim-1" not in r.body
    assert before.new_rows(tables.snapshot()) == NOTHING_NEW


@pytest.mark.integration
@pytest.mark.parametrize("payload", INJECTIONS)
def test_a_payload_beside_a_real_customer_id_is_400(hostile_stack: Any, tables: Tables, victim: str,
                                                    payload: str) -> None:
    """The victim's own search with a payload in another filter: 400, not the victim's orders
    (nor anyone else's)."""
    _settled(tables, victim)
    for param in ("createdFrom", "createdTo", "state"):
        r = send(hostile_stack, "GET", with_query("/api/orders", {"customerId": "victim-1", param: payload}))
        assert r.status == 400 and r.is_problem, (param, r.status, r.body[:300])
        assert victim.encode() not in r.body


# ---------------------------------------------------------------------------------------------
# The store itself, on Azurite


@pytest.fixture(params=["rest", "sdk"])
def fresh_store(request: pytest.FixtureRequest, hostile_stack: Any) -> Iterator[Any]:
    """A store on fresh tables, reached by each path in turn (``shared.storage.tables``): each
    quotes filters its own way."""
    from azure.data.tables import TableServiceClient

    from shared.storage.table_store import TableStore

    service = TableServiceClient.from_connection_string(hostile_stack.settings["StateStorage"])
    suffix = uuid.uuid4().hex[:10]
    state = service.create_table_if_not_exists(f"odataorders{suffix}")
    deadlines = service.create_table_if_not_exists(f"odatadeadlines{suffix}")
    try:
        yield TableStore.of(state, deadlines, rest=request.param == "rest")
    finally:
        service.delete_table(f"odataorders{suffix}")
        service.delete_table(f"odatadeadlines{suffix}")
        service.close()


@pytest.mark.integration
def test_store_queries_are_parameterised(fresh_store: Any) -> None:
    from shared.core.rows import IndexRow, Op

    ids = [uuid.uuid4().hex for _ in range(3)]
    for oid in ids:
        fresh_store.transact(oid, [Op("create", {"RowKey": "order", "CustomerId": f"c-{oid[:4]}"}),
                                   Op("create", {"RowKey": "state", "ProcessState": "Pending"})])
        fresh_store.put_index(IndexRow("202611220700", f"{oid}:unclaimed", oid, None))
    # What a concatenated filter would return for the same payloads (the attack works on these tables):
    leaked = fresh_store.state.query("PartitionKey eq 'x' or PartitionKey ne ''", {}, limit=100).rows
    assert len(leaked) == 6
    for payload in INJECTIONS:
        assert fresh_store.read_partition(payload) == {}, payload
        assert fresh_store.read_row(payload, "order") is None
    # The bucket is built from the clock, not input; parameterised all the same.
    assert fresh_store.due_index("0' or PartitionKey gt '0", 100) == []
    assert len(fresh_store.due_index("202611220700", 100)) == 3
    assert set(fresh_store.read_partition(ids[0])) == {"order", "state"}


# ---------------------------------------------------------------------------------------------
# Static check

QUERY_METHODS = {"query_entities", "list_entities", "query"}  # the SDK's, and ``shared.storage.tables.Table.query``
# The two ``Table`` implementations pass their caller's filter on: its parameters are quoted there
# (the REST path's own quoting: tests/unit/storage/test_tables.py), and every caller is checked here.
FORWARDS_FILTERS = "shared/storage/tables.py"
FILTER_KWARGS = {"query_filter", "filter"}


def _constants(tree: ast.Module) -> set[str]:
    """Module-level names bound once to a string constant."""
    out: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    ok = isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                    out[t.id] = out.get(t.id, 0) + (1 if ok else 1000)
    return {k for k, v in out.items() if v == 1}


def unsafe_filters(source: str, filename: str = "<src>") -> list[str]:
    """Calls of query_entities/list_entities whose filter is not a constant string."""
    tree = ast.parse(source, filename)
    consts = _constants(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in QUERY_METHODS):
            continue
        candidates = []
        if node.func.attr in ("query_entities", "query") and node.args:
            candidates.append(node.args[0])
        candidates += [kw.value for kw in node.keywords if kw.arg in FILTER_KWARGS]
        for arg in candidates:
            safe = (isinstance(arg, ast.Constant) and isinstance(arg.value, str)) or \
                   (isinstance(arg, ast.Name) and arg.id in consts)
            if not safe:
                found.append(f"{filename}:{node.lineno}: {node.func.attr}({ast.unparse(arg)})")
    return found


def _sources() -> list[Path]:
    return sorted([*(REPO_ROOT / "shared").rglob("*.py"), *(REPO_ROOT / "functions").rglob("*.py"),
                   REPO_ROOT / "function_app.py"])


def test_no_filter_is_built_from_strings() -> None:
    problems: list[str] = []
    calls = 0
    for path in _sources():
        name = str(path.relative_to(REPO_ROOT))
        if name == FORWARDS_FILTERS:
            continue
        src = path.read_text(encoding="utf-8")
        calls += src.count(".query(") + src.count("query_entities(") + src.count("list_entities(")
        problems += unsafe_filters(src, name)
    assert calls >= 2, "the scan found no Table queries at all: is it looking at the app?"
    assert problems == []


@pytest.mark.parametrize("src", [
    "t.query_entities(f\"PartitionKey eq '{order_id}'\")",
    "t.query_entities(\"PartitionKey eq '\" + order_id + \"'\")",
    "t.query_entities(\"PartitionKey eq '%s'\" % order_id)",
    "t.query_entities(\"PartitionKey eq '{}'\".format(order_id))",
    "t.query_entities(query_filter=f\"RowKey eq '{k}'\")",
    "flt = build(x)\nt.query_entities(flt)",
    "t.list_entities(filter=\"a\" + b)",
    "F = 'PartitionKey eq @pk'\nF = F + x\nt.query_entities(F)",
    "table.query(f\"PartitionKey eq '{order_id}'\", {}, limit=1)",
])
def test_static_check_catches_concatenation(src: str) -> None:
    assert len(unsafe_filters(src)) == 1


@pytest.mark.parametrize("src", [
    "t.query_entities(\"PartitionKey eq @pk\", parameters={\"pk\": order_id})",
    "F = 'PartitionKey le @b'\nt.query_entities(F, parameters={'b': b})",
    "t.list_entities(select=['PartitionKey'])",
    "R = 'RowKey ge @low'\ntable.query(R, {'low': low}, limit=5)",
])
def test_static_check_accepts_parameterised(src: str) -> None:
    assert unsafe_filters(src) == []
