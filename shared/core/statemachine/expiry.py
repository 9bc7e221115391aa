"""The Supervisor's moves on an order whose deadline passed: re-send a lost schedule notice,
redrive a step or a compensation (FailureCount+1, with backoff), or give up on it.

Every outcome with a deadline left puts the index row that covers it first (the row being
handled is deleted after, by the sweep). An expired attempt's row in its remote's waiting list,
if its agent registered one (a wait, or a ``waiting`` reply that never arrived), is forgotten
after the write. Every write is ETag-conditioned, so two Supervisors
never count one failure twice.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from shared.core.breaker.waiting import WaitingStep
from shared.core.effects import Effect, ForgetWaiting
from shared.core.lease import LeaseKind
from shared.core.rows import StateRow, StepRow
from shared.core.statemachine.compensation import next_compensation
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.deadlines import cover, hand_off
from shared.core.statemachine.events import waited_out
from shared.core.statemachine.failure import fail_step
from shared.core.statemachine.groups import in_flight
from shared.core.statemachine.history import EventKind, commit, event
from shared.core.statemachine.outbox import alert, log
from shared.core.statemachine.verdicts import Decision, Verdict
from shared.core.statemachine.view import View
from shared.core.statemachine.waiting import rewake
from shared.core.states import CompensationState, ProcessState, StepState


def decide_expired(view: View, ctx: Ctx) -> Decision:
    """The Supervisor on an order whose index row fell due."""
    state = view.state
    if state is None or state.lease is None or state.complete_by is None:
        return Decision(Verdict.OBSOLETE)
    if state.complete_by > ctx.now:
        return Decision(Verdict.NOT_DUE, [cover(view.order_id, state.complete_by, ctx, note="moved")])
    lease = state.lease
    if lease.is_unclaimed:
        return _reschedule(view, state, ctx)
    step = view.step(lease.step)
    if step is None and lease.kind is LeaseKind.STEP and in_flight(view, ctx):
        # a parallel step's group (``groups``): its branches not done are redriven together
        running = in_flight(view, ctx)
        return _attempt_expired(view, state, running, ctx).then(*(e for b in running for e in _lost_wait(view, b, ctx)))
    if step is None:
        return Decision(Verdict.OBSOLETE, [log(logging.ERROR, "supervisor.unknown_step", view, lease=str(lease))])
    if lease.kind is LeaseKind.STEP:
        if step.state is not StepState.RUNNING or step.attempt != lease.attempt:
            return _inconsistent(view, state)
        return _step_expired(view, state, step, ctx)
    if step.compensation is not CompensationState.RUNNING or step.compensation_attempt != lease.attempt:
        return _inconsistent(view, state)
    return _compensation_expired(view, state, step, ctx)


def _inconsistent(view: View, state: StateRow) -> Decision:
    return Decision(Verdict.OBSOLETE, [log(logging.ERROR, "supervisor.inconsistent", view, lease=str(state.lease))])


def _reschedule(view: View, state: StateRow, ctx: Ctx) -> Decision:
    """Lost send (redrive, retry, cancel): the order waited unclaimed past the grace period.
    Re-send the schedule message and push the deadline (ETag: once per race)."""
    handoff = hand_off(view, ctx, note="unclaimed guard")
    new_state = handoff.apply(state)
    return Decision(Verdict.RESCHEDULED, [
        # Crash after this: the overdue row is still there; the next sweep redoes this.
        *handoff.puts,
        # Crash after this (schedule not sent): the new row fires by the grace period.
        commit(view, new_state, [], [event(EventKind.RESCHEDULED, seq=new_state.schedule_seq, mode=state.mode)], ctx,
               note="unclaimed rescheduled"),
        handoff.notice,
        log(logging.WARNING, "supervisor.unclaimed_rescheduled", view, seq=new_state.schedule_seq, mode=state.mode),
    ])


def _waited_too_long(step: StepRow, ctx: Ctx) -> str:
    return (f"waited {ctx.config.breaker_max_wait_seconds:g} s on the open breaker of {step.waiting_on} "
            f"(BreakerMaxWaitSeconds)")


def _lost_wait(view: View, step: StepRow, ctx: Ctx, *, compensation: bool = False) -> list[Effect]:
    """The attempt's row in its remote's waiting list, which an agent may have registered for a
    ``waiting`` reply that never arrived: forgotten with the attempt (after the write)."""
    attempt = step.compensation_attempt if compensation else step.attempt
    waiting = WaitingStep(view.order_id, attempt, step.name, "compensation" if compensation else "step")
    return [ForgetWaiting(ctx.config.spec(step.name).agent, waiting.row_key)]


def _step_expired(view: View, state: StateRow, step: StepRow, ctx: Ctx) -> Decision:
    if ctx.config.spec(step.name).kind != "call":  # a wait or a delay: no agent, no redrive
        return waited_out(view, step, ctx)
    woken = rewake(view, step, ctx)  # a rate limit's wake-up overdue: sent again, no failure
    if woken is not None:
        return woken
    return _attempt_expired(view, state, [step], ctx).then(*_lost_wait(view, step, ctx))


def _attempt_expired(view: View, state: StateRow, steps: list[StepRow], ctx: Ctx) -> Decision:
    """``steps``: the step in flight, or a parallel step's branches in flight (the first one's
    retry policy counts; a failure for good stops the others)."""
    step = steps[0]
    if step.waiting_on is not None:
        # The longest wait on a breaker is over: the step fails for good, once, whatever the
        # number of probes (docs/breakers-and-lanes.md, "How long an order waits"). Its probes
        # may have reached the remote: its outcome is unknown, as after a timeout.
        return fail_step(view, replace(step, waiting_on=None), f"{_waited_too_long(step, ctx)}, attempt {step.attempt}",
                         ctx, timed_out=True)
    failures = state.failure_count + 1
    reason = f"timed out (attempt {step.attempt})"
    spec = ctx.config.spec(step.name)
    limit = ctx.config.max_failures_of(spec)
    if failures >= limit:
        # Timed out: no answer, so the effect may have been applied (reply lost, agent hung
        # after the call). Its outcome is unknown: compensated by its idempotency key.
        return fail_step(view, step, f"{reason}; failure count {failures} reached {limit}", ctx,
                         timed_out=True, failure_count=failures)
    # OutcomeUnknown: the attempt may have applied the effect; a cancel of the Pending order
    # compensates it (an error reply or Done of a later attempt settles it).
    pending = [replace(s, state=StepState.PENDING, complete_by=None, failure_reason=reason, outcome_unknown=True)
               for s in steps]
    ops = [row.replacing(old) for row, old in zip(pending, steps, strict=True)]
    if state.suspended:  # no scheduler gets it until an operator resumes it (shared.core.statemachine.suspend)
        paused = replace(state, process_state=ProcessState.PENDING, failure_count=failures, locked_by=None,
                         claim_token=None, lease=None, complete_by=None, updated_at=ctx.now)
        return Decision(Verdict.REDRIVEN, [
            # ETag-conditional, as every redrive; the row being handled is deleted by the sweep.
            commit(view, paused, ops,
                   [event(EventKind.REDRIVEN, s.name, s.attempt, reason=reason, failureCount=failures,
                          suspended=True) for s in steps], ctx, note="redrive, suspended"),
            log(logging.WARNING, "supervisor.redrive_suspended", view, step=step.name, attempt=step.attempt,
                failureCount=failures),
        ])
    delay = ctx.config.backoff(failures, spec)
    handoff = hand_off(view, ctx, note="redrive unclaimed guard", delay=delay)
    new_state = handoff.apply(replace(state, process_state=ProcessState.PENDING, failure_count=failures))
    return Decision(Verdict.REDRIVEN, [
        # Crash after this: state unchanged; the row is still overdue: next sweep.
        *handoff.puts,
        # FailureCount+1, claim released, Pending: ETag-conditional, so two supervisors
        # never count one failure twice. Crash after this (notice not sent): the
        # new row fires by delay+grace and the schedule message is re-sent.
        commit(view, new_state, ops,
               [event(EventKind.REDRIVEN, s.name, s.attempt, reason=reason, failureCount=failures,
                      backoffSeconds=delay.total_seconds()) for s in steps], ctx, note="redrive"),
        handoff.notice,
        log(logging.WARNING, "supervisor.redrive", view, step=step.name, attempt=step.attempt, failureCount=failures,
            delaySeconds=delay.total_seconds()),
    ])


def _compensation_expired(view: View, state: StateRow, step: StepRow, ctx: Ctx) -> Decision:
    woken = rewake(view, step, ctx, compensation=True)
    if woken is not None:
        return woken
    return _compensation_attempt_expired(view, state, step, ctx).then(*_lost_wait(view, step, ctx, compensation=True))


def _compensation_attempt_expired(view: View, state: StateRow, step: StepRow, ctx: Ctx) -> Decision:
    attempt = step.compensation_attempt
    if step.waiting_on is not None:  # as a step's: the longest wait is over, the compensation fails for good
        reason = f"compensation {_waited_too_long(step, ctx)}, attempt {attempt}"
        failed = replace(step, compensation=CompensationState.FAILED, compensation_reason=reason,
                         compensation_finished_at=ctx.now, compensation_complete_by=None, waiting_on=None)
        warning = alert(view, step.name, f"compensation failed: {reason}", state.comp_failure_count,
                        f"{step.name}:compensate:{attempt}", ctx)
        return next_compensation(view, step, failed, ctx, warning=warning, by_supervisor=True)
    failures = state.comp_failure_count + 1
    reason = f"compensation timed out (attempt {attempt})"
    spec = ctx.config.spec(step.name)
    if failures >= ctx.config.max_failures_of(spec):
        failed = replace(step, compensation=CompensationState.FAILED,
                         compensation_reason=f"{reason}; gave up after {failures}", compensation_finished_at=ctx.now,
                         compensation_complete_by=None)
        warning = alert(view, step.name, f"compensation failed: {reason}", failures,
                        f"{step.name}:compensate:{attempt}", ctx)
        return next_compensation(view, step, failed, ctx, warning=warning, by_supervisor=True,
                                 comp_failure_count=failures)
    delay = ctx.config.backoff(failures, spec)
    handoff = hand_off(view, ctx, note="compensation redrive guard", delay=delay)
    new_state = handoff.apply(replace(state, comp_failure_count=failures))
    pending = replace(step, compensation=CompensationState.PENDING, compensation_complete_by=None,
                      compensation_reason=reason)
    return Decision(Verdict.COMPENSATION_REDRIVEN, [
        *handoff.puts,
        # Same as a step redrive: ETag-conditional, the new row backs up the notice.
        commit(view, new_state, [pending.replacing(step)],
               [event(EventKind.COMPENSATION_REDRIVEN, step.name, attempt, reason=reason, failureCount=failures,
                      backoffSeconds=delay.total_seconds())], ctx, note="compensation redrive"),
        handoff.notice,
        log(logging.WARNING, "supervisor.compensation_redrive", view, step=step.name, attempt=attempt,
            compFailureCount=failures),
    ])
