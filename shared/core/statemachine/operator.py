"""An operator's actions: retry (from any failure), cancel, and terminate (``terminate``).

Each is one ETag-conditioned write, recorded in the order's history; an action in a state
where it does not apply raises :class:`Rejected` with the reason (HTTP 409). A held or
finished order has no deadline index row, so an action that gives it a deadline puts one
first. A retry comes in three kinds:

* a held order runs again from its failed step (its idempotency key replayed);
* an order that failed and was compensated runs again from the first step as a new
  generation: every step Pending, fresh idempotency keys (its earlier effects were undone).
  Attempt numbers go on from where they were, so a late reply of the old run never matches;
* an order whose compensation failed for good has its failed compensations redriven.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from shared.core.rows import StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.deadlines import drop_index, hand_off
from shared.core.statemachine.dispatch import to_compensate
from shared.core.statemachine.groups import rank
from shared.core.statemachine.history import Event, EventKind, commit, event
from shared.core.statemachine.outbox import log, status_sends
from shared.core.statemachine.search_index import reindex
from shared.core.statemachine.verdicts import Decision, Rejected, Verdict
from shared.core.statemachine.view import View
from shared.core.statemachine.webhook import tell
from shared.core.states import CompensationState, Mode, OrderCompensation, Outcome, ProcessState, StepState


def held(state: StateRow) -> bool:
    return state.process_state is ProcessState.ERROR and state.mode is Mode.HELD and not state.claimed


def _compensation_failed(state: StateRow) -> bool:
    return state.mode is Mode.FINISHED and state.compensation_state is OrderCompensation.FAILED


def _failed_undone(state: StateRow) -> bool:
    """Failed, and every effect it had was compensated (or it had none): it can run again."""
    return (state.mode is Mode.FINISHED and state.outcome is Outcome.FAILED
            and state.compensation_state in (None, OrderCompensation.NONE, OrderCompensation.COMPLETED))


def decide_retry(view: View, ctx: Ctx) -> Decision:
    """Run the order again from its failure (module docstring: the three kinds)."""
    state = view.state
    assert state is not None
    if held(state):
        return _retry_held(view, state, ctx)
    if _compensation_failed(state):
        return _redrive_compensations(view, state, ctx)
    if _failed_undone(state):
        return _restart(view, state, ctx)
    raise Rejected(why_not(state, "retry", "only a held order, a failed one, or one whose compensation failed "
                                           "can be retried"))


def _resume(view: View, new_state: StateRow, ops: list, events: list[Event], verdict: Verdict, ctx: Ctx,
            note: str) -> Decision:
    """Hand the order (held or finished: no deadline row) to a scheduler, and record why."""
    state = view.state
    assert state is not None
    handoff = hand_off(view, ctx, note=f"{note} unclaimed guard")
    resumed = handoff.apply(new_state)
    return Decision(verdict, [
        # Crash after this: state unchanged; the operator's call failed: call again.
        *handoff.puts,
        # Crash after this: unclaimed; the new row fires and schedules it.
        commit(view, resumed, ops, events, ctx, note=note),
        # Before the notice: what the notice sets off writes its index rows after these.
        *reindex(view.order, state, resumed),
        handoff.notice,
        log(logging.WARNING, f"operator.{verdict}", view, generation=resumed.generation),
    ])


def _retry_held(view: View, state: StateRow, ctx: Ctx) -> Decision:
    failed = next((s for s in view.steps if s.state is StepState.FAILED), None)
    if failed is None:
        raise Rejected("the order has no failed step to retry")
    new_state = replace(state, process_state=ProcessState.PENDING, mode=Mode.FORWARD, outcome=None, failure_count=0,
                        step_index=failed.index, step_name=failed.name, failed_step=None, reason=None,
                        retried_at=ctx.now, suspended=False)
    pending = replace(failed, state=StepState.PENDING, finished_at=None)
    return _resume(view, new_state, [pending.replacing(failed)], [event(EventKind.RETRIED, failed.name)],
                   Verdict.RETRIED, ctx, "operator retry")


def _restart(view: View, state: StateRow, ctx: Ctx) -> Decision:
    fresh = [_fresh(s) for s in view.steps]
    first = next(s for s in fresh if s.state is not StepState.SKIPPED)
    generation = state.generation + 1
    new_state = replace(state, process_state=ProcessState.PENDING, mode=Mode.FORWARD, outcome=None, failure_count=0,
                        step_index=first.index, step_name=first.name, failed_step=None, reason=None,
                        comp_index=-1, comp_failure_count=0, compensation_state=None, finished_at=None,
                        retried_at=ctx.now, generation=generation, suspended=False)
    ops = [row.replacing(old) for row, old in zip(fresh, view.steps, strict=True)]
    return _resume(view, new_state, ops, [event(EventKind.RESTARTED, generation=generation)], Verdict.RESTARTED, ctx,
                   "operator restart")


def _fresh(step: StepRow) -> StepRow:
    """The step as a new generation finds it: Pending (Skipped stays Skipped: the order's fields
    have not changed), its attempt counters kept (fencing)."""
    return StepRow(name=step.name, index=step.index, attempt=step.attempt,
                   compensation_attempt=step.compensation_attempt,
                   state=StepState.SKIPPED if step.state is StepState.SKIPPED else StepState.PENDING)


def _redrive_compensations(view: View, state: StateRow, ctx: Ctx) -> Decision:
    failed = [s for s in view.steps if s.compensation is CompensationState.FAILED]
    if not failed:
        raise Rejected("the order has no failed compensation to redrive")
    again = [replace(s, compensation=CompensationState.PENDING, compensation_finished_at=None) for s in failed]
    latest = max(again, key=lambda s: rank(s, ctx))  # the last effect applied is undone first
    new_state = replace(state, mode=Mode.COMPENSATE, comp_index=latest.index, comp_failure_count=0,
                        compensation_state=OrderCompensation.RUNNING, finished_at=None, retried_at=ctx.now)
    ops = [row.replacing(old) for row, old in zip(again, failed, strict=True)]
    events = [event(EventKind.RETRIED, retry="compensation", steps=[s.name for s in failed])]
    return _resume(view, new_state, ops, events, Verdict.COMPENSATION_REDRIVEN, ctx, "operator compensation redrive")


def decide_cancel(view: View, ctx: Ctx) -> Decision:
    """Cancel an order that is not in flight, compensating what it did: a Pending order that
    is not being processed, a held one, or a failed one awaiting a decision (it is already
    compensated: cancelling it records that nobody will retry it)."""
    state = view.state
    assert state is not None
    # Pending and not being processed: waiting for a claim, or suspended with nothing in flight
    pending = state.process_state is ProcessState.PENDING and (
        state.waiting_for_claim or (state.suspended and state.lease is None and not state.claimed))
    if not (pending or held(state) or _failed_undone(state)):
        rule = ("only a Pending order that is not being processed, a held one, or a failed one can be cancelled"
                + ("; to stop an order in flight, terminate it" if state.mode is Mode.FORWARD else ""))
        raise Rejected(why_not(state, "cancel", rule))
    comps = [] if _failed_undone(state) else to_compensate(view, ctx)
    base = replace(state, process_state=ProcessState.ERROR, outcome=Outcome.CANCELLED, reason="cancelled by operator",
                   locked_by=None, claim_token=None, updated_at=ctx.now, cancelled_at=ctx.now)
    recorded = event(EventKind.CANCELLED, compensations=len(comps))
    if not comps:
        new_state = replace(base, mode=Mode.FINISHED, complete_by=None, lease=None,
                            compensation_state=state.compensation_state or OrderCompensation.NONE,
                            finished_at=ctx.now)  # retention counts from the decision
        told = tell(view, new_state, ctx)
        return Decision(Verdict.CANCELLED, [
            # Crash after this: the ending did not commit; its webhook watch finds no delivery and goes.
            *told.cover,
            # Crash after this: final. A schedule message still in flight finds nothing to claim.
            commit(view, new_state, told.ops, [recorded], ctx, note="operator cancel"),
            *status_sends(view, "cancelled", ctx, processState=ProcessState.ERROR),
            log(logging.WARNING, "operator.cancel", view, compensations=0),
            *reindex(view.order, state, new_state),
            *told.sends,  # the webhook's try 1, after the index (a client told may search); lost: its watch sends it
            *drop_index(state),
        ])
    return compensate_all(view, base, comps, recorded, Verdict.CANCELLING, ctx, needs_cover=state.lease is None,
                          status="cancelled")


def compensate_all(view: View, base: StateRow, comps: list[StepRow], recorded: Event, verdict: Verdict, ctx: Ctx, *,
                   needs_cover: bool, status: str, fenced: Sequence[StepRow] = ()) -> Decision:
    """Compensate ``comps`` (in that order), handing the order to a scheduler; ``fenced``: the
    step rows the action changed too (terminate)."""
    state = view.state
    assert state is not None
    # An order with a lease has its index row; one without (held, suspended with nothing in
    # flight) has none: its new deadline needs one (``needs_cover``).
    handoff = hand_off(view, ctx, note=f"{verdict} unclaimed guard", needs_cover=needs_cover)
    marked = {c.index: replace(c, compensation=CompensationState.PENDING) for c in comps}
    for row in fenced:
        marked.setdefault(row.index, row)
    old = {s.index: s for s in view.steps}
    new_state = handoff.apply(replace(base, mode=Mode.COMPENSATE, comp_index=comps[0].index, comp_failure_count=0,
                                      compensation_state=OrderCompensation.RUNNING))
    return Decision(verdict, [
        # Crash after this: state unchanged; the operator's call failed: call again.
        *handoff.puts,
        # Crash after this: compensation pending, unclaimed; the row schedules it.
        commit(view, new_state, [row.replacing(old[i]) for i, row in marked.items()], [recorded], ctx,
               note=f"operator {verdict}"),
        # A held order is in flight again; before the notice, as above.
        *reindex(view.order, state, new_state),
        handoff.notice,
        *status_sends(view, status, ctx, processState=ProcessState.ERROR),
        log(logging.WARNING, f"operator.{verdict}", view, compensations=len(comps)),
    ])


def why_not(state: StateRow, action: str, rule: str) -> str:
    """Why ``action`` does not apply to the order in ``state`` (the 409's detail)."""
    desc = f"order is {state.process_state}"
    if state.mode is Mode.COMPENSATE:
        desc += " and compensating"
    elif state.mode is Mode.FINISHED and state.outcome:
        desc += f" ({state.outcome})"
    elif state.claimed:
        desc += f", step {state.step_name} in flight"
    return f"cannot {action}: {desc}; {rule}"
