"""The state store on Azure Table Storage: ``shared.storage.store``'s ``Store`` over three tables
(``shared.storage.tables.Table``).

The table layout and the store's semantics are those of ``shared.storage.store`` (``Store``,
``MemoryStore``). Each table is reached through ``shared.storage.tables`` (the REST path over azure-core's
public pipeline, or the SDK's public methods). Every write is made in the invocation that asks
for it and has returned when the call returns: nothing is queued for later.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shared.core.rows import ETAG, HISTORY_END, LIVE_ROWS_FROM, EventRow, IndexRow, Op, SearchRow, history_row_key
from shared.observability.figures import ConsoleStats, Figures
from shared.storage.store import (
    INDEX_PARTITION,
    MAX_BATCH_OPS,
    SEARCH_SHARDS,
    STATS_PARTITION,
    Ask,
    Entity,
    TooLarge,
    check_entity,
    clean,
    index_partitions,
    merge_lazily,
    shard_of,
    transact_or_each,
)
from shared.storage.tables import MAX_PAGE, POOL_SIZE, SdkTable, Table, Write, table_for
from shared.storage.transport import Urllib3Transport

RANGE = "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high"
RANGE_AFTER = "PartitionKey eq @pk and RowKey gt @low and RowKey lt @high"  # the rest of a range, after a row read


@dataclass
class TableStore:
    """Azure Table Storage: the state table, the deadline index and the search index (with the
    console's figures in its partition ``stats``)."""

    state: Table
    deadlines: Table
    search: Table | None = None  # OrderIndexTable (None: no search index)
    shards: int = SEARCH_SHARDS  # the search index's (``shared.storage.store``)
    stats: ConsoleStats | None = field(default=None, repr=False, compare=False)  # the console's figures

    def __post_init__(self) -> None:
        if self.search is not None:
            self.stats = ConsoleStats(self.put_stats)  # records from the first committed event on

    @classmethod
    def of(cls, state: Any, deadlines: Any, search: Any = None, *, rest: bool = True,
           transport: Any | None = None, shards: int = SEARCH_SHARDS) -> TableStore:
        """A store over azure-data-tables ``TableClient``\\ s, each reached by the REST path (``rest``,
        where its credential allows) or the SDK's (``shared.storage.tables.table_for``), on one transport."""
        transport = transport or Urllib3Transport(POOL_SIZE)
        return cls(table_for(state, transport, rest=rest), table_for(deadlines, transport, rest=rest),
                   None if search is None else table_for(search, transport, rest=rest), shards)

    @property
    def path(self) -> str:
        """``rest`` or ``sdk``: how this store reaches its state table."""
        return "sdk" if isinstance(self.state, SdkTable) else "rest"

    def read_partition(self, order_id: str) -> dict[str, Entity]:
        rows = self.state.query("PartitionKey eq @pk and RowKey ge @live", {"pk": order_id, "live": LIVE_ROWS_FROM},
                                limit=MAX_PAGE).rows
        return {str(e["RowKey"]): e for e in rows}

    def read_history(self, order_id: str, after: int, limit: int) -> list[EventRow]:
        rows = self.state.query(RANGE, {"pk": order_id, "low": history_row_key(after + 1), "high": HISTORY_END},
                                limit=limit).rows
        return [EventRow.from_entity(e) for e in rows]

    def read_range(self, partition: str, low: str, high: str, limit: int) -> dict[str, Entity]:
        rows = self.state.query(RANGE, {"pk": partition, "low": low, "high": high}, limit=limit).rows
        return {str(e["RowKey"]): e for e in rows}

    def partition_keys(self, partition: str, limit: int) -> list[tuple[str, str]]:
        rows = self.state.query("PartitionKey eq @pk", {"pk": partition}, limit=limit, select=["RowKey"]).rows
        return [(str(e["RowKey"]), str(e[ETAG])) for e in rows]

    def read_row(self, partition: str, row_key: str) -> Entity | None:
        return self.state.get(partition, row_key)

    def read_rows(self, partition: str, limit: int) -> dict[str, Entity]:
        """One query of the whole partition (one page: ``limit`` at most 1000)."""
        return {str(e["RowKey"]): e for e in self.state.query("PartitionKey eq @pk", {"pk": partition},
                                                             limit=limit).rows}

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
        return self.state.transact(order_id, [Write(op.kind, op.row_key, {} if op.kind == "delete" else clean(op.row),
                                           op.etag) for op in ops])

    def put_index(self, row: IndexRow) -> None:
        self.deadlines.upsert({**row.props(), "PartitionKey": row.bucket, "RowKey": row.row_key})

    def delete_index(self, bucket: str, row_key: str) -> None:
        self.deadlines.delete(bucket, row_key)

    def due_index(self, bucket: str, limit: int) -> list[IndexRow]:
        rows = self.deadlines.query("PartitionKey le @bucket", {"bucket": bucket}, limit=limit,
                                    select=["PartitionKey", "RowKey", "OrderId", "Due"]).rows
        return [IndexRow.from_entity(e) for e in rows]

    def write_index(self, puts: Sequence[SearchRow], deletes: Sequence[str], *,
                    stale: Sequence[str] = ()) -> None:
        """Per shard (an order's rows share one), one transaction of the puts and deletes; if a delete
        finds nothing (the transaction fails), each write alone (``transact_or_each``). ``stale``:
        one by one, apart."""
        search = self._searched()
        shards: dict[str, list[Write]] = {}
        for w in [*(Write("upsert", r.row_key, r.to_entity()) for r in puts), *(Write("delete", k) for k in deletes)]:
            shards.setdefault(shard_of(w.row_key, self.shards), []).append(w)

        def write_one(w: Write) -> None:  # an upsert cannot conflict; a delete of a row gone is fine
            if w.kind == "upsert":
                search.transact(shard_of(w.row_key, self.shards), [w])
            else:
                search.delete(shard_of(w.row_key, self.shards), w.row_key)

        for shard, writes in shards.items():
            transact_or_each(functools.partial(search.transact, shard), writes, write_one)
        for key in stale:
            search.delete(shard_of(key, self.shards), key)

    def _searched(self) -> Table:
        if self.search is None:
            raise RuntimeError("this store has no search index table (OrderIndexTable)")
        return self.search

    def _each_partition(self, read: Callable[[str], Any]) -> list[Any]:
        """``read`` of every partition of the search index, in parallel (joined before it returns)."""
        return self._in_parallel(read, index_partitions(self.shards))

    @staticmethod
    def _in_parallel(read: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``read`` of each item, in parallel when there are more than one (joined before it returns)."""
        if len(items) == 1:
            return [read(items[0])]
        with ThreadPoolExecutor(max_workers=len(items)) as pool:
            return list(pool.map(read, items))

    def query_index(self, low: str, high: str, limit: int) -> list[SearchRow]:
        search = self._searched()

        def read(ask: Ask) -> list[SearchRow]:
            params = {"pk": ask.partition, "low": ask.after or low, "high": high}
            rows = (search.query(RANGE, params, limit=ask.limit) if ask.after is None
                    else search.query(RANGE_AFTER, params, limit=ask.limit)).rows
            return [SearchRow.from_entity(e) for e in rows]

        return merge_lazily(lambda asks: self._in_parallel(read, asks), index_partitions(self.shards), limit)

    def count_index(self, low: str, high: str, cap: int) -> tuple[int, bool]:
        """One page of RowKeys per partition (``cap`` at most 1000: one request each): capped if
        there may be more (a key in a shard and in the legacy partition counted once)."""
        search = self._searched()
        pages = self._each_partition(lambda pk: search.query(
            RANGE, {"pk": pk, "low": low, "high": high}, limit=min(cap, MAX_PAGE), select=["RowKey"]))
        keys = {str(e["RowKey"]) for page in pages for e in page.rows}
        return min(len(keys), cap), len(keys) > cap or any(page.more for page in pages)

    def legacy_index(self, limit: int) -> list[SearchRow]:
        if self.shards <= 1:
            return []  # ``orders`` is the index itself
        rows = self._searched().query("PartitionKey eq @pk", {"pk": INDEX_PARTITION}, limit=limit).rows
        return [SearchRow.from_entity(e) for e in rows]

    def drop_legacy_index(self, row_keys: Sequence[str]) -> None:
        if self.shards <= 1:
            return
        search = self._searched()
        for key in row_keys:
            search.delete(INDEX_PARTITION, key)

    def put_stats(self, rows: Mapping[str, Figures]) -> None:
        self._searched().transact(STATS_PARTITION, [Write("upsert", key, clean(figures.to_row(key)))
                                                    for key, figures in rows.items()])

    def query_stats(self, low: str, high: str, limit: int) -> dict[str, Figures]:
        rows = self._searched().query(RANGE, {"pk": STATS_PARTITION, "low": low, "high": high}, limit=limit).rows
        return {str(e["RowKey"]): Figures.from_row(e) for e in rows}

    def delete_stats(self, row_keys: Sequence[str]) -> None:
        search = self._searched()
        transact_or_each(lambda chunk: search.transact(STATS_PARTITION, chunk),
                         [Write("delete", rk) for rk in row_keys], lambda w: search.delete(STATS_PARTITION, w.row_key))
