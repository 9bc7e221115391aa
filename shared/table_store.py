"""The state store on Azure Table Storage (azure-data-tables ``TableClient`` per table).

The table layout and the store's semantics are those of ``shared.store`` (``Store``,
``MemoryStore``). Entity-group transactions go through ``shared.table_batch`` (the SDK's public
``submit_transaction``, or its faster path when this SDK allows it). Every write is made in the
invocation that asks for it and has returned when the call returns: nothing is queued for later.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.console_stats import ConsoleStats
from shared.store import (
    ETAG,
    HISTORY_END,
    INDEX_PARTITION,
    LIVE_ROWS_FROM,
    MAX_BATCH_OPS,
    STATS_PARTITION,
    Conflict,
    Op,
    TooLarge,
    check_entity,
    clean,
    history_row_key,
)
from shared.table_batch import Write, sender_for


@dataclass
class TableStore:
    """Azure Table Storage (azure-data-tables ``TableClient`` for each table).

    ``fast_batch``: entity-group transactions take ``shared.table_batch``'s fast path when this
    SDK allows it (``batch_path`` says which one is used); off, always the public one."""

    state: Any  # azure.data.tables.TableClient
    deadlines: Any  # azure.data.tables.TableClient
    search: Any = None  # azure.data.tables.TableClient of OrderIndexTable (None: no search index)
    _select: tuple[str, ...] = field(default=("PartitionKey", "RowKey", "OrderId", "Due"))
    fast_batch: bool = True
    stats: ConsoleStats | None = field(default=None, repr=False, compare=False)  # the console's figures

    def __post_init__(self) -> None:
        self._send = sender_for(self.state, fast=self.fast_batch)
        if self.search is not None:
            self._search_send = sender_for(self.search, fast=self.fast_batch)
            self.stats = ConsoleStats(self.put_stats)  # records from the first committed event on

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

        self.deadlines.upsert_entity({**clean(props), "PartitionKey": bucket, "RowKey": row_key},
                                     mode=UpdateMode.REPLACE)

    def delete_index(self, bucket: str, row_key: str) -> None:
        self.deadlines.delete_entity(partition_key=bucket, row_key=row_key)  # a 404 is ignored

    def write_index(self, puts: Sequence[dict[str, Any]], deletes: Sequence[str], *,
                    stale: Sequence[str] = ()) -> None:
        """One transaction of the puts and deletes; if a delete finds nothing (the transaction
        fails), the puts again alone and the deletes one by one. ``stale``: one by one, apart."""
        search = self._searched()
        writes = [*(Write("upsert", str(r["RowKey"]), clean(r)) for r in puts), *(Write("delete", k) for k in deletes)]
        for i in range(0, len(writes), MAX_BATCH_OPS):
            chunk = writes[i:i + MAX_BATCH_OPS]
            try:
                self._search_send(INDEX_PARTITION, chunk)
            except Conflict:  # a delete of a row already gone: the upserts cannot fail that way
                upserts = [w for w in chunk if w.kind == "upsert"]
                if upserts:
                    self._search_send(INDEX_PARTITION, upserts)
                stale = [*stale, *(w.row_key for w in chunk if w.kind == "delete")]
        for key in stale:
            search.delete_entity(partition_key=INDEX_PARTITION, row_key=key)  # a 404 is ignored

    def _searched(self) -> Any:
        if self.search is None:
            raise RuntimeError("this store has no search index table (OrderIndexTable)")
        return self.search

    def query_index(self, low: str, high: str, limit: int) -> list[dict[str, Any]]:
        entities = self._searched().query_entities(
            "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high", results_per_page=min(limit, 1000),
            parameters={"pk": INDEX_PARTITION, "low": low, "high": high})
        return _first(entities, limit, dict)

    def count_index(self, low: str, high: str, cap: int) -> tuple[int, bool]:
        """One page of RowKeys (``cap`` at most 1000, a page's most): capped if there is more."""
        pages = self._searched().query_entities(
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
