"""Compensation: a compensation's reply, and what comes after a compensation ends.

Compensations run one at a time, in reverse step order (a parallel step's branches in reverse
order of completion: ``groups.rank``). When one ends (done, or failed for
good), the next Pending one is dispatched, or the order finishes. A reply's handler holds the
claim and dispatches the next one itself; the Supervisor (after giving up on a compensation)
hands the order to a scheduler instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from shared.core.effects import Alert, Effect
from shared.core.lease import Lease
from shared.core.messages import ReplyMessage
from shared.core.rows import StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.deadlines import drop_index, hand_off
from shared.core.statemachine.dispatch import (
    compensation_dispatched,
    compensation_request,
    dispatch_compensation,
    inflight_requests,
)
from shared.core.statemachine.groups import rank
from shared.core.statemachine.history import Event, EventKind, commit, event
from shared.core.statemachine.outbox import alert, info, log, status_sends
from shared.core.statemachine.search_index import reindex
from shared.core.statemachine.verdicts import Decision, Verdict
from shared.core.statemachine.view import View
from shared.core.statemachine.waiting import end_wait, waiting_reply
from shared.core.statemachine.webhook import tell
from shared.core.states import CompensationState, Mode, OrderCompensation


def compensation_reply(view: View, step: StepRow, reply: ReplyMessage, ctx: Ctx) -> Decision:
    """An agent's reply to a compensation request."""
    state = view.state
    assert state is not None
    live = (state.mode is Mode.COMPENSATE and state.claimed
            and state.lease == Lease.for_compensation(reply.step, reply.attempt)
            and step.compensation is CompensationState.RUNNING and step.compensation_attempt == reply.attempt)
    if live:
        if reply.outcome == "waiting":
            return waiting_reply(view, step, reply, ctx)
        step, resumed, forget = end_wait(view, step)  # a waiting attempt's probe got an answer
        if reply.outcome == "success":
            done = replace(step, compensation=CompensationState.DONE, compensation_result=reply.result or {},
                           compensation_finished_at=ctx.now, compensation_complete_by=None)
            return next_compensation(view, step, done, ctx, before=resumed).then(*forget)
        reason = reply.reason or "rejected"
        failed = replace(step, compensation=CompensationState.FAILED, compensation_reason=reason,
                         compensation_finished_at=ctx.now, compensation_complete_by=None)
        warning = alert(view, step.name, f"compensation failed: {reason}", state.failure_count,
                        f"{step.name}:compensate:{reply.attempt}", ctx)
        return next_compensation(view, step, failed, ctx, warning=warning, before=resumed).then(*forget)
    if step.compensation_attempt == reply.attempt and step.compensation in (CompensationState.DONE,
                                                                             CompensationState.FAILED):
        effects: list[Effect] = [info("reply.duplicate", view, step=reply.step, attempt=reply.attempt,
                                      kind="compensation")]
        return Decision(Verdict.DUPLICATE, [*effects, *inflight_requests(view, ctx)])
    return Decision(Verdict.STALE, [log(logging.WARNING, "reply.stale", view, step=reply.step, attempt=reply.attempt,
                                  kind="compensation", lease=str(state.lease))])


