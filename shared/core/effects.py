"""The effects the pure core asks for: what a decision wants done, in order, as data.

The core (``shared.core.statemachine``) never touches a store or a bus: each ``decide_*``
returns a list of these. ``shared.runtime.executor`` performs them one by one and stops at the
first lost race. Running only the first ``k`` effects is exactly what a crash after effect ``k``
leaves behind; the unit tests do that for every ``k`` and then replay the message or run the
Supervisor to show that the state converges.

One class per kind; ``Effect`` is their union:

* :class:`PutIndex`, :class:`DeleteIndex`: a deadline index row (the Supervisor's cover);
  :class:`PutWatch`: a watch row of that index (a webhook delivery's).
* :class:`Transact`: an ETag-conditioned transaction of :class:`Op` on one order's partition.
* :class:`Reindex`: the order's search index rows, after the state write they reflect.
* :class:`ForgetWaiting`: a step's row in its remote's waiting list, once its wait has ended.
* :class:`JoinRoom`, :class:`LeaveRoom`: an order waiting for its customer's room, an order
  leaving it (``shared.core.room``).
* :class:`Send`: a message; :class:`Alert`: an operator alert; :class:`Log`: a log line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.core.messages import OutMessage
from shared.core.rows import IndexRow, Op, SearchRow

# An order's deadline rows of one minute are spread over this many partitions (``{minute}-{shard}``),
# so that the minute's partition is no ceiling: 2,000 entities/s each (Table Storage's target), about
# 2 rows per order (a put and a delete): 994 orders/s in one, about 4,000 in four.
DEADLINE_SHARDS = 4


def bucket_of(due: datetime) -> str:
    """A watch's deadline index partition: the due minute, UTC, ``yyyyMMddHHmm``."""
    return due.strftime("%Y%m%d%H%M")


def order_bucket(due: datetime, order_id: str) -> str:
    """An order's deadline index partition: the due minute and a shard by a hash of the order id,
    ``yyyyMMddHHmm-N``. It sorts after the minute's own partition and before the next minute's."""
    shard = int.from_bytes(hashlib.sha256(order_id.encode("utf-8")).digest()[:4], "big") % DEADLINE_SHARDS
    return f"{bucket_of(due)}-{shard}"


def due_bound(now: datetime) -> str:
    """The highest partition a sweep at ``now`` reads (``PartitionKey le``): every partition of the
    minutes up to now's, sharded (``order_bucket``) or not (``bucket_of``, a watch's or an order's row
    written before the shards)."""
    return f"{bucket_of(now)}~"


def index_row_key(order_id: str, due: datetime) -> str:
    """``orderId:due``. The due instant is part of the key, so that a new row of the same order
    (a later deadline, moved or put by another writer) never shares a key with an older one:
    deleting the old row can never delete the new one."""
    return f"{order_id}:{due.strftime('%Y%m%dT%H%M%S%f')}"


@dataclass(frozen=True)
class PutIndex:
    """Upsert a deadline index row (one per order, see ``shared.core.statemachine``: "The deadline
    index"). Always written BEFORE the state write whose deadline it must cover."""

    order_id: str
    due: datetime
    note: str = ""

    @property
    def bucket(self) -> str:
        return order_bucket(self.due, self.order_id)

    @property
    def row_key(self) -> str:
        return index_row_key(self.order_id, self.due)

    @property
    def row(self) -> IndexRow:
        return IndexRow(self.bucket, self.row_key, self.order_id, self.due)


@dataclass(frozen=True)
class PutWatch:
    """Upsert a deadline index row that is not an order's deadline: a watch the Supervisor acts on
    when it falls due (a webhook delivery's, ``shared.core.webhooks``). Written BEFORE the write it covers."""

    row: IndexRow
    note: str = ""


@dataclass(frozen=True)
class DeleteIndex:
    """Best-effort delete of an index row the order no longer needs (the sweep also deletes lazily)."""

    bucket: str
    row_key: str


@dataclass(frozen=True)
class Transact:
    """An ETag-conditioned entity-group transaction on one order's partition."""

    order_id: str
    ops: tuple[Op, ...]
    note: str = ""  # the crash point this write is safe against (for humans and logs)


@dataclass(frozen=True)
class Reindex:
    """Write the order's search index rows (``shared.core.statemachine.search_index``): upsert
    ``puts``, delete ``deletes``. After the state write it reflects, in the same invocation; a
    failure keeps the order's deadline row (the ``DeleteIndex`` after it is skipped), so the
    Supervisor re-indexes the order when that row falls due."""

    order_id: str
    puts: tuple[SearchRow, ...]
    deletes: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()  # rows that may not be there: deleted one by one, apart from the rest


@dataclass(frozen=True)
class ForgetWaiting:
    """Delete a step's row (``row_key``, see ``shared.core.breaker.waiting``) from the list of the
    steps waiting on ``remote``, after the state write that ended its wait (or found the row
    stale). Best effort: a row left behind only costs the closer a resume that is stale."""

    remote: str
    row_key: str


@dataclass(frozen=True)
class JoinRoom:
    """Put the order in its customer's room's queue of waiters (``shared.core.room``), after the
    state write that says it waits: the room's watch row first (the Supervisor's cover while the
    room has waiters), then the waiter row (a copy finds it there), then, if a slot is free by
    now and it is among the oldest, its admission. A failure keeps the order's deadline row (the
    ``DeleteIndex`` after it is skipped): the Supervisor joins it when that row falls due."""

    partition: str
    order_id: str
    row_key: str  # the waiter's (``waiter_key``: submission order)
    queue: str  # the scheduler queue of the order's lane, where its admission goes
    cap: int  # CustomerMaxInFlight as the decision saw it (a room row never written has none)
    at: datetime  # the decision's time: the watch's due time is reckoned from it
    traceparent: str | None = None


@dataclass(frozen=True)
class LeaveRoom:
    """Give the order's slot in its customer's room back (and drop its waiter row if it waited), and
    admit the oldest waiters into the free slots, after the state write that ended the order. A
    failure keeps the order's deadline row: the Supervisor leaves when that row falls due (and
    the room's watch frees slots of ended orders)."""

    partition: str
    order_id: str
    row_key: str | None  # its waiter row, if it was waiting still (deleted if there)
    at: datetime | None  # the decision's time (an admitted waiter's slot is from then)


@dataclass(frozen=True)
class Send:
    """A message to send. ``critical``: a failure raises (the trigger's message is redelivered);
    otherwise it is logged and the rest goes on."""

    message: OutMessage
    critical: bool = True
    what: str = ""
    # An agent request's fencing token rows (RowKey -> entity, its ETag under ``ETAG``): the
    # order's live rows as they are after this decision's transaction. The executor replaces the
    # rows that transaction wrote with what it wrote and their new ETags (``shared.core.fence``).
    fence: Mapping[str, Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class Alert:
    """Operator alert: a message to the alerts queue AND an error-level JSON log line."""

    message: OutMessage
    order_id: str
    step: str | None
    reason: str
    failure_count: int
    traceparent: str | None = None


@dataclass(frozen=True)
class Log:
    """A structured log line (``shared.observability.logs``)."""

    level: int
    event: str
    order_id: str | None = None
    traceparent: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


Effect = (PutIndex | PutWatch | DeleteIndex | Transact | Reindex | ForgetWaiting | JoinRoom | LeaveRoom | Send | Alert
          | Log)


