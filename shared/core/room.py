"""A customer's room: at most ``CustomerMaxInFlight`` of one customer's orders past submission and
not yet ended; the others wait, in submission order (issue 45, item 2; docs/breaker-design.md §8).

A bounded semaphore per customer in the state table, in a partition of its own,
``room-{customer key}`` (a hash of the customer id: any character may be in the id):

* RowKey ``room``: ``Holders`` (JSON, order id -> when it took its slot) and ``Cap`` (the cap of
  the instance that wrote it last). At most ``Cap`` holders.
* RowKey ``w-{createdAt}-{orderId}``: one per order waiting for a slot, oldest first (they sort
  after ``room``), carrying what its admission needs: the scheduler queue of its lane and its
  traceparent. So ONE query of the partition's first rows reads the room and its oldest waiters.

Every move is one entity-group transaction of that partition, conditioned on the room row's ETag
(and the waiters' it deletes): a lost race reads again. The pure decisions are here; the reads,
writes and sends are ``shared.runtime.rooms``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from shared.core.jsonio import dumps, loads
from shared.core.rows import ETAG, Entity, Op
from shared.core.times import iso, parse_iso

ROOM_ROW = "room"
WAITER_PREFIX = "w-"
ROOM_PREFIX = "room-"
# The schedule sequence of an admitted order's claim: a waiting order is written with it, and its
# admission is the schedule message ``{orderId}:schedule:1`` (the same id whoever sends it: a copy
# is dropped by duplicate detection, a late one finds the order claimed).
ROOM_SEQ = 1
MAX_ADMITTED = 98  # waiters admitted in one transaction (the room row + 98 deletes + margin < 100 ops)
# A holder whose order has no state row is its submission's, between the room's write and the
# order's: freed once it is this old (``shared.core.statemachine.deadlines.ORPHAN_INDEX_AGE``'s rule).
ORPHAN_HOLDER_AGE = timedelta(minutes=5)
# The room watch: a deadline index row per room with waiters, due every this often (rounded up to
# it, so that every waiter of one window puts the same row).
WATCH_PERIOD = timedelta(seconds=30)
WATCH_PREFIX = "room:"


def room_partition(customer_id: str) -> str:
    """The customer's room partition (the same hash as the search index's customer key)."""
    return ROOM_PREFIX + hashlib.sha256(customer_id.encode("utf-8")).hexdigest()[:24]


def waiter_key(created_at: datetime, order_id: str) -> str:
    """A waiter's RowKey: by submission time (UTC, microseconds), then the order id."""
    return f"{WAITER_PREFIX}{created_at.strftime('%Y%m%dT%H%M%S%f')}-{order_id}"


@dataclass(frozen=True)
class Waiter:
    """An order waiting for a slot in its customer's room."""

    row_key: str
    order_id: str
    queue: str  # the scheduler queue of the order's lane: where its admission goes
    traceparent: str | None = None
    etag: str | None = None

    @classmethod
    def from_entity(cls, entity: Mapping[str, Any]) -> Waiter:
        return cls(str(entity["RowKey"]), str(entity["OrderId"]), str(entity["Queue"]),
                   entity.get("Traceparent") or None, entity.get(ETAG))

    def to_props(self) -> Entity:
        return {"RowKey": self.row_key, "OrderId": self.order_id, "Queue": self.queue,
                "Traceparent": self.traceparent}


@dataclass(frozen=True)
class Room:
    """The room row as read (``etag`` None: never written)."""

    partition: str
    cap: int = 0
    holders: Mapping[str, datetime] = field(default_factory=dict)
    etag: str | None = None

    @classmethod
    def from_rows(cls, partition: str, rows: Mapping[str, Mapping[str, Any]]) -> tuple[Room, list[Waiter]]:
        """The room and its waiters, oldest first, from a read of the partition's first rows."""
        row = rows.get(ROOM_ROW)
        room = cls(partition)
        if row is not None:
            holders = {k: t for k, v in (loads(row.get("Holders") or "{}") or {}).items()
                       if (t := parse_iso(v)) is not None}
            room = cls(partition, int(row.get("Cap") or 0), holders, row.get(ETAG))
        waiters = [Waiter.from_entity({**e, "RowKey": k}) for k, e in sorted(rows.items())
                   if k.startswith(WAITER_PREFIX)]
        return room, waiters

    def to_props(self) -> Entity:
        return {"RowKey": ROOM_ROW, "Cap": self.cap,
                "Holders": dumps({k: iso(v) for k, v in sorted(self.holders.items())})}

    def write(self) -> Op:
        """The room row's write, conditioned on the ETag it was read with (created if never written)."""
        return Op("create", self.to_props()) if self.etag is None else Op("replace", self.to_props(), etag=self.etag)

    @property
    def free(self) -> int:
        return max(0, self.cap - len(self.holders))


