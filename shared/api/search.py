"""``GET /api/orders``: find orders by category, customer and creation time, newest first.

Every search reads ONE key range of the search index (``shared.core.statemachine.search_index``),
in each of its shards at once, merged by key (``shared.storage.store``: a token is still one key):
the customer's range if ``customerId`` is given, else the category's if ``state`` is, else
every order's; the creation-time bounds narrow the range (its keys are inverted creation
times). A page reads at most ``limit + 1`` index rows per shard, however many orders there are, plus
the state row of each result whose category still changes (inFlight, attention), to show it
as it is now (a step waiting on a breaker included, with one query of the breakers for the
time of their next probe) and to repair a stale index row. With both ``customerId`` and ``state``, the
customer's rows are filtered by category, so a page may hold fewer than ``limit`` orders and
still have a continuation token: follow it.

``workflow`` (a workflow's name: every version of it) and ``failedStep`` (the step an order failed
at) filter the rows the range read gives the same way, with no key range of their own: the index
rows carry both (written with them, no write more), the failed step of a changing category is
taken from the state row the search reads anyway, and a row written before the rows carried them
is checked against its order (one read of the order's partition, only under these filters). So a
page under them may be short, or empty, and still have a token: follow it (narrow by state,
customerId or creation time to read fewer rows).

Any other query parameter gets 400 naming it (``code``, the function key the Functions host
takes from the query string, excepted).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time
from typing import Any

from shared.api.http import HttpResult, problem, unknown_query
from shared.api.tokens import InvalidToken, issue, redeem
from shared.api.views import next_probe, room_wait
from shared.core.orders import MAX_ID_LENGTH, SAFE_ID
from shared.core.rows import STATE_ROW, SearchRow
from shared.core.statemachine import Category, StateRow, category_of
from shared.core.statemachine.search_index import customer_key, rev
from shared.core.states import Outcome, ProcessState
from shared.core.times import iso
from shared.core.workflows.schema import NAME, NAME_PATTERN
from shared.runtime import Runtime
from shared.runtime.reindex import reindex_from_state
from shared.storage.breakers import read_breakers
from shared.storage.views import read_view

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
VERIFY_WORKERS = 8
STATES = ", ".join(c.value for c in Category)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
REV_LIMIT = 10 ** 17  # no ``rev`` reaches it (so no order was created at or before 1970-01-01T00:00Z)
# The query parameters a search takes (and ``code``, the function key: ``shared.api.http``).
PARAMETERS = ("state", "customerId", "workflow", "failedStep", "createdFrom", "createdTo", "limit",
              "continuationToken")


@dataclass(frozen=True)
class SearchQuery:
    category: Category | None = None
    customer_id: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    limit: int = DEFAULT_LIMIT
    workflow: str | None = None
    failed_step: str | None = None

    @property
    def scope(self) -> str:
        """What a continuation token is bound to: the filters (not the limit). Without workflow
        and failedStep, the scope tokens had before those filters were (so those stay good)."""
        scope: list[Any] = ["orders", self.category, self.customer_id,
                            self.created_from.isoformat() if self.created_from else None,
                            self.created_to.isoformat() if self.created_to else None]
        if self.workflow is not None or self.failed_step is not None:
            scope += [self.workflow, self.failed_step]
        return json.dumps(scope)

    def matches(self, found: Found) -> bool:
        """Whether a result (as it is now) passes the filters the key range does not apply."""
        return ((self.category is None or found.category is self.category)
                and (self.workflow is None or found.workflow == self.workflow)
                and (self.failed_step is None or found.failed_step == self.failed_step))

    def key_range(self) -> tuple[str, str]:
        """[low, high) of the index keys this query reads, newest first."""
        if self.customer_id is not None:
            prefix = f"cust-{customer_key(self.customer_id)}-"
        elif self.category is not None:
            prefix = f"cat-{self.category}-"
        else:
            prefix = "all-"
        # created < to  <=>  rev > rev(to);  created >= from  <=>  rev <= rev(from). ``rev`` has 17
        # digits from 1970 on: a ``from`` at or before it is no bound at all.
        upper = int(rev(self.created_from)) + 1 if self.created_from is not None else REV_LIMIT
        low = prefix + (f"{int(rev(self.created_to)) + 1:017d}" if self.created_to else "")
        high = prefix + f"{upper:017d}" if upper < REV_LIMIT else prefix[:-1] + "."
        return low, high


def _bad(field: str, message: str) -> HttpResult:
    kind = "invalid-continuation-token" if field == "continuationToken" else "invalid-query"
    return problem(400, kind, "Invalid search", f"{field}: {message}", errors=[{"field": field, "message": message}])


def _instant(field: str, raw: str) -> datetime | HttpResult:
    """An ISO-8601 date-time with an offset, or a date (midnight UTC), after 1970-01-01T00:00Z
    (no order is older: the index's keys start there) and before the year 10000, in UTC."""
    try:
        if len(raw) == 10:
            value = datetime.combine(date.fromisoformat(raw), time(0), tzinfo=UTC)
        else:
            value = datetime.fromisoformat(raw)
        if value.tzinfo is None:
            raise ValueError("no offset")
        value = value.astimezone(UTC)
    except (ValueError, OverflowError):
        value = None
    if value is None or value <= EPOCH:
        return _bad(field, "must be an ISO-8601 date (YYYY-MM-DD) or date-time with an offset, "
                           "after 1970-01-01T00:00:00Z")
    return value


def parse_query(params: Mapping[str, str]) -> SearchQuery | HttpResult:
    """The search's filters, or the 400 that names what is wrong with them."""
    unknown = unknown_query(params, PARAMETERS, "Invalid search")
    if unknown is not None:
        return unknown
    names: dict[str, str | None] = {}
    for field in ("workflow", "failedStep"):
        raw = params.get(field)
        if raw is not None and not NAME_PATTERN.fullmatch(raw):
            what = "a workflow's name" if field == "workflow" else "a step's name"
            return _bad(field, f"must be {what} ({NAME}: lower-case letters, digits and '-', "
                               f"starting with a letter, at most 63)")
        names[field] = raw
    state = params.get("state")
    if state is not None and state not in {c.value for c in Category}:
        return _bad("state", f"must be one of {STATES}")
    customer = params.get("customerId")
    if customer is not None and not (0 < len(customer) <= MAX_ID_LENGTH and SAFE_ID.fullmatch(customer)):
        return _bad("customerId", f"must be a customer id (1-{MAX_ID_LENGTH} letters, digits, '.', '_', ':', '@', '-')")
    bounds: dict[str, datetime | None] = {}
    for field in ("createdFrom", "createdTo"):
        raw = params.get(field)
        parsed = _instant(field, raw) if raw is not None else None
        if isinstance(parsed, HttpResult):
            return parsed
        bounds[field] = parsed
    start, end = bounds["createdFrom"], bounds["createdTo"]
    if start is not None and end is not None and start > end:
        return _bad("createdFrom", "must not be after createdTo")
    raw_limit = params.get("limit")
    if raw_limit is not None and not (raw_limit.isascii() and raw_limit.isdigit() and len(raw_limit) <= 4
                                      and 1 <= int(raw_limit) <= MAX_LIMIT):
        return _bad("limit", f"must be a whole number from 1 to {MAX_LIMIT}")
    return SearchQuery(Category(state) if state else None, customer, start, end,
                       int(raw_limit) if raw_limit else DEFAULT_LIMIT, names["workflow"], names["failedStep"])


def search_orders(rt: Runtime, params: Mapping[str, str]) -> HttpResult:
    query = parse_query(params)
    if isinstance(query, HttpResult):
        return query
    low, high = query.key_range()
    token = params.get("continuationToken")
    if token is not None:
        try:
            after = redeem(rt.keys, query.scope, token).get("k")
        except InvalidToken as exc:
            return _bad("continuationToken", f"not a token this search issued ({exc})")
        if not isinstance(after, str) or not low <= after < high:
            return _bad("continuationToken", "not a token this search issued (out of range)")
        low = after
    rows = rt.store.query_index(low, high, query.limit + 1)
    following = rows[query.limit].row_key if len(rows) > query.limit else None
    page = rows[:query.limit]
    if query.workflow is not None:  # an order's workflow never changes: no read for a row of another
        page = [r for r in page if r.workflow is None or r.workflow == query.workflow]
    filtered = query.workflow is not None or query.failed_step is not None
    orders = [o for o in current(rt, page, filtered) if query.matches(o)]
    return HttpResult(200, {"orders": [o.to_json() for o in orders],
                            "continuationToken": issue(rt.keys, query.scope, {"k": following}) if following else None})


@dataclass(frozen=True)
class Found:
    """An order as a search result shows it."""

    order_id: str
    process_state: ProcessState | None
    outcome: Outcome | None
    customer_id: str | None
    created_at: datetime | None
    updated_at: datetime | None
    failure_count: int
    priority: str | None
    category: Category
    workflow: str | None = None
    failed_step: str | None = None
    # its step in flight waits on a remote's open breaker: step, remote, giveUpAt, breaker, nextProbeAt
    waiting: dict[str, Any] | None = None
    # accepted over its customer's CustomerMaxInFlight, it waits for a slot: kind, customerId, since
    waiting_for: dict[str, Any] | None = None
    # from the index row (None in a row written before they were recorded there)
    total: str | None = None
    currency: str | None = None

    @classmethod
    def of(cls, row: SearchRow) -> Found:
        return cls(row.order_id, row.process_state, row.outcome, row.customer_id, row.created_at, row.updated_at,
                   row.failure_count or 0, row.priority, row.category, row.workflow, row.failed_step,
                   total=row.total, currency=row.currency)

    def to_json(self) -> dict[str, Any]:
        return {"orderId": self.order_id, "processState": self.process_state, "outcome": self.outcome,
                "customerId": self.customer_id, "createdAt": iso(self.created_at) if self.created_at else None,
                "updatedAt": iso(self.updated_at) if self.updated_at else None, "failureCount": self.failure_count,
                "priority": self.priority, "category": self.category, "workflow": self.workflow,
                "failedStep": self.failed_step, "waiting": self.waiting, "waitingFor": self.waiting_for,
                "total": self.total, "currency": self.currency}


def current(rt: Runtime, rows: list[SearchRow], filtered: bool = False) -> list[Found]:
    """The rows as results; those of a changing category or of the legacy partition (whose deletes
    went to a shard since: ``shared.storage.store``) checked against their state row (a stale one
    repaired), and under a workflow or failedStep filter, a row written before rows carried those,
    against its order. A bulk operation matches its orders through this too (``shared.api.bulk``),
    so it acts on exactly the orders a search shows."""
    def check(row: SearchRow) -> Found | None:
        return _check_legacy(rt, row) if filtered and row.workflow is None else _check(rt, row)

    changing = [r for r in rows if not r.category.final or r.legacy or (filtered and r.workflow is None)]
    checked: dict[str, Found | None] = {}
    if changing:
        with ThreadPoolExecutor(max_workers=min(VERIFY_WORKERS, len(changing))) as pool:
            for row, result in zip(changing, pool.map(check, changing), strict=True):
                checked[row.row_key] = result
    out = []
    for row in rows:
        result = checked[row.row_key] if row.row_key in checked else Found.of(row)
        if result is not None:
            out.append(result)
    return _with_probes(rt, out)


def _with_probes(rt: Runtime, found: list[Found]) -> list[Found]:
    """The waiting results with their breaker's next probe: one query of the breakers, if any waits."""
    remotes = {f.waiting["remote"] for f in found if f.waiting is not None}
    if not remotes:
        return found
    breakers = read_breakers(rt.store, remotes)
    return [replace(f, waiting={**f.waiting, **next_probe(breakers.get(f.waiting["remote"]))})
            if f.waiting is not None else f for f in found]


def _check(rt: Runtime, row: SearchRow) -> Found | None:
    """The row as the order is now (None: the order is gone); a stale row is repaired."""
    entity = rt.store.read_row(row.order_id, STATE_ROW)
    if entity is None:  # purged while its index rows were being deleted: drop this one too
        rt.store.write_index([], [row.row_key])
        return None
    return _as_now(rt, row, StateRow.from_entity(entity))


def _as_now(rt: Runtime, row: SearchRow, state: StateRow) -> Found:
    """The row as ``state`` says the order is; a stale row is repaired."""
    category = category_of(state)
    if category is not row.category:
        reindex_from_state(rt, state.order_id, row.category)
    waiting = None
    if state.waiting_on is not None and state.lease is not None:
        waiting = {"step": state.lease.step, "remote": state.waiting_on, "giveUpAt": iso(state.complete_by)
                   if state.complete_by else None}
    return replace(Found.of(row), process_state=state.process_state, failure_count=state.failure_count,
                   outcome=state.outcome, category=category, updated_at=state.updated_at, waiting=waiting,
                   waiting_for=room_wait(row.customer_id, row.created_at) if state.waits_for_room else None,
                   failed_step=state.failed_step)


def _check_legacy(rt: Runtime, row: SearchRow) -> Found | None:
    """A row written before index rows carried the workflow and failed step, as its order is now
    (one read of the order's partition instead of its state row; None: the order is gone). The row
    is left as it is: it is rewritten at the order's next change of category."""
    view = read_view(rt.store, row.order_id)
    if view.order is None or view.state is None:
        return _check(rt, row)  # gone (or going): as any row of a gone order
    found = Found.of(row) if row.category.final and not row.legacy else _as_now(rt, row, view.state)
    return replace(found, workflow=view.order.workflow, failed_step=view.state.failed_step)
