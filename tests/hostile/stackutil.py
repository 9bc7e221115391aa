"""Helpers of the hostile-input tests: the local stack, its tables and raw HTTP.

* ``start_stack``: the whole local stack (Azurite, the Service Bus emulator, the remote
  services, the local Functions host with the app) on free loopback ports.
* ``Tables``: read-only views of the app's tables (what a rejected request must not change).
* ``raw_request``: HTTP/1.1 over a plain socket, for what ``requests`` refuses to send
  (control characters in paths, no Content-Type, arbitrary bytes).
* ``send``: ``raw_request`` to a stack's host with the key the route needs (``route_level``):
  the host checks function keys as Azure does, and a request without its key gets 401 before
  the app sees it. A hostile request still carries the right key, so that it reaches the app.
"""

from __future__ import annotations

import json
import socket
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from local.host.keys import ADMIN, ANONYMOUS, FUNCTION, KEY_HEADER
from local.host.routes import RouteTable, compile_route
from local.stack import Stack
from shared.core.breaker.waiting import WAITING_PREFIX
from shared.core.workflows import DEFAULT_WORKFLOW, load_registry
from shared.storage.breakers import BREAKER_PARTITION
from shared.storage.store import SEARCH_SHARDS, index_partitions

PROBLEM = "application/problem+json"
GOOD_BODY: dict[str, Any] = {"customerId": "c-1", "currency": "EUR",
                             "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": 9.99}],
                             "priority": "normal", "statusQueue": None}


def rows_per_order(workflow: str | None = None) -> int:
    """A new order's rows besides its history: the order row, the state row and one row per step
    of the workflow it runs (the highest loaded version of ``workflow``, default ``order``; a step
    its ``when`` skips has its row too, Skipped)."""
    return 2 + len(load_registry().latest(workflow or DEFAULT_WORKFLOW).steps)


# An order's rows (a new order of the default workflow); and its history (``history-NNNNNNNN``,
# one row per event, appended as the order goes on).
ROWS_PER_ORDER = rows_per_order()
HISTORY_PREFIX = "history-"
# What a request that is rejected (or only reads) adds to the tables: nothing.
NOTHING_NEW: dict[str, list[Any]] = {"state": [], "deadlineOrders": [], "indexOrders": []}
INDEX_TABLE_DEFAULT = "orderindex"


def is_history(row_key: str) -> bool:
    return row_key.startswith(HISTORY_PREFIX)


def order_rows(partition: dict[str, Any]) -> dict[str, Any]:
    """An order's rows without its history events (``Tables.partition`` returns both)."""
    return {k: v for k, v in partition.items() if not is_history(k)}


def history_rows(partition: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in partition.items() if is_history(k)}

# Quiet supervisor; everything else at its defaults.
STACK_SETTINGS = {"SupervisorSchedule": "*/5 * * * * *"}


def start_stack(state_dir: Path | None = None, instances: int = 1, **overrides: str) -> Stack:
    state_dir = state_dir or Path(tempfile.mkdtemp(prefix="hostile-stack-"))
    return Stack(state_dir=state_dir, persistent=False, instances=instances,
                 settings_overrides={**STACK_SETTINGS, **overrides}, start_timeout=120).start()


def function_app_registers_openapi() -> bool:
    """Whether function_app.py registers functions/openapi.py's blueprint (the lead's line)."""
    import ast

    from local.procs import REPO_ROOT

    tree = ast.parse((REPO_ROOT / "function_app.py").read_text(encoding="utf-8"))
    imported = any(isinstance(n, ast.ImportFrom) and n.module == "functions"
                   and any(a.name == "openapi" for a in n.names) for n in ast.walk(tree))
    registered = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and n.func.attr in ("register_functions", "register_blueprint") and n.args
                     and ast.unparse(n.args[0]) == "openapi.bp" for n in ast.walk(tree))
    return imported and registered