@dataclass(frozen=True)
class Entry:
    """A submission at the room's door: ``admitted`` (it holds a slot, ``write`` first if not
    None) or it waits."""

    admitted: bool
    write: Room | None = None


def enter(room: Room, waiters: Sequence[Waiter], order_id: str, cap: int, now: datetime) -> Entry:
    """A new order: it takes a slot if it holds one already (its submission again), or if a slot
    is free and nobody waits (a new order never overtakes an older waiter); else it waits."""
    if order_id in room.holders:
        return Entry(True)
    if not waiters and len(room.holders) < cap:
        return Entry(True, replace(room, cap=cap, holders={**room.holders, order_id: now}))
    return Entry(False)


@dataclass(frozen=True)
class Admission:
    """A move of the room: the room row to write (None: nothing changes), the waiter rows to
    delete, and the waiters admitted (to be told, after the write)."""

    room: Room | None
    deletes: tuple[Waiter, ...] = ()
    admitted: tuple[Waiter, ...] = ()

    def ops(self) -> list[Op]:
        if self.room is None:
            return [Op("delete", {"RowKey": w.row_key}, etag=w.etag or "*") for w in self.deletes]
        return [self.room.write(), *(Op("delete", {"RowKey": w.row_key}, etag=w.etag or "*") for w in self.deletes)]


def admit(room: Room, waiters: Sequence[Waiter], now: datetime, *, leaving: Iterable[str] = (),
          gone: Iterable[str] = (), cap: int | None = None) -> Admission:
    """``leaving`` give their slots back (ended orders), ``gone`` waiters are dropped without a slot
    (their orders ended while they waited); then the oldest waiters take the free slots. ``cap``:
    the room's own when None."""
    leaving, gone = set(leaving), set(gone)
    holders = {k: v for k, v in room.holders.items() if k not in leaving}
    after = replace(room, holders=holders, cap=room.cap if cap is None else cap)
    dropped = tuple(w for w in waiters if w.order_id in gone)
    queue = [w for w in waiters if w.order_id not in gone and w.order_id not in holders]
    taken = tuple(queue[:min(after.free, MAX_ADMITTED - len(dropped))])
    after = replace(after, holders={**holders, **{w.order_id: now for w in taken}})
    # a waiter row of an order that holds a slot already (its submission's retry took one at the door
    # before it joined again): dropped, and the order told again (a copy of its admission is dropped)
    held = tuple(w for w in waiters if w.order_id in holders and w not in dropped)
    deletes = (*dropped, *held, *taken)[:MAX_ADMITTED]
    if after.holders == room.holders and after.cap == room.cap:
        return Admission(None, deletes, held) if deletes else Admission(None)
    return Admission(after, deletes, (*held, *taken))


def watch_due(now: datetime) -> datetime:
    """The room watch's due time: the end of the window of WATCH_PERIOD after now's."""
    period = WATCH_PERIOD.total_seconds()
    ts = now.timestamp()
    end = (int(ts // period) + 2) * period
    return datetime.fromtimestamp(end, tz=now.tzinfo)


def watch_row_key(partition: str, due: datetime) -> str:
    """``room:{partition}:{due}`` in the deadline index (no OrderId)."""
    return f"{WATCH_PREFIX}{partition}:{due.strftime('%Y%m%dT%H%M%S%f')}"


def watch_of(row_key: str) -> str | None:
    """The room partition a watch row names (None: not a room watch)."""
    if not row_key.startswith(WATCH_PREFIX):
        return None
    parts = row_key.split(":")
    return parts[1] if len(parts) == 3 and parts[1].startswith(ROOM_PREFIX) else None


# The room row keeps every holder's id and time in one property (64 KiB, about 70 characters each).
MAX_CAP = 400


class CapError(ValueError):
    """``CustomerMaxInFlight`` is not a cap: ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def customer_cap(text: str | None) -> int:
    """``CustomerMaxInFlight``: a whole number from 1 to MAX_CAP, or 0 or empty for no cap."""
    raw = (text or "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise CapError(f"{raw!r} is not a whole number (a cap from 1 to {MAX_CAP}, or 0 or empty for none)")
    cap = int(raw)
    if cap > MAX_CAP:
        raise CapError(f"{cap} is more than {MAX_CAP} (the room row keeps every holder's id in one property)")
    return cap
