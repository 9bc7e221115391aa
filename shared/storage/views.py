"""Where a handler's view of an order comes from: a read of its partition, or the rows a
request's or reply's fencing token carries (``shared.core.fence``), which save that read.

An agent checks its request on the token's rows while the order's state row keeps the token's
ETag (``current_view``: one point read), and reads the partition otherwise.

A reply is decided on one typed view at a time (``shared.scheduler.handlers``): first its token's
rows, when it carries a token this app issued for this order while the replying attempt held the
lease, then fresh reads. A token's view is *unconfirmed*: it is the order as the request's
dispatch left it, and the order may have moved on since. Its decision is acted on only through a
write conditioned on the token's ETags (a 412 then means: read and decide again).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from shared.core import fence
from shared.core.lease import Lease
from shared.core.messages import ReplyMessage
from shared.core.rows import ETAG, STATE_ROW
from shared.core.sealed import Keys
from shared.core.statemachine import View
from shared.observability.logs import log_event
from shared.storage.store import Store


@dataclass(frozen=True)
class SourcedView:
    view: View
    confirmed: bool  # read from the store just now; False: a token's rows, as its request's write left them


def read_view(store: Store, order_id: str) -> View:
    """The order's live rows (``order``, ``state``, ``step-*``), read in one query, typed."""
    return View.from_entities(store.read_partition(order_id))


def current_view(store: Store, keys: Keys, order_id: str, token: str | None) -> View:
    """The order's live rows as they are now, for an agent's check before its remote call: a
    request's token's rows when the state row still has the token's ETag (any change to the order
    writes its state row, so no other row changed either), found by one point read of that row;
    else (no token, one not issued by this app for this order, or the order moved on since) a read
    of the partition. A point read is Table Storage's cheapest lookup and the same one transaction
    as the query, which the local Azurite answers by scanning every row of the table."""
    try:
        rows = fence.decode(keys, order_id, token) if token is not None else None
    except fence.InvalidFence:
        rows = None
    if rows is None:
        return read_view(store, order_id)
    state = store.read_row(order_id, STATE_ROW)
    if state is not None and state.get(ETAG) == rows[STATE_ROW][ETAG]:
        return View.from_entities(rows)
    return read_view(store, order_id)


def views_for_reply(store: Store, reply: ReplyMessage, *, keys: Keys, reads: int,
                    message_id: str | None) -> Iterator[SourcedView]:
    """The views to decide ``reply`` on, in turn: its token's rows first (no read), then up to
    ``reads`` fresh reads, each made only when the one before did not settle the reply."""
    token_view = token_view_of(keys, reply, message_id)
    if token_view is not None:
        yield SourcedView(token_view, confirmed=False)
    for _ in range(reads):
        yield SourcedView(read_view(store, reply.orderId), confirmed=True)


def token_view_of(keys: Keys, reply: ReplyMessage, message_id: str | None) -> View | None:
    """The rows the reply's token carries, if it is one this app issued (by either of ``keys``)
    for this order and the attempt that replies held the lease when it was written; else None (a
    read decides: a token by a key dropped since is refused as a changed one is)."""
    if reply.fence is None:
        return None
    try:
        view = View.from_entities(fence.decode(keys, reply.orderId, reply.fence))
    except Exception as exc:  # noqa: BLE001 - any token that does not make a view is ignored, never poison
        refused(reply, message_id, str(exc))
        return None
    lease = (Lease.for_step(reply.step, reply.attempt) if reply.kind == "step"
             else Lease.for_compensation(reply.step, reply.attempt))
    if view.state is None or view.order is None or view.state.order_id != reply.orderId or view.state.lease != lease:
        refused(reply, message_id, "not this attempt's lease")
        return None
    return view


def refused(reply: ReplyMessage, message_id: str | None, reason: str) -> None:
    """Log that a reply's token was not used (the reply is decided on a read)."""
    log_event(logging.INFO, "reply.fence_refused", order_id=reply.orderId, step=reply.step,
              attempt=reply.attempt, messageId=message_id, reason=reason)
