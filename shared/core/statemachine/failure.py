"""A step that failed for good: its on-failure policy, as four named outcomes.

A step fails for good on an error reply (the remote applied nothing under its key) or when
the Supervisor gives up after MaxFailureCount timeouts (``timed_out``: no answer, so the
remote may have applied the effect; the step's outcome is unknown).

* :func:`_hold` - policy ``hold``, or a timed-out step with no compensation (the pivot: a
  shipment cannot be undone, and refunding the steps before it could refund goods that left).
  An operator retries (replaying the step's idempotency key) or cancels.
* :func:`_fail_final` - policy ``compensate`` with nothing to compensate.
* :func:`_compensate_now` - an error reply: the reply's handler holds the claim and puts the
  first compensation in flight itself.
* :func:`_compensate_later` - a timeout: the Supervisor hands the order to a scheduler.

A timed-out step with a compensation is compensated first (by its idempotency key), then the
Done steps in reverse order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from shared.core.effects import Alert, Effect
from shared.core.rows import Op, StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.deadlines import drop_index, hand_off
from shared.core.statemachine.dispatch import (
    compensation_dispatched,
    compensation_request,
    dispatch_compensation,
    to_compensate,
)
from shared.core.statemachine.groups import STOPPED_REASON, fence, members
from shared.core.statemachine.history import Event, EventKind, commit, event
from shared.core.statemachine.outbox import alert, status_sends
from shared.core.statemachine.search_index import reindex
from shared.core.statemachine.verdicts import Decision, Verdict
from shared.core.statemachine.view import View
from shared.core.statemachine.webhook import tell
from shared.core.states import CompensationState, Mode, OrderCompensation, Outcome, ProcessState, StepState


def fail_step(view: View, step: StepRow, reason: str, ctx: Ctx, *, timed_out: bool,
              failure_count: int | None = None, before: Sequence[Event] = (), hold: bool | None = None,
              by_supervisor: bool = False) -> Decision:
    """Apply the step's on-failure policy (module docstring). ``before``: events to record ahead
    of the failure's (the end of the step's wait on a breaker). ``hold``: the policy of a wait
    step (``shared.core.statemachine.events``) instead of the step's own. ``by_supervisor``: the
    Supervisor decides (a timeout does too): it hands the compensations to a scheduler, with an
    index row for their deadline, since it deletes the row it is handling."""
    state = view.state
    assert state is not None
    spec = ctx.config.spec(step.name)
    failed = replace(step, state=StepState.FAILED, failure_reason=reason, finished_at=ctx.now, complete_by=None,
                     outcome_unknown=timed_out, waiting_on=None)
    count = state.failure_count if failure_count is None else failure_count
    # Alert first, with a deterministic id: a crash or lost race after it leads to the same
    # alert again, which the alerts queue's duplicate detection drops.
    head = alert(view, step.name, reason, count, f"{step.name}:{step.attempt}", ctx)
    base = replace(state, failure_count=count, process_state=ProcessState.ERROR, failed_step=step.name, reason=reason,
                   updated_at=ctx.now)
    tail = status_sends(view, "failed", ctx, step=step.name, reason=reason, processState=ProcessState.ERROR)
    # A branch of a parallel step fails its group: the branches still in flight are stopped, their
    # outcome unknown (``groups``); one that cannot be undone holds the order, as a timed-out pivot.
    stopped = fence([b for b in members(view, step, ctx) if b.index != step.index], ctx, STOPPED_REASON)
    events = [*before,
              event(EventKind.STEP_FAILED, step.name, step.attempt, reason=reason, outcomeUnknown=timed_out or None),
              event(EventKind.ALERT, step.name, step.attempt, reason=reason, failureCount=count),
              *(event(EventKind.STEP_FAILED, b.name, b.attempt, reason=STOPPED_REASON, outcomeUnknown=True)
                for b in stopped)]
    stuck = any(ctx.config.spec(b.name).compensation is None for b in stopped)
    holds = (spec.on_failure == "hold" or (timed_out and spec.compensation is None) or stuck) if hold is None else hold
    written = {failed.index: failed} | {b.index: b for b in stopped}
    if holds:
        return _hold(view, step, written, base, [head], tail, events, ctx)
    comps = to_compensate(view.with_steps(*written.values()), ctx)
    if not comps:
        return _fail_final(view, step, written, base, [head], tail, events, ctx)
    # The rows to write: the failed step (and the branches it stopped), and every step to
    # compensate marked Pending (the failed step itself among them when its outcome is
    # unknown). One op per row.
    marked = {s.index: replace(s, compensation=CompensationState.PENDING) for s in comps}
    for index, row in written.items():
        marked.setdefault(index, row)
    if timed_out or by_supervisor:
        return _compensate_later(view, base, marked, comps[0].index, [head], tail, events, ctx)
    return _compensate_now(view, base, marked, comps[0].index, [head], tail, events, ctx)


def _released(state: StateRow) -> StateRow:
    return replace(state, locked_by=None, claim_token=None, complete_by=None, lease=None)


def _hold(view: View, step: StepRow, written: dict[int, StepRow], base: StateRow, head: list[Alert],
          tail: list[Effect], events: list[Event], ctx: Ctx) -> Decision:
    state = view.state
    assert state is not None
    new_state = replace(_released(base), mode=Mode.HELD, outcome=Outcome.HELD)
    told = tell(view, new_state, ctx)
    return Decision(Verdict.HELD, [
        *head,
        # Crash after this: the ending did not commit; its webhook watch finds no delivery and goes.
        *told.cover,
        # Crash after this: held in Error for an operator; nothing in flight.
        commit(view, new_state, (*_ops(view, written), *told.ops), [*events, event(EventKind.HELD, step.name)], ctx,
               note="step failed, held"),
        *tail,
        # Crash before these: the deadline row is kept; the Supervisor re-indexes, then deletes it.
        *reindex(view.order, state, new_state),
        *told.sends,  # the webhook's try 1, after the index (a client told may search); lost: its watch sends it
        *drop_index(state),
    ])


def _fail_final(view: View, step: StepRow, written: dict[int, StepRow], base: StateRow, head: list[Alert],
                tail: list[Effect], events: list[Event], ctx: Ctx) -> Decision:
    state = view.state
    assert state is not None
    new_state = replace(_released(base), mode=Mode.FINISHED, outcome=Outcome.FAILED,
                        compensation_state=OrderCompensation.NONE, finished_at=ctx.now)
    told = tell(view, new_state, ctx)
    return Decision(Verdict.FAILED, [
        *head,
        # Crash after this: the ending did not commit; its webhook watch finds no delivery and goes.
        *told.cover,
        # Crash after this: final state; only best-effort messages are missing.
        commit(view, new_state, (*_ops(view, written), *told.ops), [*events, event(EventKind.FAILED, step.name)],
               ctx, note="step failed, final"),
        *tail,
        *reindex(view.order, state, new_state),
        *told.sends,  # the webhook's try 1, after the index (a client told may search); lost: its watch sends it
        *drop_index(state),
    ])


def _ops(view: View, marked: dict[int, StepRow]) -> tuple[Op, ...]:
    old = {s.index: s for s in view.steps}
    return tuple(row.replacing(old[i]) for i, row in marked.items())


def _compensate_now(view: View, base: StateRow, marked: dict[int, StepRow], first: int, head: list[Alert],
                    tail: list[Effect], events: list[Event], ctx: Ctx) -> Decision:
    state = view.state
    assert state is not None
    compensating = replace(base, mode=Mode.COMPENSATE, outcome=Outcome.FAILED, comp_failure_count=0,
                           compensation_state=OrderCompensation.RUNNING)
    running, new_state = dispatch_compensation(marked[first], compensating, ctx)
    marked[first] = running
    return Decision(Verdict.COMPENSATING, [
        *head,
        # No index write: the order's row covers the compensation's deadline.
        # Step Failed + compensations Pending + first compensation Running, ONE transaction.
        # Crash after this: the redelivered error reply is a duplicate and re-sends the
        # compensation request; else the Supervisor expires the compensation lease.
        commit(view, new_state, _ops(view, marked), [*events, compensation_dispatched(running)], ctx,
               note="step failed, compensating"),
        compensation_request(view.with_steps(running), running, ctx),
        *tail,
    ])


def _compensate_later(view: View, base: StateRow, marked: dict[int, StepRow], first: int, head: list[Alert],
                      tail: list[Effect], events: list[Event], ctx: Ctx) -> Decision:
    state = view.state
    assert state is not None
    # The Supervisor: the index row it is handling ends; cover the new deadline.
    handoff = hand_off(view, ctx, note="compensation unclaimed guard")
    new_state = handoff.apply(replace(base, mode=Mode.COMPENSATE, outcome=Outcome.FAILED, comp_index=first,
                                      comp_failure_count=0, compensation_state=OrderCompensation.RUNNING))
    return Decision(Verdict.COMPENSATING, [
        *head,
        # Crash after this: state unchanged; the overdue row is still due: next sweep redoes it.
        *handoff.puts,
        # Crash after this: compensation pending but no schedule message; the new row fires
        # by the grace period and the Supervisor sends it.
        commit(view, new_state, _ops(view, marked), events, ctx, note="step failed, compensation scheduled"),
        handoff.notice,
        *tail,
    ])
