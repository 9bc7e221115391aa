"""An operator's terminate: stop an order in flight, and undo what it did.

* The attempt in flight is fenced: its step is marked Failed (``TERMINATED_REASON``) with
  its outcome unknown, and the lease moves on, so a late reply changes nothing.
* The Done steps are compensated in reverse, and the fenced step by its idempotency key
  (which tombstones the key if the remote never applied it).
* A fenced step with no compensation (the pivot) whose outcome is unknown cannot be undone,
  and undoing the steps before it could refund goods that left: the order is held for an
  operator, as a timed-out pivot is.
* Otherwise the order ends Error with outcome ``terminated`` once its compensations end.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from shared.core.rows import StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.deadlines import drop_index
from shared.core.statemachine.dispatch import to_compensate
from shared.core.statemachine.groups import members
from shared.core.statemachine.history import EventKind, commit, event
from shared.core.statemachine.operator import compensate_all, why_not
from shared.core.statemachine.outbox import log, status_sends
from shared.core.statemachine.search_index import reindex
from shared.core.statemachine.verdicts import Decision, Rejected, Verdict
from shared.core.statemachine.view import View
from shared.core.statemachine.waiting import forget_wait
from shared.core.statemachine.webhook import tell
from shared.core.states import TERMINATED_REASON, Mode, OrderCompensation, Outcome, ProcessState, StepState


def decide_terminate(view: View, ctx: Ctx) -> Decision:
    """Terminate an order in flight (module docstring). A step waiting on a breaker stops
    waiting: its waiting row is forgotten after the write."""
    state = view.state
    assert state is not None
    if state.mode is not Mode.FORWARD or state.process_state not in (ProcessState.PENDING, ProcessState.PROCESSING):
        raise Rejected(why_not(state, "terminate", "only an order in flight (running its steps) can be terminated"))
    current = view.step_at(state.step_index)
    # the step in flight, or every branch of a parallel step (``groups``)
    targets = members(view, current, ctx) if current is not None else []
    forget = [e for step in targets for e in forget_wait(view.order_id, step)]
    return _terminate(view, state, targets, ctx).then(*forget)


def _terminate(view: View, state: StateRow, targets: list[StepRow], ctx: Ctx) -> Decision:
    fenced = [row for row in (_fence(step, ctx) for step in targets)]
    changed = [row for row, old in zip(fenced, targets, strict=True) if row != old]
    lead = changed[0] if changed else (fenced[0] if fenced else None)
    after = view.with_steps(*changed)
    base = replace(state, process_state=ProcessState.ERROR, locked_by=None, claim_token=None, updated_at=ctx.now,
                   terminated_at=ctx.now, failed_step=lead.name if lead else None, reason=TERMINATED_REASON)
    stuck = [row for row in changed if row.outcome_unknown and ctx.config.spec(row.name).compensation is None]
    if stuck:
        return _hold(view, base, stuck[0], changed, ctx)
    comps = to_compensate(after, ctx)
    recorded = event(EventKind.TERMINATED, lead.name if lead else None, lead.attempt if lead else None,
                     compensations=len(comps), branches=[r.name for r in changed] if len(changed) > 1 else None)
    base = replace(base, outcome=Outcome.TERMINATED)
    if comps:
        return compensate_all(view, base, comps, recorded, Verdict.TERMINATING, ctx, needs_cover=state.lease is None,
                              status="terminated", fenced=changed)
    new_state = replace(base, mode=Mode.FINISHED, complete_by=None, lease=None,
                        compensation_state=OrderCompensation.NONE, finished_at=ctx.now)
    ops = view.replacing(changed)
    told = tell(view, new_state, ctx)
    return Decision(Verdict.TERMINATED, [
        # Crash after this: the ending did not commit; its webhook watch finds no delivery and goes.
        *told.cover,
        # Crash after this: final; a late reply is stale (the lease moved on).
        commit(view, new_state, (*ops, *told.ops), [recorded], ctx, note="operator terminate"),
        *status_sends(view, "terminated", ctx, processState=ProcessState.ERROR),
        log(logging.WARNING, "operator.terminated", view, compensations=0),
        *reindex(view.order, state, new_state),
        *told.sends,  # the webhook's try 1, after the index (a client told may search); lost: its watch sends it
        *drop_index(state),
    ])


def _fence(step: StepRow, ctx: Ctx) -> StepRow:
    """The current step, stopped: a running attempt (or a redriven one) becomes Failed with its
    outcome unknown (a call's: a wait or a delay applied nothing); a step never sent stays as it is."""
    if step.state is StepState.RUNNING:
        called = ctx.config.spec(step.name).kind == "call"
        return replace(step, state=StepState.FAILED, failure_reason=TERMINATED_REASON, outcome_unknown=called,
                       complete_by=None, finished_at=ctx.now, waiting_on=None)
    if step.state is StepState.PENDING and step.attempt > 0:
        return replace(step, state=StepState.FAILED, failure_reason=TERMINATED_REASON, finished_at=ctx.now)
    return step


def _hold(view: View, base: StateRow, fenced: StepRow, changed: list[StepRow], ctx: Ctx) -> Decision:
    state = view.state
    assert state is not None
    reason = (f"terminated while {fenced.name} was in flight: its outcome is unknown and it cannot be "
              "compensated; retry it (its idempotency key is replayed) or cancel")
    new_state = replace(base, mode=Mode.HELD, outcome=Outcome.HELD, complete_by=None, lease=None, reason=reason)
    told = tell(view, new_state, ctx)
    return Decision(Verdict.HELD, [
        # Crash after this: the ending did not commit; its webhook watch finds no delivery and goes.
        *told.cover,
        # Crash after this: held for an operator; a late reply is stale (the lease moved on).
        commit(view, new_state, (*view.replacing(changed), *told.ops),
               [event(EventKind.TERMINATED, fenced.name, fenced.attempt, held=True),
                event(EventKind.HELD, fenced.name, reason=reason)], ctx, note="operator terminate, held"),
        *status_sends(view, "held", ctx, step=fenced.name, processState=ProcessState.ERROR),
        log(logging.WARNING, "operator.terminate_held", view, step=fenced.name),
        *reindex(view.order, state, new_state),
        *told.sends,  # the webhook's try 1, after the index (a client told may search); lost: its watch sends it
        *drop_index(state),
    ])
