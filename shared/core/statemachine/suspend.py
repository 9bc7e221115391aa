"""An operator's suspend and resume: pause an order running its steps, and let it go on.

A suspended order dispatches no new step. A step already at an agent finishes and its reply is
recorded (``forward``: the next step is not dispatched; the order waits, Pending, with nothing in
flight and so no deadline: the Supervisor has nothing to count against it). A step that times out
meanwhile is redriven as usual (FailureCount + 1) but not handed to a scheduler. A suspended order
whose step waits on a breaker goes on waiting.

Resume clears the flag. With nothing in flight, the order is handed to a scheduler, which claims
it and dispatches its current step; with a step in flight, that step's reply dispatches the next.
Terminate and cancel apply to a suspended order as to any order in flight or pending.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from shared.core.statemachine.config import Ctx
from shared.core.statemachine.deadlines import drop_index, hand_off
from shared.core.statemachine.history import EventKind, commit, event
from shared.core.statemachine.operator import why_not
from shared.core.statemachine.outbox import log
from shared.core.statemachine.verdicts import Decision, Rejected, Verdict
from shared.core.statemachine.view import View
from shared.core.states import Mode, ProcessState


def decide_suspend(view: View, ctx: Ctx) -> Decision:
    """Suspend an order running its steps (module docstring)."""
    state = view.state
    assert state is not None
    if (state.mode is not Mode.FORWARD or state.process_state not in (ProcessState.PENDING, ProcessState.PROCESSING)
            or state.suspended):
        raise Rejected(why_not(state, "suspend", "only an order running its steps, not suspended yet, can be suspended"
                                                 + ("; this one is suspended: resume it" if state.suspended else "")))
    if state.waits_for_room:
        raise Rejected(why_not(state, "suspend", "an order waiting for its customer's room has nothing in flight; "
                                                 "cancel it to give its place up"))
    if state.waiting_for_claim:
        # Handed to a scheduler but not claimed: take it back, so that no claim dispatches its
        # step. Nothing is in flight, so nothing has a deadline: the index row is dropped.
        new_state = replace(state, suspended=True, lease=None, complete_by=None, updated_at=ctx.now)
        tail = drop_index(state)
    else:  # a step (or its compensation-free wait) in flight: it ends as usual, and then the order waits
        new_state = replace(state, suspended=True, updated_at=ctx.now)
        tail = []
    return Decision(Verdict.SUSPENDED, [
        # Crash after this: suspended. A schedule message still in flight finds nothing to claim.
        commit(view, new_state, [], [event(EventKind.SUSPENDED, state.step_name)], ctx, note="operator suspend"),
        log(logging.WARNING, "operator.suspended", view, step=state.step_name),
        # Crash before this: the row falls due and the sweep deletes it (nothing has a deadline).
        *tail,
    ])


def decide_unsuspend(view: View, ctx: Ctx) -> Decision:
    """Resume a suspended order (module docstring)."""
    state = view.state
    assert state is not None
    if state.mode is not Mode.FORWARD or not state.suspended:
        raise Rejected(why_not(state, "resume", "only a suspended order can be resumed"))
    resumed = event(EventKind.UNSUSPENDED, state.step_name)
    if state.lease is not None:  # a step in flight: its reply dispatches the next one
        new_state = replace(state, suspended=False, updated_at=ctx.now)
        return Decision(Verdict.UNSUSPENDED, [
            commit(view, new_state, [], [resumed], ctx, note="operator resume"),
            log(logging.WARNING, "operator.unsuspended", view, step=state.step_name),
        ])
    handoff = hand_off(view, ctx, note="operator resume unclaimed guard")
    new_state = handoff.apply(replace(state, suspended=False, process_state=ProcessState.PENDING))
    return Decision(Verdict.UNSUSPENDED, [
        # Crash after this: still suspended; the operator's call failed: call again.
        *handoff.puts,
        # Crash after this (notice not sent): the new row fires and the Supervisor sends it again.
        commit(view, new_state, [], [resumed], ctx, note="operator resume"),
        handoff.notice,
        log(logging.WARNING, "operator.unsuspended", view, step=state.step_name),
    ])