def next_compensation(view: View, step: StepRow, ended: StepRow, ctx: Ctx, *, warning: Alert | None = None,
                      by_supervisor: bool = False, comp_failure_count: int | None = None,
                      before: Sequence[Event] = ()) -> Decision:
    """After the compensation of ``step`` ended (``ended`` is its new row): the next one, or finish.
    ``before``: events to record ahead of its own (the end of the compensation's wait on a breaker)."""
    state = view.state
    assert state is not None
    state_now = state if comp_failure_count is None else replace(state, comp_failure_count=comp_failure_count)
    after = view.with_steps(ended)
    # the next one back in the order the effects were applied (a parallel step's branches by completion)
    pending = [s for s in after.steps if s.compensation is CompensationState.PENDING
               and rank(s, ctx) < rank(step, ctx)]
    head: list[Effect] = [warning] if warning else []
    events = [*before, *_ended_events(step, ended, warning)]
    if not pending:
        return _compensated(view, step, ended, state_now, head, events, ctx)
    following = max(pending, key=lambda s: rank(s, ctx))
    if by_supervisor:
        return _hand_off_next(view, step, ended, state_now, following, head, events, ctx)
    running, new_state = dispatch_compensation(following, replace(state_now, comp_failure_count=0), ctx)
    return Decision(Verdict.COMPENSATION_NEXT, head + [
        # No index write: the order's row covers the next deadline.
        # Crash after this: the redelivered reply is a duplicate and re-sends the next
        # compensation request; else the Supervisor expires its lease.
        commit(view, new_state, [ended.replacing(step), running.replacing(following)],
               [*events, compensation_dispatched(running)], ctx, note="compensation ended, next dispatched"),
        compensation_request(after.with_steps(running), running, ctx),
        info("compensation.ended", view, step=step.name, compensation=ended.compensation, next=following.name),
    ])


def _ended_events(step: StepRow, ended: StepRow, warning: Alert | None) -> list[Event]:
    """The events of a compensation that ended: done, or failed for good (with its alert)."""
    attempt = ended.compensation_attempt
    if ended.compensation is CompensationState.DONE:
        return [event(EventKind.COMPENSATION_DONE, step.name, attempt)]
    failed = [event(EventKind.COMPENSATION_FAILED, step.name, attempt, reason=ended.compensation_reason)]
    if warning is not None:
        failed.append(event(EventKind.ALERT, step.name, attempt, reason=warning.reason,
                            failureCount=warning.failure_count))
    return failed


def _hand_off_next(view: View, step: StepRow, ended: StepRow, state_now: StateRow, following: StepRow,
                   head: list[Effect], events: list[Event], ctx: Ctx) -> Decision:
    state = view.state
    assert state is not None
    # The Supervisor (not a reply): the index row it is handling ends; cover the new deadline.
    handoff = hand_off(view, ctx, note="compensation unclaimed guard")
    new_state = handoff.apply(replace(state_now, comp_index=following.index, comp_failure_count=0))
    return Decision(Verdict.COMPENSATION_NEXT, head + [
        *handoff.puts,
        # Crash after this: the new row fires and the Supervisor schedules the next one.
        commit(view, new_state, [ended.replacing(step)], events, ctx, note="compensation ended, next scheduled"),
        handoff.notice,
    ])


def _compensated(view: View, step: StepRow, ended: StepRow, state_now: StateRow, head: list[Effect],
                 events: list[Event], ctx: Ctx) -> Decision:
    state = view.state
    assert state is not None
    after = view.with_steps(ended)
    any_failed = any(s.compensation is CompensationState.FAILED for s in after.steps)
    summary = OrderCompensation.FAILED if any_failed else OrderCompensation.COMPLETED
    new_state = replace(state_now, mode=Mode.FINISHED, locked_by=None, claim_token=None,
                        complete_by=None, lease=None, compensation_state=summary, updated_at=ctx.now,
                        finished_at=ctx.now)
    told = tell(view, new_state, ctx)
    return Decision(Verdict.COMPENSATED, head + [
        # Crash after this: the ending did not commit; its webhook watch finds no delivery and goes.
        *told.cover,
        # Crash after this: final; only best-effort status is missing.
        commit(view, new_state, [ended.replacing(step), *told.ops],
               [*events, event(EventKind.COMPENSATED, outcome=state.outcome, compensation=summary)], ctx,
               note="last compensation ended"),
        *status_sends(view, "compensated", ctx, outcome=state.outcome, compensation=summary),
        info("order.compensated", view, outcome=state.outcome, anyFailed=any_failed),
        # Crash before these: the deadline row is kept; the Supervisor re-indexes, then deletes it.
        *reindex(view.order, state, new_state),
        *told.sends,  # the webhook's try 1, after the index (a client told may search); lost: its watch sends it
        *drop_index(state),
    ])
