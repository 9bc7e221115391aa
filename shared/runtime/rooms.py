"""A customer's room's moves (``shared.core.room``): reads, ETag-conditioned writes of the room's
partition, and the admissions they owe, sent after the write that gave the slots.

* :func:`enter`: a submission at the door, before its order is written (a slot, or it waits).
* :func:`join`: an order that waits joins the waiters (``JoinRoom``, after its state write).
* :func:`leave`: an ended order gives its slot back (``LeaveRoom``, after its state write).
* :func:`reconcile`: the room's watch (the Supervisor): slots of ended orders freed, admissions
  re-sent, free slots given to the oldest waiters.

Every write is one entity-group transaction conditioned on the room row's ETag (and the deleted
waiters'): a lost race reads again and decides again. Each move is idempotent: a copy of a join
finds its row, a copy of a leave finds no slot to give back, an admission sent twice has one id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from shared.core.effects import JoinRoom, LeaveRoom, bucket_of
from shared.core.messages import Bus
from shared.core.room import (
    MAX_CAP,
    ORPHAN_HOLDER_AGE,
    WATCH_PERIOD,
    Room,
    Waiter,
    admit,
    watch_due,
    watch_row_key,
)
from shared.core.room import (
    enter as decide_entry,
)
from shared.core.rows import ORDER_ROW, STATE_ROW, IndexRow, Op, OrderRow, StateRow
from shared.core.statemachine.outbox import admission_message
from shared.core.statemachine.search_index import category_of
from shared.core.states import Category
from shared.observability import telemetry
from shared.observability.logs import log_event
from shared.storage.store import Conflict, Store

ROUNDS = 20  # read-decide-write rounds before giving up (each lost round: another instance moved the room)
READ_WAITERS = 20  # waiters read with the room row (ONE query): more than a move frees, most of the time


class RoomBusy(RuntimeError):
    """Every round of a move lost its race (the message is redelivered, or the watch does it)."""


def read_room(store: Store, partition: str, waiters: int = READ_WAITERS) -> tuple[Room, list[Waiter]]:
    """The room row and its oldest ``waiters`` waiters: ONE query of the partition's first rows."""
    return Room.from_rows(partition, store.read_rows(partition, 1 + waiters))


def enter(store: Store, partition: str, order_id: str, cap: int, now: datetime) -> bool:
    """A new order at its customer's room: True when it holds a slot (written here, before its
    order: a crash in between leaves a slot whose order never came, which the watch frees after
    ``ORPHAN_HOLDER_AGE``; its Idempotency-Key's retry finds it held). False: it waits."""
    for _ in range(ROUNDS):
        room, waiters = read_room(store, partition, 1)
        entry = decide_entry(room, waiters, order_id, cap, now)
        if entry.write is None:
            return entry.admitted
        try:
            store.transact(partition, [entry.write.write()])
            return True
        except Conflict:
            continue
    return False  # it waits, and is admitted in its turn: never more than the cap


def move(store: Store, bus: Bus, partition: str, now: datetime, *, leaving: Iterable[str] = (),
         gone: Iterable[str] = (), cap: int | None = None) -> tuple[Waiter, ...]:
    """Slots of ``leaving`` given back, ``gone`` waiters dropped, the oldest waiters admitted into
    the free slots (written first, then told). Returns the admitted."""
    leaving, gone = tuple(leaving), tuple(gone)
    for _ in range(ROUNDS):
        room, waiters = read_room(store, partition)
        decided = admit(room, waiters, now, leaving=leaving, gone=gone, cap=cap)
        ops = decided.ops()
        if not ops:
            return ()
        try:
            store.transact(partition, ops)
        except Conflict:
            continue
        # Crash after the write, before these: the admitted hold slots but wait; the room's watch
        # (the room has had waiters, so it has one) sends their admissions again.
        tell(bus, decided.admitted)
        return decided.admitted
    raise RoomBusy(f"room {partition}: {ROUNDS} writes lost their race")


def tell(bus: Bus, admitted: Sequence[Waiter], again: str = "") -> None:
    """The admissions (not critical: the watch re-sends one that is lost)."""
    for w in admitted:
        try:
            telemetry.send(bus, admission_message(w.order_id, w.queue, w.traceparent, again))
        except Exception as exc:  # noqa: BLE001 - the room's watch re-sends it
            log_event(logging.WARNING, "room.admission_failed", order_id=w.order_id, error=repr(exc))


