"""Write-behind for the search index: an order's index writes are queued and sent a moment
later, coalesced, together with every other order's.

Most orders end within a second or two of their submission, so the rows the submission puts
(``cat-inFlight``...) and the final transition's rewrite of them meet in the queue: the final
rows replace the first ones, and a row first put and then deleted since the last flush is not
sent at all (a category row is deleted before it is put again, so it was not there before). One
transaction then carries the index writes of every order of that moment. Table requests per
step stay at what they were before the index existed.

Order and crashes. The deadline index deletes an order's row only after this queue's earlier
writes are committed (``TableStore`` flushes it first), so the Supervisor's repair still holds:
a worker that dies with writes queued leaves the deadline row, and the sweep re-indexes the
order from its state. Rows the submission queued are put again by the order's next category
change, and rows of the changing categories are checked by every search, so nothing lost
here stays wrong. A search in the same worker flushes first; another worker sees the rows
within ``interval`` seconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from shared.background import Periodic
from shared.group_commit import GroupCommit
from shared.logs import log_event
from shared.store import INDEX_PARTITION, clean
from shared.table_batch import Write

MAX_TRIES = 10  # flushes (a second apart) before a failing write is dropped


class WriteBehind:
    def __init__(self, commit: GroupCommit, interval: float = 1.0) -> None:
        self.commit = commit
        self.interval = interval
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one flush at a time: writes go out in the order queued
        self._queued: dict[str, dict[str, _Slot]] = {}  # order id -> row key -> its writes since the last flush
        self._started = 0  # flushes that have taken the queue so far
        self._clean = 0  # the number of the last flush that committed all it took
        self._periodic = Periodic(self.flush, interval, name="search-index", event="index.flush_failed")

    def add(self, puts: Sequence[dict[str, Any]], deletes: Sequence[str]) -> None:
        """Queue writes of index rows; returns at once. Every row key ends with its order's id."""
        with self._lock:
            for row in puts:
                key = str(row["RowKey"])
                self._slot(key).write = Write("upsert", key, clean(row))
            for key in deletes:
                self._slot(key).write = Write("delete", key)
        self._periodic.start()

    def _slot(self, key: str) -> _Slot:
        mine = self._queued.setdefault(_order_of(key), {})
        if key not in mine:
            mine[key] = _Slot()
        return mine[key]

    def mark(self) -> int:
        """A stamp for "everything queued until now": see :meth:`sent_since`."""
        with self._lock:
            return self._started

    def sent_since(self, mark: int) -> bool:
        """Whether every write queued before ``mark`` was taken is committed: a flush that
        began after it committed all it took."""
        return self._clean > mark

    def flush(self) -> None:
        """Send everything queued so far; raise if some of it could not be committed (it stays
        queued, unless a later write of the same row replaced it)."""
        with self._flushing:
            with self._lock:
                taken, self._queued = self._queued, {}
                self._started += 1
                number = self._started
            orders = [(oid, [w for w in (slot.net() for slot in slots.values()) if w is not None])
                      for oid, slots in taken.items()]
            orders = [(oid, writes) for oid, writes in orders if writes]
            errors = self.commit.commit_groups(INDEX_PARTITION, [w for _oid, w in orders]) if orders else []
            failed = [(oid, writes) for (oid, writes), error in zip(orders, errors, strict=True) if error]
            if failed:
                self._requeue(taken, failed)
                raise RuntimeError(f"{len(failed)} orders' index writes failed: {errors}")
            self._clean = number  # flushes run one at a time, so this only grows

    def _requeue(self, taken: dict[str, dict[str, _Slot]], failed: list[tuple[str, list[Write]]]) -> None:
        """Queue failed writes again (unless a later write of the row replaced them); after
        ``MAX_TRIES`` they are dropped and logged: the deadline row they hold back lets the
        Supervisor re-index the order, and searches check the rows of changing categories."""
        with self._lock:
            for oid, writes in failed:
                tries = max(slot.tries for slot in taken[oid].values()) + 1
                if tries >= MAX_TRIES:
                    log_event(logging.ERROR, "index.writes_dropped", order_id=oid, writes=len(writes))
                    continue
                for write in writes:
                    slot = self._slot(write.row_key)
                    if slot.write is None:  # not replaced by a later write meanwhile
                        slot.write = write
                        slot.tries = tries


class _Slot:
    """The writes of one row since the last flush: what to send is the net of them."""

    __slots__ = ("_write", "first", "tries")

    def __init__(self) -> None:
        self.first: str | None = None  # the kind of the first write: was the row there before?
        self._write: Write | None = None
        self.tries = 0  # flushes that failed to send it

    @property
    def write(self) -> Write | None:
        return self._write

    @write.setter
    def write(self, value: Write | None) -> None:
        if self.first is None and value is not None:
            self.first = value.kind
        self._write = value

    def net(self) -> Write | None:
        """The last write; but a row first put and then deleted since the last flush did not exist
        before it (the index deletes a row before it puts it again), so nothing is sent for it."""
        if self._write is not None and self._write.kind == "delete" and self.first == "upsert":
            return None
        return self._write


def _order_of(row_key: str) -> str:
    """The order a search index row is about (its keys end with ``-{orderId}``)."""
    return row_key.rsplit("-", 1)[-1]
