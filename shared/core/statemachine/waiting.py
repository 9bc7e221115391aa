"""Steps that wait on a remote's open circuit breaker, and their resume.

An agent whose remote's breaker is open makes no call: it registers the attempt as waiting
(``shared.core.breaker.waiting``) and replies ``waiting``. That reply, when it is live (it names the
lease), records the wait on the step row (``WaitingOn``, ``WaitingSince``) and moves the order's
CompleteBy to the end of the longest wait allowed (``BreakerMaxWaitSeconds`` from the step's first
wait). It is not a failure: no FailureCount, no new attempt. Past the longest wait the usual
timeout path applies (the Supervisor expires the lease at CompleteBy).

A ``resume`` message (sent by the instance that closed the breaker, by the Supervisor after a
crash, or scheduled at the end of the cool-down for the one step that wakes the breaker up)
re-dispatches the attempt it names as the next attempt, if the order's lease still names it.
Otherwise it is stale and changes nothing. It is deliberately not conditioned on ``WaitingOn``: a
resume may overtake the ``waiting`` reply, which then finds a newer lease and is stale.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

from shared.core.breaker.waiting import WaitingStep, resume_message
from shared.core.effects import Effect, Send
from shared.core.lease import Lease
from shared.core.messages import ReplyMessage, ResumeMessage
from shared.core.rows import StepRow
from shared.core.statemachine.config import Ctx, Decision, Verdict
from shared.core.statemachine.dispatch import compensation_dispatched, dispatch_compensation, dispatch_step, dispatched
from shared.core.statemachine.history import EventKind, commit, event
from shared.core.statemachine.outbox import compensation_request, info, log, step_request
from shared.core.statemachine.view import View
from shared.core.states import CompensationState, Mode, StepState
from shared.core.times import iso


def waiting_reply(view: View, step: StepRow, reply: ReplyMessage, ctx: Ctx) -> Decision:
    """A live ``waiting`` reply (its attempt holds the lease): record the wait, no failure."""
    state = view.state
    assert state is not None and reply.breaker is not None
    compensation = reply.kind == "compensation"
    wake = _wake(view, step, reply, ctx)
    if step.waiting_on is not None:
        # Recorded already (a redelivered reply): only the wake-up again (same id: deduplicated).
        return Decision(Verdict.WAITING_DUPLICATE, [*wake, info("step.waiting_duplicate", view, step=step.name,
                                                          attempt=reply.attempt)])
    since = step.waiting_since or ctx.now
    complete_by = max(since + timedelta(seconds=ctx.config.breaker_max_wait_seconds), ctx.now)
    if compensation:
        waiting = replace(step, waiting_on=reply.breaker, waiting_since=since, compensation_complete_by=complete_by)
    else:
        waiting = replace(step, waiting_on=reply.breaker, waiting_since=since, complete_by=complete_by)
    new_state = replace(state, complete_by=complete_by, updated_at=ctx.now)
    kind = EventKind.STEP_WAITING
    detail = {"breaker": reply.breaker, "until": iso(reply.until) if reply.until else None,
              "since": iso(since), "completeBy": iso(complete_by), "compensation": compensation or None}
    return Decision(Verdict.WAITING, [
        # No index write: the order's deadline row fires at the old CompleteBy or earlier, and the
        # Supervisor then finds the later CompleteBy and moves it.
        # Crash after this: the wake-up below is not sent; the Supervisor sends it for an open
        # breaker whose wake time has passed (and the closer resumes every waiting step anyway).
        commit(view, new_state, [waiting.replacing(step)],
               [event(kind, step.name, reply.attempt, **{k: v for k, v in detail.items() if v is not None})],
               ctx, note="step waits on an open breaker"),
        *wake,
        info("step.waiting", view, step=step.name, attempt=reply.attempt, breaker=reply.breaker,
             until=reply.until, completeBy=complete_by, wake=reply.wake),
    ])


def _wake(view: View, step: StepRow, reply: ReplyMessage, ctx: Ctx) -> list[Effect]:
    """The resume scheduled at ``until`` for the one step that wakes the breaker up."""
    if not reply.wake or reply.until is None:
        return []
    target = WaitingStep(view.order_id, reply.attempt, step.name, reply.kind)
    not_before = reply.until if reply.until > ctx.now else None
    priority = view.order.priority if view.order is not None else None
    queue = ctx.config.lane_queue("SchedulerQueue", priority)  # the order's lane (shared.core.workflows.lanes)
    return [Send(resume_message(target, queue, not_before=not_before, tag="wake"),
                 what="resume (wake)")]


def decide_resume(view: View, msg: ResumeMessage, ctx: Ctx) -> Decision:
    """Re-dispatch the waiting attempt ``msg`` names, if it is still the order's lease."""
    state = view.state
    if state is None or view.order is None:
        return Decision(Verdict.UNKNOWN_ORDER, [log(logging.ERROR, "resume.unknown_order", None, order_id=msg.orderId)])
    step = view.step(msg.step)
    if step is None:
        return Decision(Verdict.IGNORED, [log(logging.WARNING, "resume.unknown_step", view, step=msg.step)])
    if msg.target == "compensation":
        live = (state.mode is Mode.COMPENSATE and state.claimed
                and state.lease == Lease.for_compensation(msg.step, msg.attempt)
                and step.compensation is CompensationState.RUNNING and step.compensation_attempt == msg.attempt)
    else:
        live = (state.mode is Mode.FORWARD and state.claimed and state.lease == Lease.for_step(msg.step, msg.attempt)
                and step.state is StepState.RUNNING and step.attempt == msg.attempt)
    if not live:
        return Decision(Verdict.STALE, [info("resume.stale", view, step=msg.step, attempt=msg.attempt,
                                             target=msg.target, lease=str(state.lease))])
    resumed = event(EventKind.RESUMED, step.name, msg.attempt, breaker=step.waiting_on,
                    compensation=True if msg.target == "compensation" else None)
    if msg.target == "compensation":
        running, new_state = dispatch_compensation(step, state, ctx)
        running = replace(running, waiting_since=step.waiting_since)
        send = compensation_request(view.with_steps(running), running, ctx)
        dispatch_event = compensation_dispatched(running)
    else:
        running, new_state = dispatch_step(step, state, ctx)
        running = replace(running, waiting_since=step.waiting_since)
        send = step_request(view.with_steps(running).with_state(new_state), running, ctx)
        dispatch_event = dispatched(running)
    return Decision(Verdict.RESUMED, [
        # Step (or compensation) Running with the next attempt, ONE transaction; the deadline
        # (now + step timeout) is covered by the order's index row like any dispatch.
        # Crash after this: the request is not sent; the Supervisor expires the lease at its
        # CompleteBy and redrives (as for any lost request). A redelivered resume is stale.
        commit(view, new_state, [running.replacing(step)], [resumed, dispatch_event], ctx, note="resume"),
        send,
        info("step.resumed", view, step=step.name, attempt=running.attempt if msg.target == "step"
             else running.compensation_attempt, target=msg.target),
    ])