# ---------------------------------------------------------------------------------------------
class Tables:
    """The app's state table, deadline index and search index, read with the Azure SDK against
    Azurite."""

    def __init__(self, stack: Stack) -> None:
        from azure.data.tables import TableServiceClient

        self.service = TableServiceClient.from_connection_string(stack.settings["StateStorage"])
        self.state_name = stack.settings["StateTable"]
        self.deadline_name = stack.settings["DeadlineTable"]
        self.index_name = stack.settings.get("OrderIndexTable", INDEX_TABLE_DEFAULT)
        for name in (self.state_name, self.deadline_name, self.index_name):
            self.service.create_table_if_not_exists(name)  # the app creates them on first use too
        self.state = self.service.get_table_client(self.state_name)
        self.deadlines = self.service.get_table_client(self.deadline_name)
        self.index = self.service.get_table_client(self.index_name)

    def state_keys(self) -> set[tuple[str, str]]:
        return {(e["PartitionKey"], e["RowKey"]) for e in self.state.list_entities(select=["PartitionKey", "RowKey"])}

    def state_partitions(self) -> set[str]:
        return {pk for pk, _ in self.state_keys()}

    def deadline_order_ids(self) -> set[str]:
        return {str(e.get("OrderId")) for e in self.deadlines.list_entities(select=["OrderId"])}

    def index_order_ids(self) -> set[str]:
        """The orders the search index has a row of (any key range of any of its partitions: its
        shards and the legacy one; the console's per-process stats rows live in another partition
        of the table)."""
        return {str(e.get("OrderId")) for pk in index_partitions(SEARCH_SHARDS)
                for e in self.index.query_entities("PartitionKey eq @pk", parameters={"pk": pk}, select=["OrderId"])}

    def partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        """Every row of one order, with its ETag (any write changes it)."""
        rows = self.state.query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
        return {e["RowKey"]: {**dict(e), "_etag": e.metadata.get("etag")} for e in rows}

    def snapshot(self) -> Snapshot:
        return Snapshot(frozenset(self.state_keys()), frozenset(self.deadline_order_ids()),
                        frozenset(self.index_order_ids()))

    def close(self) -> None:
        self.service.close()


@dataclass(frozen=True)
class Snapshot:
    state: frozenset[tuple[str, str]]
    deadline_orders: frozenset[str]
    index_orders: frozenset[str] = frozenset()

    def new_rows(self, later: Snapshot) -> dict[str, Any]:
        """What ``later`` holds that this snapshot did not (``NOTHING_NEW`` when nothing):

        * ``state``: rows of the state table, except the history events of orders that existed
          (an order still being processed appends them meanwhile; a test that must see none
          compares that order's partition, ETags included) and the circuit breakers' rows
          (``breakers``, ``waiting-{remote}``: the agents write them while earlier tests' orders
          still run, whatever the request under test does);
        * ``deadlineOrders``: deadline index rows of orders that had none (the index of known
          orders comes and goes);
        * ``indexOrders``: search index rows of orders that neither it nor the state table knew
          (the index of a known order is written after its state, group-committed, so it may
          land later).
        """
        known = {pk for pk, _ in self.state}
        new_state = [k for k in later.state - self.state if not (k[0] in known and is_history(k[1]))
                     and not (k[0] == BREAKER_PARTITION or k[0].startswith(WAITING_PREFIX))]
        return {"state": sorted(new_state),
                "deadlineOrders": sorted(later.deadline_orders - self.deadline_orders),
                "indexOrders": sorted(later.index_orders - self.index_orders - known)}


# ---------------------------------------------------------------------------------------------
@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def is_problem(self) -> bool:
        return self.content_type.split(";")[0].strip().lower() == PROBLEM


