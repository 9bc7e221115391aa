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
per order in flight (``shared.statemachine``, "The deadline index"). PartitionKey = due minute
``yyyyMMddHHmm`` (UTC), RowKey = ``orderId:due``, properties OrderId, Due. A row's Due is never
later than its order's CompleteBy; the submission writes it BEFORE its transaction, the forward
path never touches it, the last transition deletes it (best effort) and the sweep moves it
later when the order is slower than that. A sweep reads only buckets that are due:
``PartitionKey le @bucket``.
It also holds a breaker's *watch* while the Supervisor may owe that breaker anything: RowKey
``breaker:{remote}:{opening}:{due}``, property Due, no OrderId (``shared.breaker.watch``).

OrderIndexTable (setting ``OrderIndexTable``): the search index, one partition ``orders``,
key ranges by purpose (``shared.statemachine.search_index``): ``all-``, ``cust-``, ``cat-``
(newest first) and ``fin-`` (finished orders by finish day, for retention). Its partition
``stats`` holds the console's per-process figures by minute and hour (``shared.console_stats``).

The state row's ``IndexDue`` names the row the order's own writes put (so that the last
transition can delete it).

Times are stored as ISO-8601 UTC strings with microseconds (they sort as text), money as
decimal strings, absent values as absent properties (REPLACE writes the full entity).

Concurrency: every update is a REPLACE conditioned on the ETag read
(``MatchConditions.IfNotModified``); a 412 (or a 409 on create) is a lost race and surfaces as
:class:`Conflict`. Multi-row writes are one entity-group transaction (same PartitionKey, atomic).

