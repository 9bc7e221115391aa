"""Bulk operations over a search: ``POST /api/operations`` and ``GET /api/operations/{id}``.

``POST`` takes ``{"action", "filter", "dryRun"}``: an operator action (retry, cancel, terminate,
suspend, resume) and a search's filters (``state``, ``customerId``, ``workflow``, ``failedStep``,
``createdFrom``, ``createdTo``, as ``GET /api/orders`` takes them). It lists the matching orders
from the search index as a search shows them: a row of a changing category (inFlight, attention)
checked against its order's state row, and repaired if stale (``shared.api.search.current``), so an
order whose index write was lost is matched where its state puts it (if the range read holds its
row: a customer's or every order's; under ``state`` alone, as in a search, once a search that read
it has moved it). The action then decides on each order as it is when it acts, and refuses one
that no longer fits, as the single-order route would. A dry run answers 200 ``{"matched"}``;
otherwise the operation is stored (``shared.core.operations``) and answered 202
with its id and a Location. Its first slice is acted on at once; the Supervisor's ticks do the
rest (``shared.runtime.bulk``). With an ``Idempotency-Key``, the same caller's same key is the same
operation: a retried POST starts nothing twice.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Mapping
from datetime import timedelta

from shared.api.http import HttpResult, lower_headers, parse_json_body, problem
from shared.api.search import SearchQuery, current, parse_query
from shared.core.operations import MAX_ORDERS, Operation, OperationWatch, chunks, partition_of
from shared.core.orders import IDEMPOTENCY_KEY, MAX_IDEMPOTENCY_KEY_LENGTH, ORDER_ID
from shared.core.rows import Op
from shared.core.statemachine.actions import ACTIONS
from shared.observability.logs import log_event
from shared.runtime import Runtime
from shared.runtime.bulk import advance, read_operation
from shared.storage.store import Conflict

MAX_BODY_BYTES = 4096
FIELDS = ("action", "filter", "dryRun")
FILTERS = ("state", "customerId", "workflow", "failedStep", "createdFrom", "createdTo")
FIRST_SLICE = 25  # acted on by the POST itself (room permitting): a small operation is done when it answers
WATCH_AFTER = timedelta(seconds=10)  # the first tick that takes the operation on comes after the POST's slice
PAGE = 1000  # index rows per query while matching
MAX_SCANNED = 50_000  # index rows one match may read (filters with no key range of their own)


def _bad(field: str, message: str) -> HttpResult:
    return problem(400, "validation", "Invalid operation", f"{field}: {message}",
                   errors=[{"field": field, "message": message}])


Request = tuple[str, SearchQuery, dict[str, str], bool]  # action, query, filter, dry run


def parse_request(body: bytes, headers: Mapping[str, str]) -> Request | HttpResult:
    """(action, query, filter, dry run) of a POST, or the 4xx that names what is wrong."""
    payload, rejected = parse_json_body(body or b"", lower_headers(headers), MAX_BODY_BYTES, title="Invalid operation")
    if rejected is not None:
        return rejected
    if not isinstance(payload, dict):
        return _bad("(body)", "must be a JSON object")
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        return _bad(unknown[0], f"not a field of an operation (it takes {', '.join(FIELDS)})")
    action = payload.get("action")
    if not isinstance(action, str) or action not in ACTIONS:
        return _bad("action", f"must be one of {', '.join(ACTIONS)}")
    raw_filter = payload.get("filter", {})
    if not isinstance(raw_filter, dict):
        return _bad("filter", "must be a JSON object")
    for name in sorted(raw_filter):
        if name not in FILTERS:
            return _bad(f"filter.{name}", f"not a filter (it takes {', '.join(FILTERS)})")
        if not isinstance(raw_filter[name], str):
            return _bad(f"filter.{name}", "must be a string, as in a search's query")
    query = parse_query(raw_filter)
    if isinstance(query, HttpResult):
        return query
    dry_run = payload.get("dryRun", False)
    if not isinstance(dry_run, bool):
        return _bad("dryRun", "must be true or false")
    return action, query, dict(raw_filter), dry_run


def matching(rt: Runtime, query: SearchQuery, cap: int) -> list[str] | None:
    """The ids of the orders a search lists for ``query``, newest first, at most ``cap``; None
    when finding them would read more than ``MAX_SCANNED`` index rows. Each row of a changing
    category costs one read of its state row, as in a search (a retry over attention: one per order)."""
    low, high = query.key_range()
    found: list[str] = []
    scanned = 0
    last: str | None = None
    while len(found) < cap:
        rows = rt.store.query_index(low, high, PAGE)
        scanned += len(rows)
        fresh = [r for r in rows if last is None or r.row_key > last]  # a page starts at the last key read
        filtered = query.workflow is not None or query.failed_step is not None
        # an order's workflow never changes: no state read for a row of another (as in a search)
        kept = [r for r in fresh if query.workflow is None or r.workflow in (None, query.workflow)]
        found += [f.order_id for f in current(rt, kept, filtered) if query.matches(f)][:cap - len(found)]
        if len(rows) < PAGE or not fresh:
            break
        if scanned >= MAX_SCANNED:
            return None
        last = low = rows[-1].row_key
    return found


def _operation_id(by: str, key: str | None) -> str:
    """A new id; with an Idempotency-Key, the same one for the same caller and key."""
    if key is None:
        return uuid.uuid4().hex
    return hashlib.sha256(f"{by}\n{key}".encode()).hexdigest()[:32]


def _accepted(op: Operation) -> HttpResult:
    return HttpResult(202, {"operationId": op.operation_id, "action": op.action, "matched": op.matched,
                            "state": op.state, "succeeded": op.succeeded, "failed": op.failed},
                      headers={"Location": f"/api/operations/{op.operation_id}"})


def _same(rt: Runtime, operation_id: str, action: str, filter_: dict[str, str]) -> HttpResult:
    """The answer to a POST whose key names an operation already started."""
    op = read_operation(rt, operation_id)
    if op is None:  # the first POST's transaction is not visible yet (or failed): try again
        return problem(409, "conflict", "Operation being started", "a request with this Idempotency-Key is "
                       "being started; try again")
    if op.action != action or op.filter != filter_:
        return problem(409, "key-reused", "Idempotency-Key reused", "this Idempotency-Key started another "
                       f"operation ({op.action} over {op.filter}): use a new key", operationId=op.operation_id)
    return _accepted(op)


def start_operation(rt: Runtime, body: bytes, headers: Mapping[str, str], by: str) -> HttpResult:
    parsed = parse_request(body, headers)
    if isinstance(parsed, HttpResult):
        return parsed
    action, query, filter_, dry_run = parsed
    key = lower_headers(headers).get("idempotency-key")
    if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH and IDEMPOTENCY_KEY.fullmatch(key)):
        return _bad("Idempotency-Key", f"must be 1-{MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters")
    operation_id = _operation_id(by, key)
    if key is not None and not dry_run and read_operation(rt, operation_id) is not None:
        return _same(rt, operation_id, action, filter_)
    ids = matching(rt, query, MAX_ORDERS + 1)
    if ids is None:
        return problem(422, "too-broad", "Filter too broad", f"finding the orders would read more than {MAX_SCANNED} "
                       "index rows: narrow it by state, customerId or createdFrom/createdTo")
    if dry_run:
        return HttpResult(200, {"action": action, "matched": len(ids), "limit": MAX_ORDERS,
                                "overLimit": len(ids) > MAX_ORDERS})
    if len(ids) > MAX_ORDERS:
        return problem(422, "too-many", "Too many orders", f"the filter matches more than {MAX_ORDERS} orders; "
                       "narrow it (state, customerId, workflow, failedStep, createdFrom, createdTo)",
                       limit=MAX_ORDERS)
    now = rt.clock()
    op = Operation(operation_id, action, filter_, by, now, len(ids), key=key)
    # first: no operation is without one; due after the POST's own slice, which a tick would only repeat
    rt.store.put_index(OperationWatch(operation_id, now + WATCH_AFTER).row)
    try:
        rt.store.transact(partition_of(operation_id),
                          [Op("create", op.to_entity()), *(Op("create", c) for c in chunks(ids))])
    except Conflict:  # the same key's other request won
        return _same(rt, operation_id, action, filter_)
    log_event(logging.INFO, "operation.started", operationId=operation_id, action=action, by=by, matched=len(ids),
              filter=filter_)
    try:
        first = advance(rt, operation_id, FIRST_SLICE).operation
    except Exception as exc:  # noqa: BLE001 - stored and watched: the Supervisor's next tick goes on
        log_event(logging.WARNING, "operation.first_slice_failed", operationId=operation_id, error=repr(exc))
        first = None
    return _accepted(first or op)


def get_operation(rt: Runtime, raw_id: str | None) -> HttpResult:
    if not raw_id or not ORDER_ID.fullmatch(raw_id):
        return problem(400, "invalid-operation-id", "Invalid operation id", "an operation id is 32 lower-case hex "
                       "digits", errors=[{"field": "id", "message": "must be 32 lower-case hex digits"}])
    op = read_operation(rt, raw_id)
    if op is None:
        return problem(404, "not-found", "Operation not found", f"no operation {raw_id}")
    return HttpResult(200, op.to_json())