def raw_request(base_url: str, method: str, path: bytes | str, body: bytes = b"",
                headers: Iterable[tuple[str, str | bytes]] = (), timeout: float = 30.0,
                functions_key: str | None = None) -> RawResponse:
    """Send one HTTP/1.1 request byte for byte (the path is NOT encoded) and read the answer.
    ``functions_key`` (the function or the master key), if given, goes as the ``x-functions-key``
    header after ``headers``."""
    u = urlsplit(base_url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    target = path.encode("latin-1") if isinstance(path, str) else path
    lines = [method.encode() + b" " + target + b" HTTP/1.1", f"Host: {host}:{port}".encode(),
             b"Connection: close", f"Content-Length: {len(body)}".encode()]
    if functions_key:
        headers = [*headers, (KEY_HEADER, functions_key)]
    for k, v in headers:
        lines.append(k.encode("latin-1") + b": " + (v if isinstance(v, bytes) else v.encode("latin-1")))
    data = b"\r\n".join(lines) + b"\r\n\r\n" + body
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, rest = raw.partition(b"\r\n\r\n")
    if not head:
        raise ConnectionError(f"no response to {method} {target!r}")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    hdrs: dict[str, str] = {}
    for line in header_lines:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    n = int(hdrs.get("content-length", len(rest)))
    return RawResponse(status, hdrs, rest[:n])


# The app's routes that take a key, and the key each takes (functions/openapi.yaml, "Authentication"):
# FUNCTION, the client's routes (the function key); ADMIN, the operator's (the master key only).
# Written out here, not read from the app: a route the app gives another level gets 401 in these
# tests. Every other request under /api reaches an ANONYMOUS function (GET openapi.yaml, GET
# console/assets/{name}) or the fallback route (its 404, 405 and OPTIONS answers need no key).
ROUTE_LEVELS: tuple[tuple[str, str, str], ...] = (
    ("POST", "orders", FUNCTION),
    ("GET", "orders/{id}", FUNCTION),
    ("GET", "orders/{id}/history", FUNCTION),
    ("GET", "workflows", FUNCTION),
    ("GET", "orders", ADMIN),
    *(("POST", f"orders/{{id}}/{action}", ADMIN) for action in ("retry", "cancel", "terminate", "suspend", "resume")),
    ("POST", "orders/{id}/events/{name}", ADMIN),
    ("POST", "operations", ADMIN),
    ("GET", "operations/{id}", ADMIN),
    ("GET", "console", ADMIN),
    ("GET", "overview", ADMIN),
    ("GET", "console/caller", ADMIN),
    ("GET", "console/orders/{id}", ADMIN),
    ("GET", "console/orders/{id}/history", ADMIN),
    ("GET", "deadletters", ADMIN),
    ("POST", "deadletters/{queue}/{sequenceNumber}/resubmit", ADMIN),
    ("POST", "deadletters/{queue}/{sequenceNumber}/discard", ADMIN),
    ("GET", "webhooks", ADMIN),
    ("POST", "orders/{id}/webhooks/{delivery}/resend", ADMIN),
)
# The host's own routes (no prefix): its status takes the master key.
HOST_ROUTE_LEVELS: tuple[tuple[str, str, str], ...] = (("GET", "admin/host/status", ADMIN),)
_ROUTES = RouteTable([*(compile_route(route, "api", level, [method]) for method, route, level in ROUTE_LEVELS),
                      *(compile_route(route, "", level, [method]) for method, route, level in HOST_ROUTE_LEVELS)])


def route_level(method: str, path: bytes | str) -> str:
    """The key level a request for ``path`` needs: that of the route it reaches (``ROUTE_LEVELS``;
    matched as the host matches, literals in any case, an optional trailing slash, the path as
    sent, before its query), else ``ANONYMOUS``."""
    target = path.decode("latin-1") if isinstance(path, bytes) else path
    route, _, _ = _ROUTES.lookup(method, urlsplit(target).path)
    return str(route.target) if route is not None else ANONYMOUS


def key_of(stack: Stack, level: str) -> str | None:
    """The key ``stack`` takes on routes of ``level`` (none for ANONYMOUS, or when it checks no key)."""
    return stack.key_headers(level).get(KEY_HEADER)


def send(stack: Stack, method: str, path: bytes | str, body: bytes = b"",
         headers: Iterable[tuple[str, str | bytes]] = (), *, level: str | None = None,
         timeout: float = 30.0) -> RawResponse:
    """``raw_request`` to ``stack``'s host with the key of ``level`` (default: the level of the
    route ``path`` reaches, ``route_level``): the function key on a client route, the master key
    on an operator route, none on an anonymous one."""
    key = key_of(stack, route_level(method, path) if level is None else level)
    return raw_request(stack.base_url, method, path, body, headers, timeout, functions_key=key)


def wait_settled(tables: Tables, order_id: str, timeout: float = 90.0) -> dict[str, dict[str, Any]]:
    """An order's rows once it is terminal and its rows stopped changing (two equal reads). An
    order in Error that is still compensating (Mode compensate) is not terminal: its refund may
    be waiting out a backoff with no row changing."""
    import time

    deadline = time.monotonic() + timeout
    prev = None
    while time.monotonic() < deadline:
        rows = tables.partition(order_id)
        state = rows.get("state", {})
        done = state.get("ProcessState") in ("Processed", "Error") and state.get("Mode") != "compensate"
        if done and rows == prev:
            return rows
        prev = rows
        time.sleep(0.5)
    raise AssertionError(f"order {order_id} did not settle within {timeout}s: {prev and prev.get('state')}")


def wait_all_settled(tables: Tables, order_ids: list[str], timeout: float = 240.0) -> list[dict[str, Any]]:
    """The state rows of many orders once every one is settled (``wait_settled``'s test: terminal,
    and its rows unchanged between two reads), read together: one pass over the orders not yet
    settled every 0.5 s, where waiting for each in turn costs at least 0.5 s an order."""
    import time

    deadline = time.monotonic() + timeout
    last: dict[str, dict[str, dict[str, Any]]] = {}
    settled: dict[str, dict[str, Any]] = {}
    while True:
        for order_id in [o for o in order_ids if o not in settled]:
            rows = tables.partition(order_id)
            state = rows.get("state", {})
            done = state.get("ProcessState") in ("Processed", "Error") and state.get("Mode") != "compensate"
            if done and rows == last.get(order_id):
                settled[order_id] = state
            last[order_id] = rows
        if len(settled) == len(order_ids):
            return [settled[o] for o in order_ids]
        if time.monotonic() > deadline:
            left = [o for o in order_ids if o not in settled]
            raise AssertionError(f"{len(left)} of {len(order_ids)} orders did not settle within {timeout}s, "
                                 f"e.g. {left[0]}: {last[left[0]].get('state')}")
        time.sleep(0.5)



def settled_states(stack: Stack, order_ids: list[str], timeout: float = 240.0) -> dict[str, dict[str, Any]]:
    """Order id -> its state row, once every one of ``order_ids`` is settled (:func:`wait_all_settled`,
    through tables opened and closed here)."""
    tables = Tables(stack)
    try:
        return dict(zip(order_ids, wait_all_settled(tables, order_ids, timeout=timeout), strict=True))
    finally:
        tables.close()

def submit(stack: Stack, body: dict[str, Any] | None = None, key: str | None = None) -> str:
    headers: list[tuple[str, str | bytes]] = [("Content-Type", "application/json")]
    if key:
        headers.append(("Idempotency-Key", key))
    r = send(stack, "POST", "/api/orders", json.dumps(body or GOOD_BODY).encode(), headers, level=FUNCTION)
    if r.status != 202:
        raise AssertionError(f"POST /api/orders: {r.status} {r.body[:300]!r}")
    return str(r.json()["orderId"])


# ---------------------------------------------------------------------------------------------
# The query endpoints (GET /api/orders, GET /api/orders/{id}/history)

Params = Mapping[str, str] | Sequence[tuple[str, str]]


def with_query(path: str, params: Params = ()) -> str:
    """``path`` with ``params`` percent-encoded as a query string (every reserved character
    encoded: ``+`` is ``%2B``, a space ``%20``)."""
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    return path + ("?" + urlencode(items, quote_via=quote, safe="") if items else "")


def get(stack: Stack, path: str, params: Params = ()) -> RawResponse:
    """GET ``path`` with ``params``, with the key of the route it reaches (``send``)."""
    return send(stack, "GET", with_query(path, params))


def search_all(stack: Stack, params: Params, page_size: int = 200, max_pages: int = 50) -> list[dict[str, Any]]:
    """Every order a search returns, following its continuation tokens."""
    base = list(params.items()) if isinstance(params, Mapping) else list(params)
    found: list[dict[str, Any]] = []
    token = None
    for _ in range(max_pages):
        query = [*base, ("limit", str(page_size))] + ([("continuationToken", token)] if token else [])
        r = get(stack, "/api/orders", query)
        if r.status != 200:
            raise AssertionError(f"search {query}: {r.status} {r.body[:300]!r}")
        page = r.json()
        found += page["orders"]
        token = page["continuationToken"]
        if not token:
            return found
    raise AssertionError(f"search {base}: more than {max_pages} pages")


def wait_searchable(stack: Stack, params: Params, order_ids: Iterable[str],
                    timeout: float = 30.0) -> list[dict[str, Any]]:
    """The orders a search returns once it returns every one of ``order_ids`` (the search index
    is written after an order's state, group-committed)."""
    import time

    wanted = set(order_ids)
    deadline = time.monotonic() + timeout
    while True:
        found = search_all(stack, params)
        if wanted <= {o["orderId"] for o in found}:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"search {params} did not return {sorted(wanted)} within {timeout}s: {found}")
        time.sleep(0.5)
