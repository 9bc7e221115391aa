"""Group commit: the index writes that threads of a worker make at the same time to one
partition go out as ONE entity-group transaction.

Each caller hands over its writes (upserts and deletes of index rows, never conditional) and
returns only once they are committed, so "written before" / "written after" orderings still
hold. A lone caller's writes are sent at once (no added latency); while a transaction of a
partition is in flight, the next callers queue up and the first of them sends them all when it
returns. A transaction holds whole callers' writes, at most 100 and each row once. When a
transaction fails (say, a delete of a row already gone), its callers are split in halves and
sent again, down to the one caller whose writes are then sent one by one (a delete that finds
nothing is fine): one caller's stale delete never fails another's writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from shared.store import MAX_BATCH_OPS
from shared.table_batch import Write

Send = Callable[[str, Sequence[Write]], object]  # (partition key, writes): one transaction (its ETags unused)


class GroupCommit:
    """Group-committed index writes on ``table`` (an azure-data-tables ``TableClient``)."""

    def __init__(self, table: Any, send: Send) -> None:
        self.table = table
        self.send = send
        self._lock = threading.Lock()
        self._queued: dict[str, list[_Caller]] = {}
        self._busy: set[str] = set()

    def commit(self, partition: str, writes: Sequence[Write]) -> None:
        """Apply ``writes`` to ``partition``; return once they are committed (or raise)."""
        me = _Caller(tuple(writes))
        with self._lock:
            self._queued.setdefault(partition, []).append(me)
            lead = partition not in self._busy
            if lead:
                self._busy.add(partition)
        if not lead:
            me.done.wait()  # committed by another caller's transaction, or promoted to send
            if not me.lead:
                me.raise_error()
                return
        try:
            while not me.sent:  # send transactions (ours among them), then hand over
                self._send(partition, self._next_batch(partition))
        finally:
            with self._lock:
                rest = self._queued.get(partition, [])
                if rest:
                    rest[0].lead = True  # the next caller sends what queued up meanwhile
                    rest[0].done.set()
                else:
                    self._queued.pop(partition, None)
                    self._busy.discard(partition)
        me.raise_error()

    def commit_groups(self, partition: str, groups: Sequence[Sequence[Write]]) -> list[BaseException | None]:
        """Apply each group's writes (whole groups per transaction, as concurrent callers'
        would be); the error of each group, None where it was committed."""
        callers = [_Caller(tuple(g)) for g in groups if g]
        batch: list[_Caller] = []
        keys: set[str] = set()
        for caller in callers:
            mine = {w.row_key for w in caller.writes}
            if batch and (len(keys) + len(mine) > MAX_BATCH_OPS or keys & mine):
                self._send(partition, batch)
                batch, keys = [], set()
            batch.append(caller)
            keys |= mine
        if batch:
            self._send(partition, batch)
        return [c.error for c in callers]

    def _next_batch(self, partition: str) -> list[_Caller]:
        """Whole callers that fit one transaction (each row once, at most 100 writes)."""
        with self._lock:
            batch: list[_Caller] = []
            keys: set[str] = set()
            rest: list[_Caller] = []
            for caller in self._queued.get(partition, []):
                mine = {w.row_key for w in caller.writes}
                fits = len(keys) + len(mine) <= MAX_BATCH_OPS and not keys & mine
                if fits or not batch:
                    keys |= mine
                    batch.append(caller)
                else:
                    rest.append(caller)
            self._queued[partition] = rest
        return batch

    def _send(self, partition: str, batch: list[_Caller]) -> None:
        errors = self._send_group(partition, batch)
        for caller in batch:
            caller.error = errors.get(id(caller))
            caller.sent = True
            caller.done.set()

    def _send_group(self, partition: str, callers: list[_Caller]) -> dict[int, BaseException]:
        """Send ``callers``' writes as one transaction; if it fails, halve the group and try
        again, so that one caller's stale delete costs a few transactions, not one request
        per write. A lone caller whose transaction fails is sent one write at a time."""
        writes = [w for caller in callers for w in caller.writes]
        try:
            if len(writes) == 1:
                self._one(partition, writes[0])
            else:
                self.send(partition, writes)
            return {}
        except Exception:  # noqa: BLE001 - narrowed down below
            if len(callers) == 1:
                error = self._one_by_one(partition, callers[0].writes)
                return {id(callers[0]): error} if error is not None else {}
        half = len(callers) // 2
        return {**self._send_group(partition, callers[:half]), **self._send_group(partition, callers[half:])}

    def _one_by_one(self, partition: str, writes: Sequence[Write]) -> BaseException | None:
        """A lone caller whose transaction failed: its upserts again as one transaction (they
        cannot fail for a missing row), then its deletes one at a time (a 404 is fine)."""
        upserts = [w for w in writes if w.kind == "upsert"]
        try:
            if len(upserts) > 1:
                try:
                    self.send(partition, upserts)
                    writes = [w for w in writes if w.kind != "upsert"]
                except Exception:  # noqa: BLE001 - then one at a time, below
                    pass
            for write in writes:
                self._one(partition, write)
        except Exception as exc:  # noqa: BLE001 - this caller's failure, raised in its thread
            return exc
        return None

    def _one(self, partition: str, write: Write) -> None:
        from azure.data.tables import UpdateMode

        if write.kind == "delete":  # azure-data-tables ignores a 404 on delete
            self.table.delete_entity(partition_key=partition, row_key=write.row_key)
        else:
            entity = {**{k: v for k, v in write.props.items() if v is not None},
                      "PartitionKey": partition, "RowKey": write.row_key}
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)


class _Caller:
    __slots__ = ("done", "error", "lead", "sent", "writes")

    def __init__(self, writes: tuple[Write, ...]) -> None:
        self.writes = writes
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.lead = False  # promoted to send the queued transactions
        self.sent = False  # its writes were sent (``error`` says how it went)

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error
