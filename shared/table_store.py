"""The state store on Azure Table Storage (azure-data-tables ``TableClient`` per table).

The table layout and the store's semantics are those of ``shared.store`` (``Store``,
``MemoryStore``). Entity-group transactions go through ``shared.table_batch`` (the SDK's public
``submit_transaction``, or its faster path when this SDK allows it); the deadline index is
written through :class:`_IndexWriter` (group-committed puts, deferred batched deletes).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.background import Periodic
from shared.console_stats import ConsoleStats
from shared.group_commit import GroupCommit
from shared.store import (
    ETAG,
    HISTORY_END,
    INDEX_PARTITION,
    LIVE_ROWS_FROM,
    MAX_BATCH_OPS,
    STATS_PARTITION,
    Op,
    TooLarge,
    check_entity,
    clean,
    history_row_key,
)
from shared.table_batch import FastSender, PublicSender, Write, sender_for
from shared.write_behind import WriteBehind

# Seconds between this worker's batches of deadline-row deletes. Rows of ~3 s of finished orders go
# out together (about a third of the requests of a 1 s interval at saturation: one batch per bucket
# per flush). Nothing waits on them: a row deleted late is harmless until it falls due, which is at
# least the index floor after it was put, and a due row of an ended order only costs the sweep that
# finds it a point read before it deletes the row itself.
DELETE_INTERVAL = 3.0


class _IndexWriter:
    """Fewer requests for the deadline index, same guarantees (one per ``TableStore``).

    * ``put``: a group commit (``shared.group_commit``). The rows of one bucket (one
      partition) that threads of this worker put at the same time go out as ONE entity-group
      transaction of upserts; each caller returns only once its row is committed, so "the
      index row is written BEFORE the state write it guards" still holds.
    * ``delete`` (best effort; the sweep deletes lazily anyway): queued and sent every
      ``delete_interval`` seconds, as transactions of up to 100 deletes per bucket, once the
      search index writes queued before it are committed (a delete queued while the search
      queue was being flushed waits for the next round). A delete
      that finds nothing (the sweep was first) fails its transaction: those rows are then
      deleted one by one (404 ignored). A crash loses at most the queued deletes: the sweep
      finds those rows, point-reads their state and deletes them. ``due_index`` flushes the
      queue first, so this worker's own reads never see a row it already deleted.
    """

    def __init__(self, table: Any, send: PublicSender | FastSender, delete_interval: float = DELETE_INTERVAL,
                 search: WriteBehind | None = None) -> None:
        self.table = table
        self.search = search  # the search index's queued writes go out before the deletes that follow them
        self.send = send  # entity-group transactions on ``table``
        self.delete_interval = delete_interval
        self._puts = GroupCommit(table, send)
        self._lock = threading.Lock()
        self._deletes: dict[str, dict[str, int]] = {}  # bucket -> row key -> the search queue's mark then
        self._periodic = Periodic(self.flush, delete_interval, name="index-deletes", event="index.deletes_failed")

    def put(self, entity: dict[str, Any]) -> None:
        """Upsert ``entity``; returns once it is committed."""
        bucket = str(entity["PartitionKey"])
        self._puts.commit(bucket, [Write("upsert", str(entity["RowKey"]), clean(entity))])

    def put_many(self, bucket: str, writes: Sequence[Write]) -> None:
        """Upsert rows of ``bucket`` (at most 100) in one transaction; returns once committed."""
        self._puts.commit(bucket, writes)

    # deferred, batched deletes ----------------------------------------------------------------
    def delete(self, bucket: str, row_key: str) -> None:
        mark = self.search.mark() if self.search is not None else 0
        with self._lock:
            self._deletes.setdefault(bucket, {})[row_key] = mark
        self._periodic.start()  # best effort: the sweep deletes lazily what a crash leaves

    def _ready(self) -> dict[str, list[str]]:
        """The queued deletes whose order's search index writes are committed, taken off the queue."""
        ready: dict[str, list[str]] = {}
        with self._lock:
            for bucket, queued in list(self._deletes.items()):
                keys = [rk for rk, mark in queued.items() if self.search is None or self.search.sent_since(mark)]
                for rk in keys:
                    del queued[rk]
                if not queued:
                    del self._deletes[bucket]
                if keys:
                    ready[bucket] = sorted(keys)
        return ready

    def flush(self) -> None:
        if self.search is not None:
            try:
                self.search.flush()
            except Exception:  # noqa: BLE001 - the deletes wait: a row stays until its order's index is written
                return
        for bucket, rows in self._ready().items():
            delete_now(self.table, self.send, bucket, rows)


