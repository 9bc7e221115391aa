"""Each order runs the workflow it started with: the drivers bind ``ctx.config`` to it.

The order row records the workflow's name and version (``OrderRow.workflow``; absent: order
v1). Before any decision on an order, a driver asks :func:`decide_for_order` (or :func:`bound`)
for a ``Ctx`` whose config reads that workflow, so the decision code keeps reading
``ctx.config.workflow`` and ``ctx.config.spec(name)``.

An order whose version is no longer loaded (its file was removed while orders used it: unsafe,
see README) cannot be decided on. It is stopped, once, with the reason and an alert: never a
``KeyError`` on every message. Going forward, it is held (a step in flight marked Failed, its
outcome unknown, so that an operator retry replays its idempotency key once the version is
deployed again); compensating, it ends with its remaining compensations failed (a retry
redrives them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from shared.core.rows import Op, StateRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.deadlines import drop_index
from shared.core.statemachine.history import Event, EventKind, commit, event
from shared.core.statemachine.outbox import alert, log
from shared.core.statemachine.search_index import reindex
from shared.core.statemachine.verdicts import Decision, Verdict
from shared.core.statemachine.view import View
from shared.core.statemachine.webhook import tell
from shared.core.states import CompensationState, Mode, OrderCompensation, Outcome, ProcessState, StepState
from shared.core.workflows import UnknownWorkflow


def bound(view: View, ctx: Ctx) -> Ctx:
    """``ctx`` with its config bound to the order's workflow; raises :class:`UnknownWorkflow`."""
    if view.order is None:
        return ctx
    config = ctx.config.bound(view.order.workflow, view.order.workflow_version)
    return ctx if config is ctx.config else replace(ctx, config=config)


def decide_for_order(view: View, ctx: Ctx, decide: Callable[[Ctx], Decision]) -> Decision:
    """``decide`` under the order's own workflow, or the order held if that is not loaded."""
    try:
        own = bound(view, ctx)
    except UnknownWorkflow as exc:
        return hold_unknown_workflow(view, exc, ctx)
    return decide(own)


def hold_unknown_workflow(view: View, missing: UnknownWorkflow, ctx: Ctx) -> Decision:
    """Stop the order (once) with the reason and an alert; an order already stopped, or ended, is left.

    Going forward (or held), it is held: a step in flight is marked Failed, its outcome unknown,
    so a retry (once the version is back) replays its key. Compensating, its remaining
    compensations are marked Failed and it ends with its compensation failed, so a retry
    redrives them rather than running the order forward."""
    state = view.state
    reason = f"{missing}: the order cannot go on (deploy its workflow file again, then retry it)"
    if state is None or state.mode is Mode.FINISHED or (state.mode is Mode.HELD and state.reason == reason):
        return Decision(Verdict.WORKFLOW_UNKNOWN, [log(logging.ERROR, "order.workflow_unknown", view, reason=reason)])
    if state.mode is Mode.COMPENSATE:
        verdict, new_state, ops, recorded = _stop_compensating(view, state, reason, ctx)
    else:
        verdict, new_state, ops, recorded = _hold(view, state, reason, ctx)
    key = f"workflow:{missing.name}:v{missing.version}"
    told = tell(view, new_state, ctx)
    return Decision(verdict, [
        alert(view, recorded.step, reason, state.failure_count, key, ctx),
        # Crash after this: the ending did not commit; its webhook watch finds no delivery and goes.
        *told.cover,
        # Crash after this: stopped; nothing in flight. Crash before: the next message or sweep stops it.
        commit(view, new_state, (*ops, *told.ops), [recorded], ctx, note="workflow not deployed, stopped"),
        log(logging.ERROR, "order.workflow_unknown", view, reason=reason),
        *reindex(view.order, state, new_state),
        *told.sends,  # the webhook's try 1, after the index (a client told may search); lost: its watch sends it
        *drop_index(state),
    ])


def _released(state: StateRow, ctx: Ctx) -> StateRow:
    return replace(state, lease=None, locked_by=None, claim_token=None, complete_by=None, updated_at=ctx.now)


def _hold(view: View, state: StateRow, reason: str, ctx: Ctx) -> tuple[Verdict, StateRow, list[Op], Event]:
    current = view.step_at(state.step_index) if state.mode is Mode.FORWARD else None
    # the step in flight (or pending), and any other running row (the branches of a parallel step:
    # without its workflow, only the rows tell)
    stopped = [s for s in view.steps if s.state is StepState.RUNNING or s is current] if current is not None else []
    ops: list[Op] = []
    for row in (s for s in stopped if s.state in (StepState.RUNNING, StepState.PENDING)):
        unknown = row.outcome_unknown or row.state is StepState.RUNNING  # it may have been applied
        failed = replace(row, state=StepState.FAILED, failure_reason=reason, finished_at=ctx.now,
                         complete_by=None, outcome_unknown=unknown)
        ops.append(failed.replacing(row))
    step_name = current.name if current is not None else state.step_name
    new_state = replace(_released(state, ctx), process_state=ProcessState.ERROR, mode=Mode.HELD, outcome=Outcome.HELD,
                        reason=reason, failed_step=step_name if ops else state.failed_step)
    return Verdict.HELD, new_state, ops, event(EventKind.HELD, step_name, reason=reason)


def _stop_compensating(view: View, state: StateRow, reason: str,
                       ctx: Ctx) -> tuple[Verdict, StateRow, list[Op], Event]:
    left = [s for s in view.steps if s.compensation in (CompensationState.PENDING, CompensationState.RUNNING)]
    stopped = [replace(s, compensation=CompensationState.FAILED, compensation_reason=reason,
                       compensation_finished_at=ctx.now, compensation_complete_by=None) for s in left]
    new_state = replace(_released(state, ctx), mode=Mode.FINISHED, compensation_state=OrderCompensation.FAILED,
                        finished_at=ctx.now)
    recorded = event(EventKind.COMPENSATED, stopped[0].name if stopped else None, outcome=state.outcome,
                     compensation=OrderCompensation.FAILED, reason=reason, steps=[s.name for s in stopped] or None)
    ops = [row.replacing(old) for row, old in zip(stopped, left, strict=True)]
    return Verdict.COMPENSATION_STOPPED, new_state, ops, recorded