def put_watch(store: Store, partition: str, now: datetime) -> None:
    """The room's watch row, due at the end of the next window (every waiter of one window puts the
    same row: an upsert)."""
    due = watch_due(now)
    store.put_index(IndexRow(bucket_of(due), watch_row_key(partition, due), None, due))


def join(store: Store, bus: Bus, eff: JoinRoom) -> None:
    """``JoinRoom``: the watch row, the waiter row (a copy finds it there), then the oldest waiters
    admitted if a slot freed since the order was turned away."""
    # Crash after this: the watch reconciles a room that may have no waiter yet (nothing to do).
    put_watch(store, eff.partition, eff.at)
    waiter = Waiter(eff.row_key, eff.order_id, eff.queue, eff.traceparent)
    try:
        store.transact(eff.partition, [Op("create", waiter.to_props())])
    except Conflict:
        pass  # joined already (a copy of this join)
    # Crash before this: the slot that freed meanwhile is given by the watch.
    move(store, bus, eff.partition, eff.at, cap=eff.cap)


def leave(store: Store, bus: Bus, eff: LeaveRoom) -> None:
    """``LeaveRoom``: the order's slot (or its place among the waiters) given back, the oldest
    waiters admitted into the free slots."""
    now = eff.at or datetime.now(UTC)
    move(store, bus, eff.partition, now, leaving=[eff.order_id], gone=[eff.order_id])
    if eff.row_key is not None:
        # It waited still (cancelled or terminated before its turn), perhaps behind the waiters read.
        try:
            store.transact(eff.partition, [Op("delete", {"RowKey": eff.row_key}, etag="*")])
        except Conflict:
            pass  # not there: dropped by the move above, or never written


def reconcile(store: Store, bus: Bus, partition: str, cap: int, lane_queue: Callable[[str | None], str],
              now: datetime) -> str:
    """The room's watch: a slot whose order ended (or never came, after ``ORPHAN_HOLDER_AGE``) is
    freed, an admitted order still waiting is told again, the free slots go to the oldest waiters;
    while waiters remain or a holder has not started (one it admitted among them), the next watch
    is put. ``cap``: the setting (0: none, every waiter is
    admitted). Returns what it did (for the sweep's report)."""
    room, waiters = read_room(store, partition)
    leaving: list[str] = []
    owed: list[Waiter] = []
    unstarted = 0  # holders kept and not started yet (admitted, or their submission's): watched until they start
    for order_id, since in room.holders.items():
        state = _state(store, order_id)
        if state is None:  # its submission's, perhaps still under way
            if now - since > ORPHAN_HOLDER_AGE:
                leaving.append(order_id)
            else:
                unstarted += 1
        elif state.room != partition or category_of(state) is not Category.IN_FLIGHT:
            leaving.append(order_id)
        elif state.waits_for_room:
            unstarted += 1
            if now - since >= WATCH_PERIOD:
                # admitted a watch period ago and not started: its admission was lost (a crash
                # between the room's write and the send, or a dead-lettered message)
                waiter = _admission_of(store, order_id, lane_queue)
                if waiter is not None:
                    owed.append(waiter)
    # Crash after this: admissions re-sent, nothing else changed; the next watch does the rest.
    tell(bus, owed, again=f"w{now.strftime('%Y%m%dT%H%M%S')}")
    admitted = move(store, bus, partition, now, leaving=leaving, cap=cap or MAX_CAP)
    left = len(waiters) - len(admitted)
    # Watched again while a waiter is left or a holder has not started: one it kept, or one it just
    # admitted (its admission's send may have failed: the next watch tells it again).
    if left > 0 or unstarted > 0 or admitted or len(waiters) >= READ_WAITERS:
        put_watch(store, partition, now)
    verdict = "freed" if leaving else "admitted" if admitted else "resent" if owed else "idle"
    if leaving or admitted or owed:
        log_event(logging.WARNING if leaving or owed else logging.INFO, "room.reconciled", room=partition,
                  freed=leaving, admitted=[w.order_id for w in admitted], resent=[w.order_id for w in owed])
    return verdict


def _admission_of(store: Store, order_id: str, lane_queue: Callable[[str | None], str]) -> Waiter | None:
    """An order's admission, from its order row (its lane's scheduler queue and its trace)."""
    entity = store.read_row(order_id, ORDER_ROW)
    if entity is None:
        return None
    order = OrderRow.from_entity(entity)
    return Waiter("", order_id, lane_queue(order.priority), order.traceparent or None)


def _state(store: Store, order_id: str) -> StateRow | None:
    entity = store.read_row(order_id, STATE_ROW)
    return StateRow.from_entity(entity) if entity is not None else None