def delete_now(table: Any, send: PublicSender | FastSender, bucket: str, row_keys: Sequence[str]) -> None:
    """Delete rows of ``bucket`` in transactions of up to 100 (best effort): a transaction that
    fails (say, one row already deleted by the sweep) is redone one row at a time (404 ignored)."""
    for i in range(0, len(row_keys), MAX_BATCH_OPS):
        chunk = row_keys[i:i + MAX_BATCH_OPS]
        try:
            if len(chunk) == 1:
                table.delete_entity(partition_key=bucket, row_key=chunk[0])  # 404 is ignored
            else:
                send(bucket, [Write("delete", rk) for rk in chunk])
        except Exception:  # noqa: BLE001 - e.g. one row already deleted by the sweep
            for rk in chunk:
                try:
                    table.delete_entity(partition_key=bucket, row_key=rk)
                except Exception:  # noqa: BLE001,S110 - best effort
                    pass


@dataclass
class TableStore:
    """Azure Table Storage (azure-data-tables ``TableClient`` for each table).

    ``batch_index``: the deadline index is written through :class:`_IndexWriter` (group-committed
    puts, deferred batched deletes); off, every put and delete is its own request.
    ``fast_batch``: entity-group transactions take ``shared.table_batch``'s fast path when this
    SDK allows it (``batch_path`` says which one is used); off, always the public one."""

    state: Any  # azure.data.tables.TableClient
    deadlines: Any  # azure.data.tables.TableClient
    search: Any = None  # azure.data.tables.TableClient of OrderIndexTable (None: no search index)
    _select: tuple[str, ...] = field(default=("PartitionKey", "RowKey", "OrderId", "Due"))
    batch_index: bool = True
    fast_batch: bool = True
    _index: _IndexWriter | None = field(default=None, repr=False, compare=False)
    _search: WriteBehind | None = field(default=None, repr=False, compare=False)
    stats: ConsoleStats | None = field(default=None, repr=False, compare=False)  # the console's figures

    def __post_init__(self) -> None:
        self._send = sender_for(self.state, fast=self.fast_batch)
        if self.search is not None:
            self._search_send = sender_for(self.search, fast=self.fast_batch)
            self._search = WriteBehind(GroupCommit(self.search, self._search_send))
            self.stats = ConsoleStats(self.put_stats)  # records from the first committed event on
        self._deadline_send = sender_for(self.deadlines, fast=self.fast_batch)
        if self.batch_index:
            self._index = _IndexWriter(self.deadlines, self._deadline_send, search=self._search)

    @property
    def batch_path(self) -> str:
        """``fast`` or ``public``: how this store's transactions are sent."""
        return self._send.path

    @staticmethod
    def _row(entity: Any) -> dict[str, Any]:
        row = dict(entity)
        row[ETAG] = entity.metadata.get("etag")
        return row

    def read_partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        # parameterised filter: the SDK quotes the value; never string-concatenate input
        entities = self.state.query_entities("PartitionKey eq @pk and RowKey ge @live",
                                             parameters={"pk": order_id, "live": LIVE_ROWS_FROM})
        return {e["RowKey"]: self._row(e) for e in entities}

    def read_history(self, order_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        entities = self.state.query_entities(
            "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high", results_per_page=min(limit, 1000),
            parameters={"pk": order_id, "low": history_row_key(after + 1), "high": HISTORY_END})
        return _first(entities, limit, self._row)

    def partition_keys(self, order_id: str, limit: int) -> list[tuple[str, str]]:
        entities = self.state.query_entities("PartitionKey eq @pk", parameters={"pk": order_id},
                                             select=["RowKey"], results_per_page=min(limit, 1000))
        return [(str(e["RowKey"]), str(e.metadata.get("etag"))) for e in _first(entities, limit, lambda e: e)]

    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self._row(self.state.get_entity(partition_key=order_id, row_key=row_key))
        except ResourceNotFoundError:
            return None

    def read_rows(self, partition: str, limit: int) -> dict[str, dict[str, Any]]:
        """One query of the whole partition (one page: ``limit`` at most 1000)."""
        entities = self.state.query_entities("PartitionKey eq @pk", parameters={"pk": partition},
                                             results_per_page=min(limit, 1000))
        return {str(e["RowKey"]): e for e in _first(entities, limit, self._row)}

    def transact(self, order_id: str, ops: Sequence[Op]) -> dict[str, str]:
        """All of ``ops`` on the order's partition, or none: a lost race is ``Conflict``. Returns
        the new ETag of each created/replaced row (a row the service gave none for is left out)."""
        if not ops:
            return {}
        if len(ops) > MAX_BATCH_OPS:
            raise TooLarge(f"{len(ops)} operations in one transaction")
        for op in ops:
            if op.kind != "create" and op.etag is None:
                raise ValueError("replace/delete need the ETag they were decided on")
            if op.kind != "delete":
                check_entity(op.row)
        return self._send(order_id, [Write(op.kind, op.row_key, {} if op.kind == "delete" else clean(op.row),
                                           op.etag) for op in ops])

    def put_index(self, bucket: str, row_key: str, props: dict[str, Any]) -> None:
        from azure.data.tables import UpdateMode

        entity = {**clean(props), "PartitionKey": bucket, "RowKey": row_key}
        if self._index is not None:
            self._index.put(entity)  # returns once committed (group commit)
            return
        self.deadlines.upsert_entity(entity, mode=UpdateMode.REPLACE)

    def delete_index(self, bucket: str, row_key: str) -> None:
        if self._index is not None:
            self._index.delete(bucket, row_key)  # best effort, batched every DELETE_INTERVAL seconds
            return
        # delete_entity is idempotent in azure-data-tables (404 is swallowed)
        self.deadlines.delete_entity(partition_key=bucket, row_key=row_key)

    def flush_index(self) -> None:
        """Send this worker's queued index writes now: the search index's, then the deadline deletes."""
        if self._search is not None:
            self._search.flush()
        if self._index is not None:
            self._index.flush()

    def write_index(self, puts: Sequence[dict[str, Any]], deletes: Sequence[str], *, wait: bool = False,
                    stale: Sequence[str] = ()) -> None:
        if self._search is None:
            raise RuntimeError("this store has no search index table (OrderIndexTable)")
        self._search.add(puts, deletes)  # sent within a second (``shared.write_behind``)
        if wait:
            self._search.flush()
        for key in stale:  # apart: a delete that finds nothing would fail a shared transaction
            self.search.delete_entity(partition_key=INDEX_PARTITION, row_key=key)  # 404 is ignored

    def _search_flushed(self) -> None:
        if self.search is None or self._search is None:
            raise RuntimeError("this store has no search index table (OrderIndexTable)")
        self._search.flush()  # this worker's queued writes first

    def query_index(self, low: str, high: str, limit: int) -> list[dict[str, Any]]:
        self._search_flushed()
        entities = self.search.query_entities(
            "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high", results_per_page=min(limit, 1000),
            parameters={"pk": INDEX_PARTITION, "low": low, "high": high})
        return _first(entities, limit, dict)

    def count_index(self, low: str, high: str, cap: int) -> tuple[int, bool]:
        """One page of RowKeys (``cap`` at most 1000, a page's most): capped if there is more."""
        self._search_flushed()
        pages = self.search.query_entities(
            "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high", select=["RowKey"],
            results_per_page=min(cap + 1, 1000), parameters={"pk": INDEX_PARTITION, "low": low, "high": high}).by_page()
        count = sum(1 for _ in next(pages, []))
        return min(count, cap), count > cap or bool(pages.continuation_token)

    def put_stats(self, rows: Sequence[dict[str, Any]]) -> None:
        if self.search is None:
            raise RuntimeError("this store has no search index table (OrderIndexTable)")
        self._search_send(STATS_PARTITION, [Write("upsert", str(r["RowKey"]), clean(r)) for r in rows])

    def query_stats(self, low: str, high: str, limit: int) -> list[dict[str, Any]]:
        if self.search is None:
            raise RuntimeError("this store has no search index table (OrderIndexTable)")
        entities = self.search.query_entities(
            "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high", results_per_page=min(limit, 1000),
            parameters={"pk": STATS_PARTITION, "low": low, "high": high})
        return _first(entities, limit, dict)

    def delete_stats(self, row_keys: Sequence[str]) -> None:
        if self.search is None:
            raise RuntimeError("this store has no search index table (OrderIndexTable)")
        if len(row_keys) > 1:
            try:
                self._search_send(STATS_PARTITION, [Write("delete", rk) for rk in row_keys])
                return
            except Exception:  # noqa: BLE001 - e.g. a row already gone: then one by one
                pass
        for rk in row_keys:
            self.search.delete_entity(partition_key=STATS_PARTITION, row_key=rk)  # 404 is ignored

    def due_index(self, bucket: str, limit: int) -> list[dict[str, Any]]:
        self.flush_index()  # this worker's queued deletes first
        rows: list[dict[str, Any]] = []
        pages: Iterable[Any] = self.deadlines.query_entities(
            "PartitionKey le @bucket", parameters={"bucket": bucket}, select=list(self._select),
            results_per_page=min(limit, 1000))
        for e in pages:
            rows.append(dict(e))
            if len(rows) >= limit:
                break
        return rows


def _first(entities: Iterable[Any], limit: int, convert: Any) -> list[Any]:
    """The first ``limit`` entities of a paged query (no further page is fetched)."""
    out: list[Any] = []
    for e in entities:
        out.append(convert(e))
        if len(out) >= limit:
            break
    return out
