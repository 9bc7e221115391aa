"""The search index: where ``GET /api/orders`` finds orders without scanning anything.

One partition (``orders``) of ``OrderIndexTable``, key ranges by purpose (``rev`` is the
inverted creation time, so that ascending keys are newest first):

==================================  ==========================================================
``all-{rev}-{id}``                  every order
``cust-{customerKey}-{rev}-{id}``   the orders of one customer (``customerKey``: a hash)
``cat-{category}-{rev}-{id}``       the orders of one :class:`Category` (``state=`` filter)
``fin-{yyyymmdd}-{id}``             a finished order retention may purge, by finish day
==================================  ==========================================================

Every search is one key-range query, so a page costs about the page, whatever the number of
finished orders. The rows of all, cust and cat carry a summary of the order (its state when the
index was last written), its workflow and failed step included: the ``workflow`` and
``failedStep`` filters read them, no key range of their own (no write more).

Cost: the index is written only when an order's category changes (accepted, and when it
ends, holds, is retried...), never on the forward path's other steps: one transaction of the
search partition per change, in the invocation that made the change, before it returns.
It is written AFTER the state change (a transition that never committed is never indexed),
so a crash in between leaves it stale, and so can two of an order's index writes that
overtake each other (two invocations of different instances). Both are repaired:

* a final category (processed, error) is only ever written by the order's final transition,
  so a final row is true; rows of the changing categories (inFlight, attention) are checked
  against the state row when a search returns them, and repaired then (``shared.api.search``);
* the order's deadline index row is deleted only after its last index write, so a crash
  before it leaves the row, and the Supervisor re-indexes the order from its state when it
  deletes the row (``shared.supervisor``).
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from shared.core.effects import LeaveRoom, Reindex
from shared.core.room import waiter_key
from shared.core.rows import OrderRow, SearchRow, StateRow
from shared.core.states import Category, Mode, OrderCompensation, Outcome

_REV_BASE = 10 ** 17


def rev(created_at: datetime) -> str:
    """Inverted creation time (microseconds, 17 digits): ascending keys are newest first."""
    micros = int(created_at.timestamp() * 1_000_000)
    return f"{_REV_BASE - micros:017d}"


def customer_key(customer_id: str) -> str:
    """A customer id as a key: fixed length, only hex (any character may be in the id)."""
    return hashlib.sha256(customer_id.encode("utf-8")).hexdigest()[:24]


def category_of(state: StateRow) -> Category:
    """The search category of the order in ``state``."""
    if state.mode is Mode.HELD:
        return Category.ATTENTION
    if state.mode is not Mode.FINISHED:
        return Category.IN_FLIGHT
    if state.compensation_state is OrderCompensation.FAILED or state.outcome is Outcome.FAILED:
        return Category.ATTENTION  # a compensation failed for good, or failed and not yet retried
    return Category.PROCESSED if state.outcome is Outcome.PROCESSED else Category.ERROR


def listing_keys(order_id: str, order_rev: str, cust_key: str, category: Category) -> tuple[str, str, str]:
    """The all, cust and cat row keys of an order."""
    return (f"all-{order_rev}-{order_id}", f"cust-{cust_key}-{order_rev}-{order_id}",
            f"cat-{category}-{order_rev}-{order_id}")


def category_key(category: Category, created_at: datetime, order_id: str) -> str:
    return f"cat-{category}-{rev(created_at)}-{order_id}"


def finished_key(finished_at: datetime, order_id: str) -> str:
    return f"fin-{finished_at.strftime('%Y%m%d')}-{order_id}"


def summary(order: OrderRow, state: StateRow, key: str) -> SearchRow:
    """The ``all-``/``cust-``/``cat-`` row ``key`` of the order: what a search result shows."""
    return SearchRow(key, state.order_id, category_of(state), customer_id=order.customer_id,
                     created_at=order.created_at, process_state=state.process_state,
                     failure_count=state.failure_count, priority=order.priority, updated_at=state.updated_at,
                     outcome=state.outcome, workflow=order.workflow, failed_step=state.failed_step,
                     total=order.total, currency=order.currency)


def index_rows(order: OrderRow, state: StateRow) -> list[SearchRow]:
    """Every index row the order in ``state`` has."""
    created, oid = order.created_at, state.order_id
    category = category_of(state)
    rows = [summary(order, state, key)
            for key in listing_keys(oid, rev(created), customer_key(order.customer_id), category)]
    if category.final and state.finished_at is not None:
        rows.append(SearchRow(finished_key(state.finished_at, oid), oid, category, rev=rev(created),
                              customer_key=customer_key(order.customer_id)))
    return rows


def reindex(order: OrderRow | None, old: StateRow | None, new: StateRow) -> list[Reindex | LeaveRoom]:
    """The index write after a change from ``old`` to ``new``: none unless the category changed.
    An order that leaves ``inFlight`` (it ended: processed, failed, cancelled, terminated, or held for
    an operator) also leaves its customer's room, after its index write: :func:`leave_room`."""
    if order is None:
        return []
    before = category_of(old) if old is not None else None
    after = category_of(new)
    if before is after:
        return []
    drop = (category_key(before, order.created_at, new.order_id),) if before is not None else ()
    leave = leave_room(order, new) if before is Category.IN_FLIGHT else []
    return [Reindex(new.order_id, tuple(index_rows(order, new)), drop), *leave]


def leave_room(order: OrderRow, state: StateRow) -> list[LeaveRoom]:
    """An order out of ``inFlight`` with a room (``shared.core.room``) gives its slot back, or its
    place among the waiters. Crash before it: the order's deadline row is kept (its delete comes
    after), and the Supervisor leaves for it when that row falls due; the room's watch, if the room
    has waiters, frees the slot of an ended order too."""
    if state.room is None or category_of(state) is Category.IN_FLIGHT:
        return []
    waited = waiter_key(order.created_at, state.order_id) if state.waiting_room else None
    return [LeaveRoom(state.room, state.order_id, waited, state.updated_at)]
