"""An operator's actions: retry a held order, cancel an order that is not in flight.

Each is one ETag-conditioned write; an action in a state where it does not apply raises
:class:`Rejected` with the reason (HTTP 409). A held or finished order has no deadline index
row, so an action that gives it a deadline puts one first.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from shared.effects import Transact
from shared.statemachine.config import Ctx, Decision, Rejected
from shared.statemachine.deadlines import drop_index, hand_off
from shared.statemachine.dispatch import to_compensate
from shared.statemachine.messages import log, status_sends
from shared.statemachine.rows import StateRow
from shared.statemachine.states import CompensationState, Mode, OrderCompensation, Outcome, ProcessState, StepState
from shared.statemachine.view import View


def _held(state: StateRow) -> bool:
    return state.process_state is ProcessState.ERROR and state.mode is Mode.HELD and not state.claimed


def decide_retry(view: View, ctx: Ctx) -> Decision:
    """Run a held order again from its failed step."""
    state = view.state
    assert state is not None
    if not _held(state):
        raise Rejected(why_not(state, "retry", "only an order held in Error (on-failure policy 'hold') can be retried"))
    failed = next((s for s in view.steps if s.state is StepState.FAILED), None)
    if failed is None:
        raise Rejected("the order has no failed step to retry")
    handoff = hand_off(view, ctx, note="retry unclaimed guard")
    new_state = handoff.apply(replace(state, process_state=ProcessState.PENDING, mode=Mode.FORWARD, outcome=None,
                                      failure_count=0, step_index=failed.index, step_name=failed.name,
                                      failed_step=None, reason=None, retried_at=ctx.now))
    pending = replace(failed, state=StepState.PENDING, finished_at=None)
    return Decision("retried", [
        # Crash after this: state unchanged (still held); the operator's call failed: retry it.
        *handoff.puts,
        # Crash after this: Pending, unclaimed; the new row fires and schedules it.
        Transact(view.order_id, (new_state.replacing(state), pending.replacing(failed)), note="operator retry"),
        handoff.notice,
        log(logging.WARNING, "operator.retry", view, step=failed.name),
    ])


def decide_cancel(view: View, ctx: Ctx) -> Decision:
    """Cancel a Pending order that is not being processed, or a held one, compensating what
    it did: the Done steps, and a step whose outcome is unknown (it timed out)."""
    state = view.state
    assert state is not None
    pending = state.process_state is ProcessState.PENDING and state.waiting_for_claim
    if not (pending or _held(state)):
        raise Rejected(why_not(state, "cancel", "only a Pending order that is not being processed, or an order "
                                                "held in Error, can be cancelled"))
    comps = to_compensate(view, ctx)
    base = replace(state, process_state=ProcessState.ERROR, outcome=Outcome.CANCELLED, reason="cancelled by operator",
                   locked_by=None, claim_token=None, updated_at=ctx.now, cancelled_at=ctx.now)
    if not comps:
        new_state = replace(base, mode=Mode.FINISHED, complete_by=None, lease=None,
                            compensation_state=OrderCompensation.NONE, finished_at=ctx.now)
        return Decision("cancelled", [
            # Crash after this: final. A schedule message still in flight finds nothing to claim.
            Transact(view.order_id, (new_state.replacing(state),), note="operator cancel"),
            *status_sends(view, "cancelled", ctx, processState=ProcessState.ERROR),
            log(logging.WARNING, "operator.cancel", view, compensations=0),
            *drop_index(state),
        ])
    # A Pending order has its index row; a held one has none: its new deadline needs one.
    handoff = hand_off(view, ctx, note="cancel unclaimed guard", needs_cover=not pending)
    marks = tuple(replace(c, compensation=CompensationState.PENDING).replacing(c) for c in comps)
    new_state = handoff.apply(replace(base, mode=Mode.COMPENSATE, comp_index=comps[0].index, comp_failure_count=0,
                                      compensation_state=OrderCompensation.RUNNING))
    return Decision("cancelling", [
        # Crash after this: state unchanged; the operator's call failed: retry it.
        *handoff.puts,
        # Crash after this: compensation pending, unclaimed; the new row schedules it.
        Transact(view.order_id, (new_state.replacing(state), *marks), note="operator cancel"),
        handoff.notice,
        *status_sends(view, "cancelled", ctx, processState=ProcessState.ERROR),
        log(logging.WARNING, "operator.cancel", view, compensations=len(comps)),
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