This module: the ``Store`` protocol, ``Op``, the limits and ``MemoryStore``; the Table Storage
store is ``shared.table_store.TableStore`` (its tables: ``shared.tables``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from shared.console_stats import ConsoleStats

ETAG = "_etag"

ORDER_ROW = "order"
STATE_ROW = "state"


HISTORY_PREFIX = "history-"
# The forward path reads an order's partition from here on: ``order``, ``state``, ``step-*``;
# its history rows (``history-*``) sort before it and are read only to show them.
LIVE_ROWS_FROM = ORDER_ROW


def step_row_key(index: int, name: str) -> str:
    return f"step-{index:02d}-{name}"


def history_row_key(seq: int) -> str:
    return f"{HISTORY_PREFIX}{seq:08d}"


INDEX_PARTITION = "orders"  # the one partition of the search index (OrderIndexTable)
STATS_PARTITION = "stats"  # the console's per-process figures (OrderIndexTable, ``shared.console_stats``)
HISTORY_END = "history."  # the first key after every history row ('.' follows '-')


class Conflict(Exception):
    """A conditional write lost: the row changed (412) or already exists (409)."""


class TooLarge(Exception):
    """An entity or transaction exceeds Table Storage limits."""


@dataclass(frozen=True)
class Op:
    """One write of a transaction. ``row`` holds RowKey and properties (no PartitionKey)."""

    kind: Literal["create", "replace", "delete"]
    row: dict[str, Any]
    etag: str | None = None  # required for replace/delete: the ETag the decision was made on

    @property
    def row_key(self) -> str:
        return str(self.row["RowKey"])


def clean(row: dict[str, Any]) -> dict[str, Any]:
    """Properties to write: no metadata, no None (absent = null)."""
    return {k: v for k, v in row.items() if not k.startswith("_") and v is not None and k != "PartitionKey"}


class Store(Protocol):
    def read_partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        """The order's live rows (``order``, ``state``, ``step-*``): never its history."""
    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None: ...
    def read_rows(self, partition: str, limit: int) -> dict[str, dict[str, Any]]:
        """Up to ``limit`` rows of ``partition`` (every RowKey, each with its ETag), by RowKey: ONE
        query (``shared.breaker.store.read_breakers``: every breaker an agent instance holds)."""
    def read_history(self, order_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` history rows after event ``after``, oldest first."""
    def partition_keys(self, order_id: str, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` (RowKey, ETag) of every row of the order (retention)."""
    def transact(self, order_id: str, ops: Sequence[Op]) -> dict[str, str]:
        """All of ``ops`` or none (``Conflict``): the new ETag of each created/replaced row
        (RowKey -> ETag); a row whose ETag the service did not return is left out."""
    def put_index(self, bucket: str, row_key: str, props: dict[str, Any]) -> None: ...
    def delete_index(self, bucket: str, row_key: str) -> None: ...
    def due_index(self, bucket: str, limit: int) -> list[dict[str, Any]]: ...
    def write_index(self, puts: Sequence[dict[str, Any]], deletes: Sequence[str], *,
                    stale: Sequence[str] = ()) -> None:
        """Upsert ``puts`` and delete ``deletes`` (RowKeys) in the search index (a missing row is
        fine), committed when it returns. ``stale``: rows that may well not be there, deleted one
        by one apart from the rest."""
    def query_index(self, low: str, high: str, limit: int) -> list[dict[str, Any]]:
        """Search index rows with ``low <= RowKey < high``, ascending, at most ``limit``."""
    def count_index(self, low: str, high: str, cap: int) -> tuple[int, bool]:
        """(rows with ``low <= RowKey < high`` counted up to ``cap``, whether there may be more):
        ONE request, RowKeys only."""
    def put_stats(self, rows: Sequence[dict[str, Any]]) -> None:
        """Upsert (replace) stats rows (RowKey + properties, at most 100) in ONE transaction."""
    def query_stats(self, low: str, high: str, limit: int) -> list[dict[str, Any]]:
        """Stats rows with ``low <= RowKey < high``, ascending, at most ``limit``."""
    def delete_stats(self, row_keys: Sequence[str]) -> None:
        """Delete stats rows (at most 100; a missing row is fine)."""


# ---------------------------------------------------------------------------------------------
# Limits shared by both implementations (Table Storage documented limits)
MAX_BATCH_OPS = 100
MAX_STRING_BYTES = 64 * 1024  # a String property is at most 64 KiB (UTF-16)
MAX_PROPERTIES = 252


def check_entity(row: dict[str, Any]) -> None:
    """Raise ``TooLarge`` if ``row`` breaks Table Storage's entity limits."""
    props = clean(row)
    if len(props) > MAX_PROPERTIES:
        raise TooLarge(f"{len(props)} properties")
    for k, v in props.items():
        if isinstance(v, str) and len(v.encode("utf-16-le")) > MAX_STRING_BYTES:
            raise TooLarge(f"property {k} is larger than 64 KiB")


# ---------------------------------------------------------------------------------------------
class MemoryStore:
    """In-memory store with Table Storage's ETag and transaction semantics (for unit tests).

    * create of an existing row -> Conflict; replace/delete with a stale ETag or of a missing
      row -> Conflict; a transaction applies all of its ops or none; at most 100 ops, one op
      per row, string properties at most 64 KiB.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, str], tuple[dict[str, Any], str]] = {}
        self._etags = itertools.count(1)
        self.writes = 0  # number of successful write requests (tests of cost)
        self.reads: list[tuple[str, str]] = []  # (table, partition) of every read
        self.stats: ConsoleStats | None = None  # no console figures unless a test sets a recorder

    def _etag(self) -> str:
        return f'W/"{next(self._etags)}"'

    # state table ------------------------------------------------------------------------------
    def _partition(self, order_id: str, low: str, high: str) -> dict[str, dict[str, Any]]:
        return {rk: {**props, "PartitionKey": pk, "RowKey": rk, ETAG: etag}
                for (t, pk, rk), (props, etag) in sorted(self._rows.items())
                if t == "state" and pk == order_id and low <= rk < high}

    def read_partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        with self._lock:
            self.reads.append(("state", order_id))
            return self._partition(order_id, LIVE_ROWS_FROM, "\uffff")

    def peek_partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        """The live rows as ``read_partition`` returns them, not counted in ``reads`` (tests' checks)."""
        with self._lock:
            return self._partition(order_id, LIVE_ROWS_FROM, "\uffff")

    def read_history(self, order_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            self.reads.append(("history", order_id))
            rows = self._partition(order_id, history_row_key(after + 1), HISTORY_END)
            return list(rows.values())[:limit]

    def partition_keys(self, order_id: str, limit: int) -> list[tuple[str, str]]:
        with self._lock:
            self.reads.append(("state", order_id))
            return [(rk, e[ETAG]) for rk, e in self._partition(order_id, "", "\uffff").items()][:limit]

    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None:
        with self._lock:
            self.reads.append(("state", order_id))
            hit = self._rows.get(("state", order_id, row_key))
            if hit is None:
                return None
            props, etag = hit
            return {**props, "PartitionKey": order_id, "RowKey": row_key, ETAG: etag}

    def read_rows(self, partition: str, limit: int) -> dict[str, dict[str, Any]]:
        with self._lock:
            self.reads.append(("state", partition))
            return dict(itertools.islice(self._partition(partition, "", "\uffff").items(), limit))

    def transact(self, order_id: str, ops: Sequence[Op]) -> dict[str, str]:
        if not ops:
            return {}
        if len(ops) > MAX_BATCH_OPS:
            raise TooLarge(f"{len(ops)} operations in one transaction")
        keys = [op.row_key for op in ops]
        if len(set(keys)) != len(keys):
            raise ValueError("a transaction may touch each row once")
        for op in ops:
            if op.kind != "delete":
                check_entity(op.row)
        with self._lock:
            for op in ops:  # validate everything first: all or nothing
                cur = self._rows.get(("state", order_id, op.row_key))
                if op.kind == "create":
                    if cur is not None:
                        raise Conflict(f"{op.row_key} already exists")
                else:
                    if cur is None:
                        raise Conflict(f"{op.row_key} does not exist")
                    if op.etag is None:
                        raise ValueError("replace/delete need the ETag they were decided on")
                    if op.etag != "*" and op.etag != cur[1]:
                        raise Conflict(f"{op.row_key} was modified")
            etags: dict[str, str] = {}
            for op in ops:
                key = ("state", order_id, op.row_key)
                if op.kind == "delete":
                    del self._rows[key]
                else:
                    props = clean(op.row)
                    props["RowKey"] = op.row_key
                    etags[op.row_key] = self._etag()
                    self._rows[key] = (props, etags[op.row_key])
            self.writes += 1
            return etags

    # deadline index ---------------------------------------------------------------------------
    def put_index(self, bucket: str, row_key: str, props: dict[str, Any]) -> None:
        with self._lock:
            self._rows[("deadline", bucket, row_key)] = ({**clean(props), "RowKey": row_key}, self._etag())
            self.writes += 1

    def delete_index(self, bucket: str, row_key: str) -> None:
        with self._lock:
            self._rows.pop(("deadline", bucket, row_key), None)
            self.writes += 1

    def due_index(self, bucket: str, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            self.reads.append(("deadline", bucket))
            rows = sorted(((pk, rk), props) for (t, pk, rk), (props, _e) in self._rows.items()
                          if t == "deadline" and pk <= bucket)
            return [{**props, "PartitionKey": pk, "RowKey": rk} for (pk, rk), props in rows[:limit]]

    # search index -------------------------------------------------------------------------------
    def write_index(self, puts: Sequence[dict[str, Any]], deletes: Sequence[str], *,
                    stale: Sequence[str] = ()) -> None:
        deletes = [*deletes, *stale]
        with self._lock:
            for row in puts:
                self._rows[("search", INDEX_PARTITION, str(row["RowKey"]))] = (clean(row), self._etag())
            for rk in deletes:
                self._rows.pop(("search", INDEX_PARTITION, rk), None)
            self.writes += 1

    def query_index(self, low: str, high: str, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            self.reads.append(("search", low))
            rows = sorted((rk, props) for (t, _pk, rk), (props, _e) in self._rows.items()
                          if t == "search" and low <= rk < high)
            return [{**props, "RowKey": rk} for rk, props in rows[:limit]]

    def count_index(self, low: str, high: str, cap: int) -> tuple[int, bool]:
        with self._lock:
            self.reads.append(("search", low))
            n = sum(1 for (t, _pk, rk) in self._rows if t == "search" and low <= rk < high)
            return min(n, cap), n > cap

    # console stats (partition ``stats``) ------------------------------------------------------
    def put_stats(self, rows: Sequence[dict[str, Any]]) -> None:
        if len(rows) > MAX_BATCH_OPS:
            raise TooLarge(f"{len(rows)} operations in one transaction")
        for row in rows:
            check_entity(row)
        with self._lock:
            for row in rows:
                self._rows[("stats", STATS_PARTITION, str(row["RowKey"]))] = (clean(row), self._etag())
            self.writes += 1

    def query_stats(self, low: str, high: str, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            self.reads.append(("stats", low))
            rows = sorted((rk, props) for (t, _pk, rk), (props, _e) in self._rows.items()
                          if t == "stats" and low <= rk < high)
            return [{**props, "RowKey": rk} for rk, props in rows[:limit]]

    def delete_stats(self, row_keys: Sequence[str]) -> None:
        with self._lock:
            for rk in row_keys:
                self._rows.pop(("stats", STATS_PARTITION, rk), None)
            self.writes += 1

    def index_rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**props, "PartitionKey": pk} for (t, pk, _rk), (props, _e) in sorted(self._rows.items())
                    if t == "deadline"]

    def snapshot(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        with self._lock:
            return {k: dict(v[0]) for k, v in self._rows.items()}
