"""The Supervisor's sweep: reads only the deadline index rows that are due.

Cost: a sweep queries ``DeadlineTable`` for ``PartitionKey le @bucket`` (the current due
minute's last shard, ``due_bound``; a parameterised filter), i.e. only rows due by now (plus not-yet-due rows of the
current minute, skipped). Finished orders have no index row (deleted by their last
transition, or lazily here), so a sweep never reads them. For each due row it point-reads
the order's state row: a finished order's row is deleted, the row of an order slower than
the row is moved to a later due, and only when the order's deadline has passed does it read
the partition and act (``shared.core.statemachine``, "The deadline index"). Every action is
ETag-conditional: a lost race (another supervisor, a late reply, a claim) means skip, so two
supervisors never count one failure twice. Before it deletes the row of an order that ended
(or is held), it rewrites the order's search index rows from its state: the last transition
deletes the row only after its own index write, so a row still here may mean that write was
lost in a crash.

Breakers: a row of the index may be a circuit breaker's *watch* (``shared.core.breaker.watch``), put
by the instance that opened it; a due watch is the only time a sweep reads a breaker
(``shared.supervisor.breakers.handle_watch``), apart from one pass over every breaker at the
process's first sweep. So a sweep with nothing due is the one index query.

Latency: due rows are handled by a small thread pool (each is a few round trips, all I/O),
and a sweep stops taking new rows after a time budget, so a burst of expiries (an outage, a
killed instance) never holds every other recovery behind one sweep of minutes; rows left
over stay due and the next tick takes them. Rows of the same order may be handled at once:
their writes are ETag-conditional, so one wins and the other counts a lost race.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from shared.core.breaker.watch import Watch
from shared.core.effects import PutIndex, due_bound
from shared.core.operations import OperationWatch
from shared.core.room import watch_of
from shared.core.rows import STATE_ROW
from shared.core.statemachine import (
    KEEP_TELEMETRY,
    IndexRow,
    IndexVerdict,
    StateRow,
    Verdict,
    decide_expired,
    decide_for_order,
    index_verdict,
)
from shared.core.statemachine.admission import join_room
from shared.core.webhooks import HookWatch
from shared.core.workflows.catalog import AGENTS
from shared.observability import metrics, telemetry
from shared.observability.figures import record_sweep
from shared.observability.logs import log_event
from shared.runtime import Runtime
from shared.runtime.bulk import handle_watch as handle_operation
from shared.runtime.reindex import reindex_from_state
from shared.runtime.rooms import reconcile
from shared.runtime.webhooks import handle_watch as handle_webhook_watch
from shared.storage.views import read_view
from shared.supervisor.breakers import full_pass, handle_watch

DEFAULT_BATCH = 500
SWEEP_WORKERS = 8
SWEEP_BUDGET_SECONDS = 10.0


@dataclass
class SweepReport:
    seen: int = 0
    acted: dict[str, int] = field(default_factory=dict)
    deleted: int = 0
    kept: int = 0
    moved: int = 0  # rows of orders slower than their row: a later row put, this one deleted
    lost_races: int = 0
    errors: int = 0
    deferred: int = 0  # due rows left for the next tick (time budget spent)
    breakers: dict[str, int] = field(default_factory=dict)  # due breaker watches, by verdict
    operations: dict[str, int] = field(default_factory=dict)  # due bulk operation watches, by what was done
    webhooks: dict[str, int] = field(default_factory=dict)  # due webhook delivery watches, by what was done
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_breaker(self, verdict: str) -> None:
        with self._lock:
            self.breakers[verdict] = self.breakers.get(verdict, 0) + 1

    def count_webhook(self, verdict: str) -> None:
        with self._lock:
            self.webhooks[verdict] = self.webhooks.get(verdict, 0) + 1

    def count_operation(self, verdict: str) -> None:
        with self._lock:
            self.operations[verdict] = self.operations.get(verdict, 0) + 1

    def count(self, name: str, verdict: str | None = None) -> None:
        with self._lock:
            if verdict is not None:
                self.acted[verdict] = self.acted.get(verdict, 0) + 1
            else:
                setattr(self, name, getattr(self, name) + 1)


def sweep(rt: Runtime, *, limit: int = DEFAULT_BATCH, workers: int = SWEEP_WORKERS,
          budget_seconds: float = SWEEP_BUDGET_SECONDS) -> SweepReport:
    """One sweep, in its own span (each redrive is a span of its order's trace, linked to it);
    its duration and the due rows it read are recorded (``shared.observability.metrics``)."""
    started = time.monotonic()
    with telemetry.tracer().start_as_current_span("supervisor.sweep") as span:
        _first_breaker_pass(rt)
        report = _sweep(rt, limit, workers, budget_seconds)
        span.set_attribute("orders.supervisor.due_rows", report.seen)
    metrics.sweep_duration.record(time.monotonic() - started)
    metrics.due_rows.record(report.seen)
    record_sweep(rt.store, report.seen)
    return report


# stores this process has run the full breaker pass on, by id (a TableStore is an unhashable dataclass;
# a store that is gone drops out, so a new one that gets its id is not taken for it)
_passed: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_passed_lock = threading.Lock()


def _first_breaker_pass(rt: Runtime) -> None:
    """Once per store and process, before its first sweep: read every breaker, watch the ones
    not closed and resume what waits on closed ones (``shared.supervisor.breakers.full_pass``).
    After that, breakers are looked at only when their watch rows fall due."""
    with _passed_lock:
        if _passed.get(id(rt.store)) is rt.store:
            return
        try:
            full_pass(rt.store, rt.bus, rt.config.queues["SchedulerQueue"], [a.name for a in AGENTS], rt.ctx().now)
        except Exception as exc:  # noqa: BLE001 - the next run tries again; the sweep goes on
            log_event(logging.ERROR, "supervisor.breaker_recovery_failed", error=repr(exc))
            return
        _passed[id(rt.store)] = rt.store


def _handle_watch(rt: Runtime, watch: Watch, now: datetime, report: SweepReport) -> None:
    """A due breaker watch (``shared.supervisor.breakers.handle_watch``)."""
    verdict, _sent = handle_watch(rt.store, rt.bus, rt.config.queues["SchedulerQueue"], watch, now)
    report.count_breaker(verdict.value)


def _joined(rt: Runtime, order_id: str, report: SweepReport) -> bool:
    """An order accepted over its customer's cap whose submission died before (or while) it joined
    the waiters: joined now (a copy finds its row there); its deadline row may then go (the room's
    watch covers it). False: the row stays for the next sweep."""
    view = read_view(rt.store, order_id)
    if view.state is None or not view.state.waits_for_room:
        report.count("kept")  # it moved on meanwhile: the next sweep sees it as it is
        return False
    # Joining reads no workflow (its lane and the cap are settings): an order whose version is no
    # longer loaded joins all the same, and is held with the reason once admitted.
    if rt.run([join_room(view, rt.ctx())]).index_failed:
        report.count("kept")
        return False
    report.count("acted", "joinedRoom")
    return True


def _handle_room_watch(rt: Runtime, partition: str, row: IndexRow, now: datetime, report: SweepReport) -> None:
    """A due room watch: the room reconciled (the next watch put first, if it still has waiters),
    then this row deleted. Crash before the delete: the row stays due, and the next sweep
    reconciles again (nothing to do twice)."""
    if row.due is not None and row.due > now:
        report.count("kept")
        return
    lane_queue = partial(rt.config.lane_queue, "SchedulerQueue")
    verdict = reconcile(rt.store, rt.bus, partition, rt.config.customer_max_in_flight, lane_queue, now)
    report.count("acted", f"room.{verdict}")
    rt.store.delete_index(row.bucket, row.row_key)


def _sweep(rt: Runtime, limit: int, workers: int, budget_seconds: float) -> SweepReport:
    now = rt.ctx().now
    report = SweepReport()
    bucket = due_bound(now)
    deadline = time.monotonic() + budget_seconds

    def handle(row: IndexRow) -> None:
        if time.monotonic() > deadline:
            report.count("deferred")  # still due: the next tick takes it
            return
        try:
            _handle_due_row(rt, row, now, report)
        except Exception as exc:  # one bad row must not stop the sweep; it stays for next time
            report.count("errors")
            log_event(logging.ERROR, "supervisor.row_failed", order_id=row.order_id, row=row.row_key,
                      error=repr(exc))

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="sweep") as pool:
        futures = []
        for row in rt.store.due_index(bucket, limit):
            report.seen += 1
            futures.append(pool.submit(contextvars.copy_context().run, handle, row))  # in the sweep's span
    for f in futures:
        f.result()  # handle() keeps ordinary errors; anything else (an abort) propagates as before
    if (report.acted or report.errors or report.lost_races or report.deferred or report.breakers or report.operations
            or report.webhooks):
        log_event(logging.INFO, "supervisor.sweep", seen=report.seen, acted=report.acted, deleted=report.deleted,
                  moved=report.moved, breakers=report.breakers, operations=report.operations, webhooks=report.webhooks,
                  lostRaces=report.lost_races, errors=report.errors, deferred=report.deferred)
    return report


def _handled_as_watch(rt: Runtime, row: IndexRow, now: datetime, report: SweepReport) -> bool:
    """A watch row (a breaker's, a customer's room's, a webhook delivery's, a bulk operation's
    next slice) handled; False for any other row (an order's deadline)."""
    watch = Watch.from_row(row.row_key, row.due)
    if watch is not None:
        _handle_watch(rt, watch, now, report)
        return True
    room = watch_of(row.row_key)
    if room is not None:  # a customer's room with waiters (``shared.runtime.rooms.reconcile``)
        _handle_room_watch(rt, room, row, now, report)
        return True
    hook = HookWatch.from_row(row.row_key, row.due)
    if hook is not None:  # a webhook delivery's watch (``shared.runtime.webhooks``)
        if row.due is not None and row.due > now:
            report.count("kept")
        else:
            report.count_webhook(handle_webhook_watch(rt, hook, now))
        return True
    operation = OperationWatch.from_row(row.row_key, row.due)
    if operation is not None:  # a bulk operation's next slice (``shared.runtime.bulk``)
        report.count_operation(handle_operation(rt, operation, now))
        return True
    return False


def _handle_due_row(rt: Runtime, row: IndexRow, now: datetime, report: SweepReport) -> None:
    if _handled_as_watch(rt, row, now, report):
        return
    if not row.order_id or row.due is None:
        rt.store.delete_index(row.bucket, row.row_key)
        report.count("deleted")
        return
    if row.due > now:  # the current minute's rows that are not due yet: no state read
        report.count("kept")
        return
    entity = rt.store.read_row(row.order_id, STATE_ROW)
    state = StateRow.from_entity(entity) if entity is not None else None
    verdict = index_verdict(state, row.due, now)
    if verdict is IndexVerdict.KEEP:
        report.count("kept")
        return
    if verdict is IndexVerdict.DELETE and state is not None:
        # The order ended (or is held) but its row is still here: the index write of its last
        # transition may have been lost with it (it runs before the row's delete). Redo it.
        if not reindex_from_state(rt, row.order_id, leave=True):
            report.count("kept")  # the rewrite failed too: the row stays for the next sweep
            return
    if verdict is IndexVerdict.JOIN and not _joined(rt, row.order_id, report):
        return
    if verdict is IndexVerdict.MOVE:
        # The order is slower than its row: a later row covers its deadline (put first;
        # ``now`` is the sweep's start, before the read, so the row is never too late).
        assert state is not None and state.complete_by is not None
        rt.run([PutIndex(row.order_id, min(state.complete_by, now + rt.config.index_floor()), note="moved")])
        report.count("moved")
    elif verdict is IndexVerdict.ACT:
        view = read_view(rt.store, row.order_id)
        with telemetry.order_span("supervisor.redrive", view.traceparent, **{"orders.order_id": row.order_id}):
            decision = decide_for_order(view, rt.ctx(), partial(decide_expired, view))
            with telemetry.kept(decision.verdict, decision.verdict in KEEP_TELEMETRY):
                outcome = rt.run(decision.effects)
        if outcome.lost_race:
            report.count("lost_races")  # someone else moved the order on: the row stays due; next sweep
            return
        if decision.verdict is Verdict.NOT_DUE:
            report.count("moved")  # the order moved on between the two reads; its row was put
        elif decision.verdict is not Verdict.OBSOLETE:
            report.count("acted", decision.verdict)
        if outcome.index_failed:  # kept: the next sweep finds the order ended and re-indexes it
            return
    # This row is done: the order has no deadline, or a row covering it was put above
    # (a later due, so never this row's key).
    rt.store.delete_index(row.bucket, row.row_key)
    report.count("deleted")
