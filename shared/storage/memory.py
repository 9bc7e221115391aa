"""The state store in memory, with Table Storage's ETag and transaction semantics (unit tests)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence

from shared.core.rows import (
    ETAG,
    HISTORY_END,
    LIVE_ROWS_FROM,
    Entity,
    EventRow,
    IndexRow,
    Op,
    SearchRow,
    history_row_key,
)
from shared.observability.figures import ConsoleStats, Figures
from shared.storage.store import (
    INDEX_PARTITION,
    MAX_BATCH_OPS,
    SEARCH_SHARDS,
    STATS_PARTITION,
    Ask,
    Conflict,
    TooLarge,
    check_entity,
    clean,
    index_partitions,
    merge_lazily,
    shard_of,
)


class MemoryStore:
    """In-memory store with Table Storage's ETag and transaction semantics (for unit tests).

    * create of an existing row -> Conflict; replace/delete with a stale ETag or of a missing
      row -> Conflict; a transaction applies all of its ops or none; at most 100 ops, one op
      per row, string properties at most 64 KiB.
    """

    def __init__(self, shards: int = SEARCH_SHARDS) -> None:
        self.shards = shards  # the search index's (``shared.storage.store.SEARCH_SHARDS``)
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, str], tuple[Entity, str]] = {}
        self._etags = itertools.count(1)
        self.writes = 0  # number of successful write requests (tests of cost)
        self.reads: list[tuple[str, str]] = []  # (table, partition) of every read
        self.search_rows_read = 0  # search index rows its range reads returned (a page's cost)
        self.stats: ConsoleStats | None = None  # no console figures unless a test sets a recorder

    def _etag(self) -> str:
        return f'W/"{next(self._etags)}"'

    # state table ------------------------------------------------------------------------------
    def _partition(self, order_id: str, low: str, high: str) -> dict[str, Entity]:
        return {rk: {**props, "PartitionKey": pk, "RowKey": rk, ETAG: etag}
                for (t, pk, rk), (props, etag) in sorted(self._rows.items())
                if t == "state" and pk == order_id and low <= rk < high}

    def read_partition(self, order_id: str) -> dict[str, Entity]:
        with self._lock:
            self.reads.append(("state", order_id))
            return self._partition(order_id, LIVE_ROWS_FROM, "\uffff")

    def peek_partition(self, order_id: str) -> dict[str, Entity]:
        """The live rows as ``read_partition`` returns them, not counted in ``reads`` (tests' checks)."""
        with self._lock:
            return self._partition(order_id, LIVE_ROWS_FROM, "\uffff")

    def read_history(self, order_id: str, after: int, limit: int) -> list[EventRow]:
        with self._lock:
            self.reads.append(("history", order_id))
            rows = self._partition(order_id, history_row_key(after + 1), HISTORY_END)
            return [EventRow.from_entity(e) for e in list(rows.values())[:limit]]

    def partition_keys(self, order_id: str, limit: int) -> list[tuple[str, str]]:
        with self._lock:
            self.reads.append(("state", order_id))
            return [(rk, e[ETAG]) for rk, e in self._partition(order_id, "", "\uffff").items()][:limit]

    def read_row(self, order_id: str, row_key: str) -> Entity | None:
        with self._lock:
            self.reads.append(("state", order_id))
            hit = self._rows.get(("state", order_id, row_key))
            if hit is None:
                return None
            props, etag = hit
            return {**props, "PartitionKey": order_id, "RowKey": row_key, ETAG: etag}

    def read_range(self, partition: str, low: str, high: str, limit: int) -> dict[str, Entity]:
        with self._lock:
            self.reads.append(("state", partition))
            return dict(itertools.islice(self._partition(partition, low, high).items(), limit))

    def read_rows(self, partition: str, limit: int) -> dict[str, Entity]:
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
    def put_index(self, row: IndexRow) -> None:
        with self._lock:
            self._rows[("deadline", row.bucket, row.row_key)] = ({**row.props(), "RowKey": row.row_key}, self._etag())
            self.writes += 1

    def delete_index(self, bucket: str, row_key: str) -> None:
        with self._lock:
            self._rows.pop(("deadline", bucket, row_key), None)
            self.writes += 1

    def due_index(self, bucket: str, limit: int) -> list[IndexRow]:
        with self._lock:
            self.reads.append(("deadline", bucket))
            rows = sorted(((pk, rk), props) for (t, pk, rk), (props, _e) in self._rows.items()
                          if t == "deadline" and pk <= bucket)
            return [IndexRow.from_entity({**props, "PartitionKey": pk, "RowKey": rk})
                    for (pk, rk), props in rows[:limit]]

    # search index -------------------------------------------------------------------------------
    def write_index(self, puts: Sequence[SearchRow], deletes: Sequence[str], *,
                    stale: Sequence[str] = ()) -> None:
        deletes = [*deletes, *stale]
        with self._lock:
            for row in puts:
                key = ("search", shard_of(row.row_key, self.shards), row.row_key)
                self._rows[key] = (row.to_entity(), self._etag())
            for rk in deletes:
                self._rows.pop(("search", shard_of(rk, self.shards), rk), None)
            self.writes += 1

    def _index_range(self, partition: str, low: str, high: str) -> list[tuple[str, Entity]]:
        return sorted((rk, props) for (t, pk, rk), (props, _e) in self._rows.items()
                      if t == "search" and pk == partition and low <= rk < high)

    def query_index(self, low: str, high: str, limit: int) -> list[SearchRow]:
        def read(asks: Sequence[Ask]) -> list[list[SearchRow]]:
            with self._lock:
                self.reads += [("search", low)] * len(asks)
                pages = [[SearchRow.from_entity({**props, "RowKey": rk}) for rk, props in
                          self._index_range(a.partition, low, high) if a.after is None or rk > a.after][:a.limit]
                         for a in asks]
                self.search_rows_read += sum(len(page) for page in pages)
                return pages

        return merge_lazily(read, index_partitions(self.shards), limit)

    def count_index(self, low: str, high: str, cap: int) -> tuple[int, bool]:
        with self._lock:
            partitions = index_partitions(self.shards)
            self.reads += [("search", low)] * len(partitions)
            keys = {rk for pk in partitions for rk, _p in self._index_range(pk, low, high)}
            return min(len(keys), cap), len(keys) > cap

    def legacy_index(self, limit: int) -> list[SearchRow]:
        if self.shards <= 1:
            return []  # ``orders`` is the index itself
        with self._lock:
            self.reads.append(("search", INDEX_PARTITION))
            return [SearchRow.from_entity({**props, "RowKey": rk}) for rk, props in
                    self._index_range(INDEX_PARTITION, "", "\uffff")[:limit]]

    def drop_legacy_index(self, row_keys: Sequence[str]) -> None:
        if self.shards <= 1:
            return
        with self._lock:
            for rk in row_keys:
                self._rows.pop(("search", INDEX_PARTITION, rk), None)
            self.writes += 1

    # console stats (partition ``stats``) ------------------------------------------------------
    def put_stats(self, rows: Mapping[str, Figures]) -> None:
        if len(rows) > MAX_BATCH_OPS:
            raise TooLarge(f"{len(rows)} operations in one transaction")
        entities = [figures.to_row(key) for key, figures in rows.items()]
        for entity in entities:
            check_entity(entity)
        with self._lock:
            for entity in entities:
                self._rows[("stats", STATS_PARTITION, str(entity["RowKey"]))] = (clean(entity), self._etag())
            self.writes += 1

    def query_stats(self, low: str, high: str, limit: int) -> dict[str, Figures]:
        with self._lock:
            self.reads.append(("stats", low))
            rows = sorted((rk, props) for (t, _pk, rk), (props, _e) in self._rows.items()
                          if t == "stats" and low <= rk < high)
            return {rk: Figures.from_row(props) for rk, props in rows[:limit]}

    def delete_stats(self, row_keys: Sequence[str]) -> None:
        with self._lock:
            for rk in row_keys:
                self._rows.pop(("stats", STATS_PARTITION, rk), None)
            self.writes += 1

    def index_rows(self) -> list[Entity]:
        with self._lock:
            return [{**props, "PartitionKey": pk} for (t, pk, _rk), (props, _e) in sorted(self._rows.items())
                    if t == "deadline"]

    def snapshot(self) -> dict[tuple[str, str, str], Entity]:
        with self._lock:
            return {k: dict(v[0]) for k, v in self._rows.items()}
