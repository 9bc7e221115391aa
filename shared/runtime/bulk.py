"""A bulk operation's work (``shared.core.operations``): act on its next slice of orders, and the
Supervisor's handling of its watch. The start and the HTTP side are ``shared.api.bulk``.

A slice: read the header (ETag) and the id chunk(s) it needs, act on each order in turn (a
fresh read, the core's decision, its one transaction, the order's own race retried a few times),
then write the header forward, conditionally. Two slices of one operation at once (the start and
a tick, two Supervisors) act on the same orders at most once each, since the action's transaction
keeps the operation id on the order and a second pass reads it there; one header write wins and
the other is dropped, with counts that the winner's pass already holds.

Pacing: one slice per Supervisor tick (``BulkOrdersPerTick``, default 100 every 15 s), one order
at a time, and never more orders than leave ``BulkMaxInFlight`` (5) orders in flight in all, live
traffic's included (one count of the search index's in-flight rows per slice, capped there). A
slice acts on what room there is, so a bulk retry yields to live traffic instead of queueing ahead
of it (docs/operating.md, "Bulk operations"). Only an order acted on now takes room: one an earlier
pass already did (after a crash) or one refused puts nothing new in flight.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from shared.core.operations import (
    CHUNK,
    HEADER_ROW,
    STRAY_AFTER,
    Operation,
    OperationWatch,
    acted,
    chunk_row_key,
    ids_of,
    partition_of,
)
from shared.core.rows import ETAG, Op
from shared.core.statemachine import Rejected, bound
from shared.core.statemachine.actions import ACTIONS
from shared.core.states import Category
from shared.core.workflows import UnknownWorkflow
from shared.observability.logs import log_event
from shared.runtime import Runtime
from shared.storage.store import Conflict
from shared.storage.views import read_view

RACE_RETRIES = 3


@dataclass(frozen=True)
class Slice:
    """What one pass did: the header as written (or as read, when nothing was left or it lost)."""

    operation: Operation | None
    acted_on: int = 0
    lost: bool = False


def read_operation(rt: Runtime, operation_id: str) -> Operation | None:
    entity = rt.store.read_row(partition_of(operation_id), HEADER_ROW)
    return Operation.from_entity(operation_id, entity, entity.get(ETAG)) if entity is not None else None


ALREADY = "already"  # ``act_on``: done by an earlier pass of the operation (nothing new was put in flight)


def act_on(rt: Runtime, op: Operation, order_id: str) -> str | None:
    """``op``'s action on one order: None when done now, ``ALREADY`` when an earlier pass of ``op`` did
    it, else why not."""
    for _ in range(RACE_RETRIES):
        view = read_view(rt.store, order_id)
        if view.state is None:
            return "no such order (purged since the search matched it)"
        if acted(view.state.operations, op.operation_id):
            return ALREADY
        try:
            decision = ACTIONS[op.action](view, bound(view, rt.ctx(actor=op.by, operation=op.operation_id)))
        except UnknownWorkflow as exc:
            return f"{exc}: deploy its workflow file again first"
        except Rejected as exc:
            return str(exc)
        if not rt.run(decision.effects).lost_race:
            return None
    return "the order kept changing; try again"


def room_in_flight(rt: Runtime) -> int:
    """How many more orders may be put in flight now: ``BulkMaxInFlight`` less those in flight
    (one RowKey-only count of the search index, up to that cap)."""
    cap = rt.config.bulk_max_in_flight
    in_flight, _more = rt.store.count_index(f"cat-{Category.IN_FLIGHT}-", f"cat-{Category.IN_FLIGHT}.", cap)
    return cap - in_flight


def advance(rt: Runtime, operation_id: str, limit: int | None = None) -> Slice:
    """Act on the next slice (at most ``limit`` orders, default ``BulkOrdersPerTick``) of the operation."""
    op = read_operation(rt, operation_id)
    if op is None or op.state == "done":
        return Slice(op)
    room = room_in_flight(rt)
    if room <= 0:
        return Slice(op)  # the system is busy: this slice waits for the next tick
    end = min(op.matched, op.next + (limit or rt.config.bulk_slice))
    partition = partition_of(operation_id)
    ids: list[str] = []
    for chunk in range(op.next // CHUNK, (end - 1) // CHUNK + 1):
        ids += ids_of(rt.store.read_row(partition, chunk_row_key(chunk)))[max(0, op.next - chunk * CHUNK):]
    outcomes: list[tuple[str, str | None]] = []
    for order_id in ids[:end - op.next]:
        if room <= 0:
            break  # only an order acted on now takes room: one an earlier pass did, or one refused, does not
        outcome = act_on(rt, op, order_id)
        if outcome is None:
            room -= 1
        outcomes.append((order_id, None if outcome == ALREADY else outcome))
    todo = [order_id for order_id, _ in outcomes]
    moved = op.advanced(len(todo), outcomes, rt.clock())
    try:
        etags = rt.store.transact(partition, [Op("replace", moved.to_entity(), etag=op.etag)])
    except Conflict:
        return Slice(read_operation(rt, operation_id), len(todo), lost=True)
    if moved.state == "done":
        log_event(logging.INFO, "operation.done", operationId=operation_id, action=op.action, by=op.by,
                  matched=op.matched, succeeded=moved.succeeded, failed=moved.failed)
    return Slice(Operation.from_entity(operation_id, moved.to_entity(), etags.get(HEADER_ROW)), len(todo))


def handle_watch(rt: Runtime, watch: OperationWatch, now: datetime) -> str:
    """A due operation watch: act on the next slice, and watch again while work is left. Returns
    what it did (``advanced``, ``done``, ``waiting`` for a start still writing, ``stray``)."""
    old = watch.row
    if watch.due > now:
        return "kept"
    done = advance(rt, watch.operation_id)
    if done.operation is None:
        if now - watch.due < STRAY_AFTER:
            return "waiting"  # the start may still be writing its rows: look again next tick
        rt.store.delete_index(old.bucket, old.row_key)  # a start that died before its transaction
        return "stray"
    if done.operation.state != "done":
        # the next tick takes it; a later instant than the old one, so a new key (put first, then delete)
        rt.store.put_index(OperationWatch(watch.operation_id, max(now, watch.due + timedelta(microseconds=1))).row)
    rt.store.delete_index(old.bucket, old.row_key)
    return "advanced" if done.operation.state != "done" else "done"
