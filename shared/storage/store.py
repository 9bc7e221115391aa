"""The state store: Azure Table Storage, and an in-memory twin with the same semantics.

Table layout
------------
StateTable (setting ``StateTable``), PartitionKey = orderId (32 hex chars), so that every
row of an order can be written in ONE entity-group transaction:

* RowKey ``order``  - the accepted order: CustomerId, Currency, Items (JSON, decimal strings),
  Total (decimal string), Priority, StatusQueue, BodyHash, IdempotencyKey, Traceparent,
  Workflow + WorkflowVersion (what it runs; absent: order v1), CreatedAt. Written once, never updated.
* RowKey ``state``  - the order-level state row: OrderID, ProcessState (Pending | Processing |
  Processed | Error), LockedBy, ClaimToken, CompleteBy, FailureCount, Mode (forward |
  compensate | held | finished), Outcome, StepIndex/StepName/Attempt of the current step,
  CompIndex/CompFailureCount of the current compensation, LeaseKey (what is in flight:
  ``unclaimed``, ``STEP:ATTEMPT``, ``STEP:compensate:ATTEMPT`` or empty), ScheduleSeq,
  ClaimedSeq, FailedStep, Reason, CompensationState, UpdatedAt.
* RowKey ``step-NN-NAME`` - one per workflow step: Name, Index, State (Pending | Running |
  Done | Failed), Attempt, CompleteBy, StartedAt, FinishedAt, Result (JSON), FailureReason,
  Compensation ('' | Pending | Running | Done | Failed), CompensationAttempt,
  CompensationCompleteBy, CompensationStartedAt, CompensationFinishedAt, CompensationResult,
  CompensationReason.
* RowKey ``history-NNNNNNNN`` - the order's history, one immutable event per row (Seq, At,
  Event, Step, Attempt, Detail (JSON), Instance, TraceId), created in the same transaction as
  the state change it records (the state row's ``EventSeq`` is the last one). These keys sort
  before ``order``: the forward path reads ``RowKey ge 'order'`` and never reads history.

DeadlineTable (setting ``DeadlineTable``): the Supervisor's index of deadlines, about ONE row
per order in flight (``shared.core.statemachine``, "The deadline index"). PartitionKey = due minute
``yyyyMMddHHmm`` (UTC) and a shard by a hash of the order id, ``-0`` .. ``-3``
(``shared.core.effects.order_bucket``: a minute is four partitions' write ceiling, not one's),
RowKey = ``orderId:due``, properties OrderId, Due. A row's Due is never
later than its order's CompleteBy; the submission writes it BEFORE its transaction, the forward
path never touches it, the last transition deletes it (best effort) and the sweep moves it
later when the order is slower than that. A sweep reads only buckets that are due:
``PartitionKey le @bucket``, ``@bucket`` the current minute followed by ``~`` (``due_bound``): every
shard of every minute up to now's, and the rows of the minute itself (watches, and rows from
before the shards).
It also holds a breaker's *watch* while the Supervisor may owe that breaker anything: RowKey
``breaker:{remote}:{opening}:{due}``, property Due, no OrderId (``shared.core.breaker.watch``).

OrderIndexTable (setting ``OrderIndexTable``): the search index, key ranges by purpose
(``shared.core.statemachine.search_index``): ``all-``, ``cust-``, ``cat-`` (newest first) and
``fin-`` (finished orders by finish day, for retention). In one partition ``orders``, or in S shards
(the store's ``shards``, ``SEARCH_SHARDS`` by default): partitions ``orders-0`` .. ``orders-{S-1}``, a
row in the shard of its key's last part (the order id: every row of an order in one shard, so an
order's index write is still one transaction). A range read merges the partitions by RowKey (the
keys are unique across shards, so the merge is the one partition's order and a continuation token is
still one key), reading each a little at a time (:func:`merge_lazily`): first its share of the page
and a margin, in parallel, then more only from a partition that may still hold a row of the page.
Price: a page of 50 is S + 1 queries (the shards and the legacy partition) returning about
51 + S x ``SHARE_MARGIN`` rows (a hash spreads an order's rows evenly; a second round for a shard
that drew more than its share), instead of one query of 51; the index's write ceiling is S
partitions' (2,000 entities/s each) instead of one's. Beside shards, ``orders`` (the rows written
before them) is read as one more shard, its rows marked ``legacy`` (a search checks them against
their state row: their deletes go to the shards now), until retention has moved them
(``shared.supervisor.retention``). The partition ``stats`` holds the console's per-process figures
by minute and hour (``shared.observability.figures``).

The state row's ``IndexDue`` names the row the order's own writes put (so that the last
transition can delete it).

Times are stored as ISO-8601 UTC strings with microseconds (they sort as text), money as
decimal strings, absent values as absent properties (REPLACE writes the full entity).

Concurrency: every update is a REPLACE conditioned on the ETag read
(``MatchConditions.IfNotModified``); a 412 (or a 409 on create, a 404 on a replace or delete of
a row gone) is a lost race and surfaces as :class:`Conflict`. Multi-row writes are one
entity-group transaction (same PartitionKey, atomic).

This module: the ``Store`` protocol, its errors and the limits; the in-memory twin is
``shared.storage.memory.MemoryStore``, the Table Storage store ``shared.storage.table_store.TableStore``
(its tables: ``shared.storage.tables``). The row keys are the core's (``shared.core.rows``).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from shared.core.rows import Entity, EventRow, IndexRow, Op, SearchRow
from shared.observability.figures import Figures

W = TypeVar("W")  # a write of one table interface or the other (Op, tables.Write)

INDEX_PARTITION = "orders"  # the search index unsharded (one shard), and the legacy partition beside shards
# The search index's shards: ``orders-0`` .. ``orders-7``, 8 partitions' write ceiling (about 2,000
# orders/s, not 250); a page of 50 is 9 queries of about 85 rows in all (``merge_lazily``). 1 would keep
# the one partition ``orders``. Set it once: a shard is a hash of the key modulo S, so another S moves rows.
SEARCH_SHARDS = 8
SHARE_MARGIN = 3  # rows read from each partition beyond its share of a page (``merge_lazily``)
STATS_PARTITION = "stats"  # the console's per-process figures (OrderIndexTable, ``shared.observability.figures``)


class Conflict(Exception):
    """A conditional write lost: the row changed (412), already exists (409) or is gone (404)."""


class TooLarge(Exception):
    """An entity or transaction exceeds Table Storage limits."""


def clean(row: Mapping[str, Any]) -> Entity:
    """Properties to write: no metadata, no None (absent = null)."""
    return {k: v for k, v in row.items() if not k.startswith("_") and v is not None and k != "PartitionKey"}


class StateTable(Protocol):
    """StateTable: a partition per order (its live rows and its history), and the circuit
    breakers' partitions (``breakers``, ``waiting-{remote}``)."""

    def read_partition(self, order_id: str) -> dict[str, Entity]:
        """The order's live rows (``order``, ``state``, ``step-*``): never its history."""
    def read_row(self, partition: str, row_key: str) -> Entity | None: ...
    def read_rows(self, partition: str, limit: int) -> dict[str, Entity]:
        """Up to ``limit`` rows of ``partition`` (every RowKey, each with its ETag), by RowKey: ONE
        query (``shared.storage.breakers.read_breakers``: every breaker an agent instance holds)."""
    def read_history(self, order_id: str, after: int, limit: int) -> list[EventRow]:
        """Up to ``limit`` history events after event ``after``, oldest first."""
    def read_range(self, partition: str, low: str, high: str, limit: int) -> dict[str, Entity]:
        """Up to ``limit`` rows of ``partition`` whose RowKey is in ``[low, high)``, by RowKey: ONE
        query (an order's webhook deliveries, ``hook-*``, which sort apart from its live rows)."""
    def partition_keys(self, partition: str, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` (RowKey, ETag) of every row of the partition (retention, waiting steps)."""
    def transact(self, partition: str, ops: Sequence[Op]) -> dict[str, str]:
        """All of ``ops`` or none (``Conflict``): the new ETag of each created/replaced row
        (RowKey -> ETag); a row whose ETag the service did not return is left out."""


class DeadlineIndex(Protocol):
    """DeadlineTable: the Supervisor's index of deadlines, a partition per due minute."""

    def put_index(self, row: IndexRow) -> None: ...
    def delete_index(self, bucket: str, row_key: str) -> None:
        """Delete a row (a row already gone is fine)."""
    def due_index(self, bucket: str, limit: int) -> list[IndexRow]:
        """Up to ``limit`` rows of the buckets up to ``bucket``: ONE query."""


def index_partitions(shards: int) -> tuple[str, ...]:
    """The partitions a range read of the search index queries: ``orders`` alone (one shard), or the
    shards and ``orders`` last (legacy: the rows from before the shards, until retention moves them)."""
    return (INDEX_PARTITION,) if shards <= 1 else (*(f"orders-{n}" for n in range(shards)), INDEX_PARTITION)


def shard_of(row_key: str, shards: int) -> str:
    """The partition of a search index row: a hash of its key's last part (the order id), so every row
    of an order is in one shard."""
    if shards <= 1:
        return INDEX_PARTITION
    digest = hashlib.sha256(row_key.rsplit("-", 1)[-1].encode("utf-8")).digest()
    return f"orders-{int.from_bytes(digest[:4], 'big') % shards}"


def merge_shards(pages: Sequence[Sequence[SearchRow]], limit: int) -> list[SearchRow]:
    """The first ``limit`` rows of the partitions' pages (``index_partitions`` order, each ascending),
    ascending. With shards, the last page is the legacy partition's: a key in a shard and there
    once (the shard's), a row from there marked ``legacy``."""
    legacy = len(pages) - 1 if len(pages) > 1 else -1
    tagged = [[(r.row_key, i, r) for r in page] for i, page in enumerate(pages)]
    out: list[SearchRow] = []
    for key, i, row in heapq.merge(*tagged, key=lambda t: (t[0], t[1])):
        if out and out[-1].row_key == key:
            continue
        out.append(replace(row, legacy=True) if i == legacy else row)
        if len(out) == limit:
            break
    return out


@dataclass(frozen=True)
class Ask:
    """One query of a range read: up to ``limit`` rows of ``partition`` with a RowKey after ``after``
    (None: from the range's start)."""

    partition: str
    after: str | None
    limit: int


def first_share(limit: int, partitions: int) -> int:
    """What a range read first asks of each partition: all of ``limit`` from one, else a shard's share
    (the legacy partition beside them not counted) and ``SHARE_MARGIN``."""
    return limit if partitions <= 1 else min(limit, -(-limit // (partitions - 1)) + SHARE_MARGIN)


def merge_lazily(read: Callable[[Sequence[Ask]], list[list[SearchRow]]], partitions: Sequence[str],
                 limit: int) -> list[SearchRow]:
    """The first ``limit`` rows over ``partitions`` (``index_partitions`` order), ascending, as
    ``merge_shards`` gives them, reading each partition a little at a time. ``read`` runs one round's
    asks (in parallel, in the Table Storage store) and gives each its rows, ascending.

    First round: every partition, ``first_share`` rows. The merge is exact up to the lowest last row
    of a partition that may hold more (one whose page came back full): its unread rows all sort after
    it. So while a partition that may hold more ends before the page's last row, it is asked again,
    from its last row on, for as many rows as the page has after that row (at most that many of its
    unread rows can be in the page); the others are left alone. Every round reads at least one row
    or closes a partition, so it ends."""
    got: dict[str, list[SearchRow]] = {pk: [] for pk in partitions}
    asks = [Ask(pk, None, first_share(limit, len(partitions))) for pk in partitions]
    may_hold_more: set[str] = set()
    while True:
        for ask, page in zip(asks, read(asks), strict=True):
            got[ask.partition] += page
            if len(page) >= ask.limit:
                may_hold_more.add(ask.partition)
            else:
                may_hold_more.discard(ask.partition)
        merged = merge_shards([got[pk] for pk in partitions], limit)
        edge = merged[-1].row_key if len(merged) == limit else None
        asks = []
        for pk in partitions:
            last = got[pk][-1].row_key if got[pk] else None
            if pk in may_hold_more and last is not None and (edge is None or last < edge):
                # at most this many of its unread rows can still be in the page: the rows after ``last``
                asks.append(Ask(pk, last, limit - sum(1 for row in merged if row.row_key <= last)))
        if not asks:
            return merged


class SearchIndex(Protocol):
    """OrderIndexTable's partition ``orders``, or its shards (``index_partitions``): the search index."""

    shards: int  # 1: the one partition ``orders``; S > 1: ``orders-0`` .. ``orders-{S-1}`` (and ``orders``, legacy)

    def write_index(self, puts: Sequence[SearchRow], deletes: Sequence[str], *,
                    stale: Sequence[str] = ()) -> None:
        """Upsert ``puts`` and delete ``deletes`` (RowKeys) in the search index (a missing row is
        fine), committed when it returns: one transaction per shard (an order's rows share one).
        ``stale``: rows that may well not be there, deleted one by one apart from the rest."""
    def query_index(self, low: str, high: str, limit: int) -> list[SearchRow]:
        """Search index rows with ``low <= RowKey < high``, ascending, at most ``limit``, over
        every partition (``index_partitions``; a row of the legacy one marked ``legacy``)."""
    def count_index(self, low: str, high: str, cap: int) -> tuple[int, bool]:
        """(rows with ``low <= RowKey < high`` counted up to ``cap``, whether there may be more):
        ONE request per partition, RowKeys only."""
    def legacy_index(self, limit: int) -> list[SearchRow]:
        """Up to ``limit`` rows of the legacy partition ``orders`` beside the shards, ascending
        (retention moves them); none without shards (``orders`` is then the index itself)."""
    def drop_legacy_index(self, row_keys: Sequence[str]) -> None:
        """Delete rows of the legacy partition (a missing row is fine)."""


class StatsTable(Protocol):
    """OrderIndexTable's partition ``stats``: the console's figures, a row per process and minute or hour."""

    def put_stats(self, rows: Mapping[str, Figures]) -> None:
        """Upsert (replace) rows (RowKey -> figures, at most 100) in ONE transaction."""
    def query_stats(self, low: str, high: str, limit: int) -> dict[str, Figures]:
        """Rows with ``low <= RowKey < high``, ascending, at most ``limit``."""
    def delete_stats(self, row_keys: Sequence[str]) -> None:
        """Delete rows (at most 100; a missing row is fine)."""


class Store(StateTable, DeadlineIndex, SearchIndex, StatsTable, Protocol):
    """Every table the app keeps (``MemoryStore`` and ``TableStore`` implement them all)."""


# ---------------------------------------------------------------------------------------------
# Limits shared by both implementations (Table Storage documented limits)
MAX_BATCH_OPS = 100
MAX_STRING_BYTES = 64 * 1024  # a String property is at most 64 KiB (UTF-16)
MAX_PROPERTIES = 252


def transact_or_each(transact: Callable[[Sequence[W]], object], writes: Sequence[W],
                     each: Callable[[W], None]) -> None:
    """``writes`` in entity-group transactions of at most ``MAX_BATCH_OPS`` (``transact``, one
    partition); a transaction refused with :class:`Conflict` (a row already gone, or written again
    since its ETag was read: the whole transaction fails) is written again one write at a time by
    ``each``, which decides what a Conflict of its own means; a refused transaction of one write
    is not: its Conflict is that write's own. The one way the store writes a set of rows where a
    missing one must not stop the others."""
    for i in range(0, len(writes), MAX_BATCH_OPS):
        chunk = writes[i:i + MAX_BATCH_OPS]
        try:
            transact(chunk)
        except Conflict:
            if len(chunk) > 1:
                for write in chunk:
                    each(write)


def check_entity(row: Entity) -> None:
    """Raise ``TooLarge`` if ``row`` breaks Table Storage's entity limits."""
    props = clean(row)
    if len(props) > MAX_PROPERTIES:
        raise TooLarge(f"{len(props)} properties")
    for k, v in props.items():
        if isinstance(v, str) and len(v.encode("utf-16-le")) > MAX_STRING_BYTES:
            raise TooLarge(f"property {k} is larger than 64 KiB")


