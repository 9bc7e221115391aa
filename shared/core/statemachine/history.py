"""Every order's story: immutable history events, written with the change they record.

Each state change appends its events (``EventRow``, RowKey ``history-NNNNNNNN``) to the
order's partition IN THE SAME entity-group transaction as the state row it changes, and
bumps the state row's ``EventSeq``. So there is no extra table request on the forward path,
an event exists if and only if its change committed, and two racing writers can never write
the same event twice: the loser's transaction (state ETag, and the create of the same
``history-N``) fails as a whole. Events are never rewritten; retention deletes them with
their order.

The forward path reads an order's partition from ``order`` on (``shared.storage.store``), so a long
history costs it nothing; ``GET /api/orders/{id}`` pages through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from shared.core.effects import Transact
from shared.core.jsonio import present
from shared.core.operations import remember
from shared.core.rows import EventRow, Op, StateRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.view import View
from shared.core.workflows.bounds import MAX_EVENTS_PER_WRITE

# A transaction holds at most 100 entities: the state row, every step row of the workflow and
# the events of one decision must fit (the loader rejects a workflow that would not: ``bounds``).


class EventKind(StrEnum):
    ACCEPTED = "accepted"
    DISPATCHED = "dispatched"
    STEP_DONE = "stepDone"
    STEP_FAILED = "stepFailed"
    REDRIVEN = "redriven"
    RESCHEDULED = "rescheduled"
    ALERT = "alert"
    COMPENSATION_DISPATCHED = "compensationDispatched"
    COMPENSATION_DONE = "compensationDone"
    COMPENSATION_FAILED = "compensationFailed"
    COMPENSATION_REDRIVEN = "compensationRedriven"
    HELD = "held"
    PROCESSED = "processed"
    FAILED = "failed"
    COMPENSATED = "compensated"
    RETRIED = "retried"
    RESTARTED = "restarted"
    CANCELLED = "cancelled"
    TERMINATED = "terminated"
    STEP_WAITING = "stepWaiting"  # the remote's breaker is open: the step waits (once per wait, not per probe)
    RESUMED = "resumed"  # a step's wait ended: the breaker closed (or its probe answered)
    SUSPENDED = "suspended"  # an operator suspended the order: no new step is dispatched
    UNSUSPENDED = "unsuspended"  # an operator resumed a suspended order
    EVENT_RECEIVED = "eventReceived"  # a wait step's event came (``kept``: before the step started)
    WAIT_TIMED_OUT = "waitTimedOut"  # a wait step's event did not come in time: its onTimeout applies
    WAITING_ROOM = "waitingRoom"  # accepted over its customer's CustomerMaxInFlight: waits for a slot
    ADMITTED = "admitted"  # a slot in its customer's room freed: the order starts (its first step dispatched)


@dataclass(frozen=True)
class Event:
    """One event a decision records (the row is made by :func:`commit`)."""

    kind: EventKind
    step: str | None = None
    attempt: int | None = None
    detail: dict[str, Any] | None = None


def event(kind: EventKind, step: str | None = None, attempt: int | None = None, **detail: Any) -> Event:
    """An event; ``detail`` keeps only the values that are set."""
    kept = present(detail)
    return Event(kind, step, attempt, kept or None)


def commit(view: View, new_state: StateRow, ops: Iterable[Op], events: Sequence[Event], ctx: Ctx, *,
           note: str, waiting_on: str | None = None) -> Transact:
    """The ONE transaction of a decision: ``new_state`` over the state row the decision read
    (ETag; created when the view has none), the other rows' ``ops``, and ``events`` appended
    to the history (``EventSeq`` bumped). The state row says ``WaitingOn`` only when the
    decision records a wait (``waiting_on``): any other transition of the order ends it."""
    assert 0 < len(events) <= MAX_EVENTS_PER_WRITE, "every state change is recorded"
    old = view.state
    first = (old.event_seq if old is not None else new_state.event_seq) + 1
    # An order waits for its customer's room only while Pending forward: any end (or retry) clears it.
    stamped = replace(new_state, event_seq=first + len(events) - 1, waiting_on=waiting_on,
                      waiting_room=new_state.waits_for_room)
    trace = view.trace_id
    by = {"by": ctx.actor} if ctx.actor is not None else {}  # who asked: an operator, or a system's event
    if ctx.operation is not None:  # a bulk operation: said on its events, kept on the row (acted once)
        by["operationId"] = ctx.operation
        stamped = replace(stamped, operations=remember(stamped.operations, ctx.operation))
    rows = [EventRow(seq=first + n, at=ctx.now, event=e.kind, step=e.step, attempt=e.attempt,
                     detail={**(e.detail or {}), **by} or None, instance=ctx.instance_id, trace_id=trace)
            for n, e in enumerate(events)]
    state_op = stamped.replacing(old) if old is not None else stamped.create()
    return Transact(view.order_id if old is not None else new_state.order_id,
                    (state_op, *ops, *(r.create() for r in rows)), note=note)

