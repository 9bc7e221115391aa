"""Rewrite an order's search index rows from its state: the one repair of the index.

An index write follows its state change (``Reindex``, best effort, in the same invocation), so it
can be lost with a dying worker, or overtaken by an earlier write. Three places notice and call this:
the Supervisor (an ended order whose deadline row is still there), a search (a result whose row
is of another category than its state), and retention (a purge that found the order still
there). The rows the state implies are put, and the order's rows of the other changing
categories (inFlight, attention) are deleted: the row a search ``listed`` it under is known to
be there and is deleted with the puts; the others may well not be, so they are deleted one by
one, apart from other orders' writes.
"""

from __future__ import annotations

from shared.core.effects import Reindex
from shared.core.statemachine import Category, category_of, index_rows
from shared.core.statemachine.search_index import category_key, leave_room
from shared.runtime import Runtime
from shared.storage.views import read_view

CHANGING = (Category.IN_FLIGHT, Category.ATTENTION)  # the categories an order leaves


def reindex_from_state(rt: Runtime, order_id: str, listed: Category | None = None, *, leave: bool = False) -> bool:
    """Write the order's index rows as its state says (True also when the order is gone);
    False: the write failed. ``leave`` (the Supervisor, on an ended order's deadline row): it
    leaves its customer's room too (``leave_room``)."""
    view = read_view(rt.store, order_id)
    if view.order is None or view.state is None:
        return True
    current = category_of(view.state)
    rows = tuple(index_rows(view.order, view.state))
    others = [category_key(c, view.order.created_at, order_id) for c in CHANGING if c is not current]
    known = category_key(listed, view.order.created_at, order_id) if listed is not None else None
    deletes = tuple(k for k in others if k == known)
    stale = tuple(k for k in others if k != known)
    # an ended order leaves its customer's room again (a copy changes nothing): the crash may have
    # been between its index write and that
    to_leave = leave_room(view.order, view.state) if leave else []
    return not rt.run([Reindex(order_id, rows, deletes, stale), *to_leave]).index_failed
