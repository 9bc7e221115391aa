"""The executor: the effects of one decision (``shared.core.effects``), performed in order.

It runs them one by one and stops at the first lost race. Running only the first ``limit`` of
them is exactly what a crash after that effect leaves behind (the crash-point tests do that).

Telemetry is added here, at the boundary, never in the core: every message carries the
context of the span that sends it (``shared.observability.telemetry.send``); a committed
transaction's history events feed the metrics and the console's figures; alerts are counted.

Failure handling per effect:

* ``PutIndex`` / ``PutWatch`` / ``Transact`` / critical ``Send``: an exception propagates (the trigger's
  message is abandoned and redelivered; the handler is idempotent and resumes from the store).
* ``Transact`` losing its ETag condition (``Conflict``): a lost race. Nothing after it runs;
  the outcome says so.
* ``Reindex`` (the search index, after the state write): a failure is logged, and the
  ``DeleteIndex`` effects after it are skipped (the Supervisor re-indexes from the kept row).
* A ``Send`` with a ``fence`` (an agent request): each committed ``Transact`` is recorded with the
  ETags the store returned, and ``shared.core.fence`` builds the fencing token of the request's
  rows overlaid with those (MAC'd with ``keys``) and puts it in the body; when no ETag can be
  vouched for, the request goes without one (the reply path then reads).
* Non-critical ``Send`` (status, schedule notices that an index row backs up), ``Alert``,
  ``DeleteIndex`` and ``ForgetWaiting``: a failure is logged and the rest goes on.
* ``JoinRoom`` / ``LeaveRoom`` (a customer's room, ``shared.runtime.rooms``, after the state write):
  a failure is logged and the ``DeleteIndex`` effects after it are skipped, as after a ``Reindex``'s:
  the order's deadline row is kept, and the Supervisor joins or leaves for it when it falls due.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.core import fence
from shared.core.effects import (
    Alert,
    DeleteIndex,
    Effect,
    ForgetWaiting,
    JoinRoom,
    LeaveRoom,
    Log,
    PutIndex,
    PutWatch,
    Reindex,
    Send,
    Transact,
)
from shared.core.messages import Bus
from shared.core.sealed import Keys
from shared.observability import metrics, telemetry
from shared.observability.figures import record_committed
from shared.observability.logs import log_event
from shared.runtime import rooms
from shared.storage.store import Conflict, Store
from shared.storage.waiting import forget_rows


@dataclass
class Outcome:
    applied: int = 0
    lost_race: bool = False
    failed_sends: list[str] = field(default_factory=list)
    index_failed: bool = False  # a Reindex failed: the deadline row is kept for the Supervisor


@dataclass
class _Run:
    """One run of a decision's effects: where they go, and what happened so far."""

    store: Store
    bus: Bus
    keys: Keys
    out: Outcome = field(default_factory=Outcome)
    written: fence.Written = field(default_factory=fence.Written)

    def put_index(self, eff: PutIndex) -> None:
        self.store.put_index(eff.row)

    def delete_index(self, eff: DeleteIndex) -> None:
        if self.out.index_failed:  # kept: the sweep re-indexes the order when it deletes the row
            return
        try:
            self.store.delete_index(eff.bucket, eff.row_key)
        except Exception as exc:  # lazily deleted by the sweep anyway
            log_event(logging.WARNING, "index.delete_failed", row=eff.row_key, error=repr(exc))

    def transact(self, eff: Transact) -> bool:
        """False when the transaction lost its race (nothing after it may run)."""
        try:
            etags = self.store.transact(eff.order_id, eff.ops)
        except Conflict as exc:
            self.out.lost_race = True
            log_event(logging.INFO, "state.lost_race", order_id=eff.order_id, note=eff.note, detail=str(exc))
            return False
        self.written.record(eff, etags)
        record_committed(self.store, metrics.record_committed(eff.ops))
        return True

    def reindex(self, eff: Reindex) -> None:
        try:
            self.store.write_index(eff.puts, eff.deletes, stale=eff.stale)
        except Exception as exc:
            self.out.index_failed = True
            log_event(logging.WARNING, "index.write_failed", order_id=eff.order_id, error=repr(exc))

    def forget_waiting(self, eff: ForgetWaiting) -> None:
        try:
            forget_rows(self.store, eff.remote, [(eff.row_key, "*")])
        except Exception as exc:  # a stale resume or the closer forgets it later
            log_event(logging.WARNING, "waiting.forget_failed", remote=eff.remote, row=eff.row_key, error=repr(exc))

    def room(self, eff: JoinRoom | LeaveRoom) -> None:
        try:
            if isinstance(eff, JoinRoom):
                rooms.join(self.store, self.bus, eff)
            else:
                rooms.leave(self.store, self.bus, eff)
        except Exception as exc:  # the order's deadline row is kept: the Supervisor does it
            self.out.index_failed = True
            log_event(logging.WARNING, "room.move_failed", order_id=eff.order_id, room=eff.partition,
                      move=type(eff).__name__, error=repr(exc))

    def send(self, eff: Send) -> None:
        message = eff.message if eff.fence is None else fence.fenced(self.keys, eff.message, eff.fence, self.written)
        try:
            telemetry.send(self.bus, message)
        except Exception as exc:
            if eff.critical:
                raise
            self.out.failed_sends.append(eff.message.message_id)
            log_event(logging.WARNING, "send.failed", order_id=eff.message.body.get("orderId"),
                      queue=eff.message.queue, messageId=eff.message.message_id, what=eff.what, error=repr(exc))

    def alert(self, eff: Alert) -> None:
        log_event(logging.ERROR, "alert", order_id=eff.order_id, traceparent=eff.traceparent,
                  step=eff.step, reason=eff.reason, failureCount=eff.failure_count)
        metrics.alerts.add(1, {"step": eff.step or ""})
        try:
            telemetry.send(self.bus, eff.message)
        except Exception as exc:
            self.out.failed_sends.append(eff.message.message_id)
            log_event(logging.ERROR, "alert.send_failed", order_id=eff.order_id, error=repr(exc))

    def log(self, eff: Log) -> None:
        log_event(eff.level, eff.event, order_id=eff.order_id, traceparent=eff.traceparent, **eff.fields)


def execute(effects: Sequence[Effect], store: Store, bus: Bus, *, keys: Keys, limit: int | None = None) -> Outcome:
    """Run ``effects`` in order (only the first ``limit`` of them: a simulated crash); ``keys``
    MAC the fencing tokens of agent requests."""
    run = _Run(store, bus, keys)
    for n, eff in enumerate(effects):
        if limit is not None and n >= limit:
            break
        match eff:
            case Transact():
                if not run.transact(eff):
                    run.out.applied = n
                    return run.out
            case PutIndex():
                run.put_index(eff)
            case PutWatch():
                store.put_index(eff.row)
            case DeleteIndex():
                run.delete_index(eff)
            case Reindex():
                run.reindex(eff)
            case ForgetWaiting():
                run.forget_waiting(eff)
            case JoinRoom() | LeaveRoom():
                run.room(eff)
            case Send():
                run.send(eff)
            case Alert():
                run.alert(eff)
            case Log():
                run.log(eff)
            case _:
                raise TypeError(f"unknown effect {eff!r}")
        run.out.applied = n + 1
    return run.out
