"""Each order runs the workflow it started with: the drivers bind ``ctx.config`` to it.

The order row records the workflow's name and version (``OrderRow.workflow``; absent: order
v1). Before any decision on an order, a driver asks :func:`decide_for_order` (or :func:`bound`)
for a ``Ctx`` whose config reads that workflow, so the decision code keeps reading
``ctx.config.workflow`` and ``ctx.config.spec(name)``.

An order whose version is no longer loaded (its file was removed while orders used it: unsafe,
see README) cannot be decided on. It is held, once, with the reason and an alert: never a
``KeyError`` on every message. A step in flight is marked Failed, its outcome unknown, so that
an operator retry replays its idempotency key once the version is deployed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from shared.statemachine.config import Ctx, Decision
from shared.statemachine.deadlines import drop_index
from shared.statemachine.history import EventKind, commit, event
from shared.statemachine.messages import alert, log
from shared.statemachine.search_index import reindex
from shared.statemachine.states import Mode, Outcome, ProcessState, StepState
from shared.statemachine.view import View
from shared.store import Op
from shared.workflows import UnknownWorkflow


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
    """Hold the order (once) with the reason; an order already held for it, or ended, is left."""
    state = view.state
    reason = f"{missing}: the order cannot go on (deploy its workflow file again, then retry it)"
    if state is None or state.mode is Mode.FINISHED or (state.mode is Mode.HELD and state.reason == reason):
        return Decision("workflow-unknown", [log(logging.ERROR, "order.workflow_unknown", view, reason=reason)])
    current = view.step_at(state.step_index) if state.mode is Mode.FORWARD else None
    ops: list[Op] = []
    if current is not None and current.state in (StepState.RUNNING, StepState.PENDING):
        unknown = current.outcome_unknown or current.state is StepState.RUNNING  # it may have been applied
        failed = replace(current, state=StepState.FAILED, failure_reason=reason, finished_at=ctx.now,
                         complete_by=None, outcome_unknown=unknown)
        ops.append(failed.replacing(current))
    step_name = current.name if current is not None else state.step_name
    new_state = replace(state, process_state=ProcessState.ERROR, mode=Mode.HELD, outcome=Outcome.HELD, lease=None,
                        locked_by=None, claim_token=None, complete_by=None, reason=reason, updated_at=ctx.now,
                        failed_step=step_name if ops else state.failed_step)
    key = f"workflow:{missing.name}:v{missing.version}"
    return Decision("held", [
        alert(view, step_name, reason, state.failure_count, key, ctx),
        # Crash after this: held; nothing in flight. Crash before: the next message or sweep holds it.
        commit(view, new_state, ops, [event(EventKind.HELD, step_name, reason=reason)], ctx,
               note="workflow not deployed, held"),
        log(logging.ERROR, "order.workflow_unknown", view, reason=reason),
        *reindex(view.order, state, new_state),
        *drop_index(state),
    ])
