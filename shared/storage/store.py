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
``yyyyMMddHHmm`` (UTC), RowKey = ``orderId:due``, properties OrderId, Due. A row's Due is never
later than its order's CompleteBy; the submission writes it BEFORE its transaction, the forward
path never touches it, the last transition deletes it (best effort) and the sweep moves it
later when the order is slower than that. A sweep reads only buckets that are due:
``PartitionKey le @bucket``.
It also holds a breaker's *watch* while the Supervisor may owe that breaker anything: RowKey
``breaker:{remote}:{opening}:{due}``, property Due, no OrderId (``shared.core.breaker.watch``).

OrderIndexTable (setting ``OrderIndexTable``): the search index, one partition ``orders``,
key ranges by purpose (``shared.core.statemachine.search_index``): ``all-``, ``cust-``, ``cat-``
(newest first) and ``fin-`` (finished orders by finish day, for retention). Its partition
``stats`` holds the console's per-process figures by minute and hour (``shared.observability.figures``).

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

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from shared.core.rows import Entity, EventRow, IndexRow, Op, SearchRow
from shared.observability.figures import Figures

INDEX_PARTITION = "orders"  # the one partition of the search index (OrderIndexTable)
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


class SearchIndex(Protocol):
    """OrderIndexTable's partition ``orders``: the search index."""

    def write_index(self, puts: Sequence[SearchRow], deletes: Sequence[str], *,
                    stale: Sequence[str] = ()) -> None:
        """Upsert ``puts`` and delete ``deletes`` (RowKeys) in the search index (a missing row is
        fine), committed when it returns. ``stale``: rows that may well not be there, deleted one
        by one apart from the rest."""
    def query_index(self, low: str, high: str, limit: int) -> list[SearchRow]:
        """Search index rows with ``low <= RowKey < high``, ascending, at most ``limit``."""
    def count_index(self, low: str, high: str, cap: int) -> tuple[int, bool]:
        """(rows with ``low <= RowKey < high`` counted up to ``cap``, whether there may be more):
        ONE request, RowKeys only."""


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


def check_entity(row: Entity) -> None:
    """Raise ``TooLarge`` if ``row`` breaks Table Storage's entity limits."""
    props = clean(row)
    if len(props) > MAX_PROPERTIES:
        raise TooLarge(f"{len(props)} properties")
    for k, v in props.items():
        if isinstance(v, str) and len(v.encode("utf-16-le")) > MAX_STRING_BYTES:
            raise TooLarge(f"property {k} is larger than 64 KiB")


