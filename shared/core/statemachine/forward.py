"""The forward path: the submission, a scheduler's claim, and a step's reply."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from shared.core.effects import DeleteIndex, Effect, Log, PutIndex, Send
from shared.core.messages import ReplyMessage
from shared.core.room import ROOM_SEQ
from shared.core.rows import OrderRow, StateRow, StepRow
from shared.core.statemachine.admission import admitted, join_room, waiting_submission
from shared.core.statemachine.compensation import compensation_reply
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.deadlines import cover, drop_index, hand_off
from shared.core.statemachine.dispatch import (
    compensation_dispatched,
    compensation_request,
    dispatch,
    dispatch_compensation,
    dispatched,
    first_sends,
    inflight_requests,
    step_sends,
)
from shared.core.statemachine.failure import fail_step
from shared.core.statemachine.groups import STOPPED_REASON, group_of, lease_names, members
from shared.core.statemachine.history import Event, EventKind, commit, event
from shared.core.statemachine.outbox import alert, info, log, schedule_message, status_sends
from shared.core.statemachine.search_index import reindex
from shared.core.statemachine.verdicts import Decision, Verdict
from shared.core.statemachine.view import View
from shared.core.statemachine.waiting import end_wait, waiting_reply
from shared.core.statemachine.webhook import tell
from shared.core.states import (
    TERMINATED_REASON,
    CompensationState,
    Mode,
    Outcome,
    ProcessState,
    StepState,
)


def plan_submission(order_id: str, canonical: dict[str, Any], *, total: str, body_hash: str,
                    idempotency_key: str | None, traceparent: str, ctx: Ctx, room: str | None = None,
                    waiting: bool = False) -> list[Effect]:
    """The submission: the order, its state and step rows in ONE transaction, and the
    Scheduler told in-process: that transaction is also the Scheduler's first claim (the
    state row is written claimed, the first step Running, attempt 1), and the first request
    is sent right after it. The scheduler queue carries what needs a claim later (redrives,
    compensations, operator actions); the order's start needs no message of its own. The order
    runs the workflow ``ctx.config`` is bound to, recorded on its order row.

    ``room``: the customer's room (``shared.core.room``) when ``CustomerMaxInFlight`` caps it: the
    order holds a slot there already, or (``waiting``) it waits for one (``admission.waiting_submission``)."""
    order = OrderRow(customer_id=canonical["customerId"], currency=canonical["currency"], items=canonical["items"],
                     total=total, priority=canonical["priority"], status_queue=canonical["statusQueue"],
                     body_hash=body_hash, idempotency_key=idempotency_key, traceparent=traceparent, created_at=ctx.now,
                     workflow=ctx.config.workflow_name, workflow_version=ctx.config.workflow_version)
    # A step whose ``when`` does not hold for this order is Skipped from the start (its fields never
    # change); the loader makes sure at least one step runs.
    facts = {**order.payload(), "priority": order.priority}
    pending = [StepRow(name=s.name, index=i, state=StepState.PENDING if s.runs_for(facts) else StepState.SKIPPED)
               for i, s in enumerate(ctx.config.workflow)]
    skipped = [s.name for s in pending if s.state is StepState.SKIPPED]
    runs = next(s for s in pending if s.state is not StepState.SKIPPED)
    if room is not None and waiting:
        return waiting_submission(order, order_id, pending, runs, room, ctx,
                                  accepted=_accepted(order, total, skipped))
    claimed = StateRow(order_id=order_id, process_state=ProcessState.PROCESSING, mode=Mode.FORWARD,
                       locked_by=ctx.instance_id, claim_token=ctx.token, created_at=ctx.now, room=room)
    first, state = dispatch(View(order, claimed, tuple(pending)), runs, claimed, ctx)
    assert state.complete_by is not None
    index = cover(order_id, state.complete_by, ctx, note="order deadline")
    state = replace(state, index_due=index.due)
    view = View(order, state, tuple(pending)).with_steps(*first)
    return [
        # Crash after this: no order row exists; the sweep finds no state row and deletes the
        # index row once it is ORPHAN_INDEX_AGE old. The client saw no 202 and retries.
        index,
        # The ONE write of the submission (order + state + step rows, one transaction), the
        # first step claimed. A second submission with the same id conflicts here (replay).
        # Crash after this (request not sent): the client's retry replays and re-sends it
        # (same message id: deduplicated); without a retry the Supervisor finds the step
        # overdue at CompleteBy and redrives it (FailureCount+1), like any lost request.
        commit(View(order, None, view.steps), state, (row.create() for row in (order, *view.steps)),
               [_accepted(order, total, skipped), *(dispatched(r) for r in first)], ctx,
               note="submission + first claim"),
        # Before the request: the transitions it causes write the order's index rows after these,
        # never before (a late in-flight row would list a finished order as in flight for good).
        # Crash after the transaction, before this: the order is not listed in search until
        # its category next changes (every index write puts all of its rows).
        *reindex(order, None, state),
        *(send for r in first for send in first_sends(view, r, ctx)),
        *status_sends(view, "received", ctx, processState=ProcessState.PROCESSING),
        info("order.claimed", view, step=state.step_name, lease=str(state.lease), completeBy=state.complete_by),
    ]


def _accepted(order: OrderRow, total: str, skipped: list[str]) -> Event:
    return event(EventKind.ACCEPTED, total=total, currency=order.currency, items=len(order.items),
                 priority=order.priority, workflow=order.workflow, workflowVersion=order.workflow_version,
                 skipped=skipped or None)


def plan_replay(view: View, submitted: Sequence[Effect], ctx: Ctx | None, *, same_body: bool) -> list[Effect]:
    """A submission whose create lost to an order of the same id (its Idempotency-Key again):
    ``submitted`` is its plan, ``view`` the order that exists, ``ctx`` bound to that order's
    workflow (None: the workflow is gone, nothing to re-send). ``same_body``: the same order again,
    whose first submission may have died before it sent; else a 409, and nothing is sent."""
    state = view.state
    assert state is not None
    # This request's own deadline row (its key names this request's due instant, so it is no row
    # of the existing order's). Best effort: a row left behind falls due and the sweep deletes it.
    effects: list[Effect] = [DeleteIndex(e.bucket, e.row_key) for e in submitted if isinstance(e, PutIndex)]
    if not same_body or ctx is None:
        return effects
    if state.waits_for_room:
        # Waiting for its customer's room: its first submission may have died before it joined the
        # waiters. Joined again (a copy finds its row there), the deadline row this request put dropped.
        return [*effects, join_room(view, ctx)]
    if state.waiting_for_claim:
        # Redriven and waiting for a claim: its schedule notice may have been lost. Same seq, same
        # message id: a copy is deduplicated.
        priority = view.order.priority if view.order is not None else None
        return [*effects, Send(schedule_message(view.order_id, state.schedule_seq, ctx, view.traceparent,
                                                priority=priority), critical=False, what="schedule (replay)")]
    # The first submission may have died between its transaction and its send: the requests in
    # flight again, with their message ids (deduplicated when they were sent).
    return [*effects, *(Send(resend.message, critical=False, what="request (replay)")
                        for resend in inflight_requests(view, ctx))]


def decide_schedule(view: View, seq: int, ctx: Ctx) -> Decision:
    """A schedule message: claim the order if it waits for a claim."""
    state = view.state
    if state is None or view.order is None:
        return Decision(Verdict.UNKNOWN_ORDER, [Log(logging.ERROR, "schedule.unknown_order", None, None, {})])
    if state.waits_for_room:
        if seq != ROOM_SEQ or state.suspended:
            return Decision(Verdict.IGNORED, [info("schedule.ignored", view, seq=seq, waitingRoom=state.room)])
        return admitted(view, ctx)
    if state.waiting_for_claim:
        return _claim(view, seq, ctx)
    if state.claimed and state.claimed_seq == seq:
        # The same schedule message again (redelivered after a crash between the claim and
        # the request send): re-send the in-flight request. Same message_id: deduplicated.
        resend = inflight_requests(view, ctx)
        if resend:
            return Decision(Verdict.RESUMED, [*resend, info("schedule.resumed", view, seq=seq)])
    return Decision(Verdict.IGNORED, [info("schedule.ignored", view, seq=seq, processState=state.process_state,
                                     lease=str(state.lease))])


def _claim(view: View, seq: int, ctx: Ctx) -> Decision:
    state = view.state
    assert state is not None
    claimed = replace(state, locked_by=ctx.instance_id, claim_token=ctx.token, claimed_seq=seq)
    inconsistent = Decision(Verdict.INCONSISTENT, [log(logging.ERROR, "schedule.inconsistent", view, seq=seq)])
    if state.mode is Mode.FORWARD:
        step = view.step_at(state.step_index)
        if step is None:
            return inconsistent
        # a step, or every branch of a parallel step not done yet (groups)
        rows, new_state = dispatch(view, step, replace(claimed, process_state=ProcessState.PROCESSING), ctx)
        if not rows or (step.state is StepState.DONE and group_of(step, ctx) is None):
            return inconsistent
        after = view.with_steps(*rows).with_state(new_state)
        return Decision(Verdict.CLAIMED, [
            # No index write: the order's row covers this deadline (>= now + floor).
            # The claim and the step (or branches) Running, attempt n, ONE transaction. Lost ETag
            # race: another instance owns the order. Crash after this (requests not sent): a
            # redelivered schedule message (seq == ClaimedSeq) re-sends them; otherwise the
            # Supervisor expires the lease at CompleteBy and redrives.
            commit(view, new_state, view.replacing(rows), [dispatched(r) for r in rows], ctx, note="claim"),
            *(send for r in rows for send in step_sends(after, r, ctx)),
            info("order.claimed", view, step=new_state.step_name, lease=str(new_state.lease),
                 completeBy=new_state.complete_by),
        ])
    if state.mode is Mode.COMPENSATE:
        step = view.step_at(state.comp_index)
        if step is None or step.compensation not in (CompensationState.PENDING, CompensationState.RUNNING):
            return inconsistent
        # ProcessState stays Error while compensating
        running, new_state = dispatch_compensation(step, claimed, ctx)
        sends = [compensation_request(view, running, ctx)]
        claimed_event = compensation_dispatched(running)
    else:
        return Decision(Verdict.IGNORED, [info("schedule.ignored", view, seq=seq, mode=state.mode)])
    return Decision(Verdict.CLAIMED, [
        # No index write: the order's row covers this deadline (>= now + floor).
        # The claim: LockedBy/CompleteBy/Processing + step Running (attempt n) in ONE transaction.
        # Lost ETag race -> another instance owns the order: nothing after this runs.
        # Crash after this (request not sent): a redelivered schedule message (seq == ClaimedSeq)
        # re-sends it; otherwise the Supervisor expires the lease at CompleteBy and redrives.
        commit(view, new_state, [running.replacing(step)], [claimed_event], ctx, note="claim"),
        *sends,
        info("order.claimed", view, step=running.name, lease=str(new_state.lease), completeBy=new_state.complete_by),
    ])


def decide_reply(view: View, reply: ReplyMessage, ctx: Ctx) -> Decision:
    """An agent's reply, for a step or a compensation."""
    if view.state is None or view.order is None:
        return Decision(Verdict.POISON, [Log(logging.ERROR, "reply.unknown_order", reply.orderId, None,
                                       {"step": reply.step, "attempt": reply.attempt})])
    step = view.step(reply.step)
    if step is None:
        return Decision(Verdict.POISON, [log(logging.ERROR, "reply.unknown_step", view, step=reply.step)])
    if reply.kind == "step":
        return _step_reply(view, step, reply, ctx)
    return compensation_reply(view, step, reply, ctx)


def _step_reply(view: View, step: StepRow, reply: ReplyMessage, ctx: Ctx) -> Decision:
    state = view.state
    assert state is not None
    live = (state.mode is Mode.FORWARD and state.claimed and lease_names(state, step, reply.attempt, ctx)
            and step.state is StepState.RUNNING and step.attempt == reply.attempt)
    if live:
        if reply.outcome == "waiting" and group_of(step, ctx) is not None:
            # a branch does not wait on a breaker (groups): it is redriven at its group's deadline
            return Decision(Verdict.IGNORED, [log(logging.WARNING, "branch.waiting_ignored", view, step=step.name,
                                                  attempt=reply.attempt, breaker=reply.breaker)])
        if reply.outcome == "waiting":
            return waiting_reply(view, step, reply, ctx)
        step, resumed, forget = end_wait(view, step)  # a waiting attempt's probe got an answer
        if reply.outcome == "success":
            return step_done(view, step, reply.result or {}, ctx, before=resumed).then(*forget)
        # An error reply: the remote rejected the key and applied nothing under it.
        return fail_step(view, step, reply.reason or "rejected", ctx, timed_out=False, before=resumed).then(*forget)
    # an attempt terminate (or its branch's failure) stopped: its reply is late
    fenced = step.failure_reason in (TERMINATED_REASON, STOPPED_REASON)
    if step.attempt == reply.attempt and step.state in (StepState.DONE, StepState.FAILED) and not fenced:
        effects: list[Effect] = [info("reply.duplicate", view, step=reply.step, attempt=reply.attempt)]
        if step.state is StepState.FAILED:
            # the alert may have been lost in a crash: re-send it (same id: deduplicated)
            effects.append(alert(view, step.name, step.failure_reason or "failed", state.failure_count,
                                 f"{step.name}:{reply.attempt}", ctx))
        return Decision(Verdict.DUPLICATE, [*effects, *inflight_requests(view, ctx)])
    return Decision(Verdict.STALE, [log(logging.WARNING, "reply.stale", view, step=reply.step, attempt=reply.attempt,
                                  currentAttempt=step.attempt, stepState=step.state, lease=str(state.lease))])


def step_done(view: View, step: StepRow, result: dict[str, Any], ctx: Ctx, *,
              before: Sequence[Event] = (), by_supervisor: bool = False) -> Decision:
    """``step``'s reply recorded as its result, and what follows, one of five: a branch done while
    others run; the next step paused (the order is suspended); the next step handed to a scheduler
    (``by_supervisor``: the Supervisor ends a wait or a delay past its CompleteBy, and deletes the
    index row it is handling, so the hand-off writes one for the next deadline); the next step
    dispatched; or the order processed. ``before``: events to record ahead of the step's own (the
    end of its wait on a breaker)."""
    state = view.state
    assert state is not None
    done = _Done(view, state, step, replace(step, state=StepState.DONE, result=result, finished_at=ctx.now,
                                            complete_by=None),
                 [*before, event(EventKind.STEP_DONE, step.name, step.attempt)], ctx)
    group = members(view, step, ctx)
    if any(b.state is StepState.RUNNING for b in group if b.index != step.index):
        return _branch_done(done)
    following = view.after(max(b.index for b in group))
    if following is None:
        return _processed(done)
    if state.suspended:
        return _next_paused(done, following)
    if by_supervisor:
        return _next_handed_on(done, following)
    return _next_dispatched(done, following)


@dataclass(frozen=True)
class _Done:
    """A step's reply as ``step_done`` records it: the order, the step before and after, the events."""

    view: View
    state: StateRow
    step: StepRow
    row: StepRow  # the step, Done with its result
    events: list[Event]  # the events before it, and its own STEP_DONE
    ctx: Ctx


def _branch_done(d: _Done) -> Decision:
    """A branch of a parallel step, others still in flight: the last one dispatches the next step."""
    return Decision(Verdict.BRANCH_DONE, [
        # Crash after this: the redelivered reply is a duplicate; the other branches' replies go on.
        commit(d.view, replace(d.state, updated_at=d.ctx.now), [d.row.replacing(d.step)], d.events, d.ctx,
               note="branch done"),
        *status_sends(d.view, "step-done", d.ctx, step=d.step.name),
        info("branch.done", d.view, step=d.step.name, attempt=d.step.attempt),
    ])


def _next_paused(d: _Done, following: StepRow) -> Decision:
    """Suspended by an operator (shared.core.statemachine.suspend): the next step waits for a
    resume, with nothing in flight, so no deadline (the Supervisor counts no time against it)."""
    paused = replace(d.state, process_state=ProcessState.PENDING, locked_by=None, claim_token=None, lease=None,
                     complete_by=None, step_index=following.index, step_name=following.name, updated_at=d.ctx.now)
    return Decision(Verdict.STEP_DONE_SUSPENDED, [
        # Crash after this: the redelivered reply is a duplicate; nothing is in flight to re-send.
        commit(d.view, paused, [d.row.replacing(d.step)], d.events, d.ctx, note="step done, suspended"),
        *status_sends(d.view, "step-done", d.ctx, step=d.step.name),
        info("step.done_suspended", d.view, step=d.step.name, attempt=d.step.attempt, next=following.name),
        # Crash before this: the row falls due and the sweep deletes it (nothing has a deadline).
        *drop_index(d.state),
    ])


def _next_handed_on(d: _Done, following: StepRow) -> Decision:
    """The Supervisor ended the step: the next one is Pending, handed to a scheduler."""
    handoff = hand_off(d.view, d.ctx, note="next step unclaimed guard")
    pending = handoff.apply(replace(d.state, process_state=ProcessState.PENDING, step_index=following.index,
                                    step_name=following.name))
    return Decision(Verdict.STEP_DONE, [
        # Crash after this: state unchanged; the overdue row is still due: the next sweep redoes it.
        *handoff.puts,
        # Step Done, the next one Pending and unclaimed. Crash after this (notice not sent):
        # the new row fires by the grace period and the Supervisor sends it again.
        commit(d.view, pending, [d.row.replacing(d.step)], d.events, d.ctx, note="step done, handed on"),
        handoff.notice,
        *status_sends(d.view, "step-done", d.ctx, step=d.step.name),
        info("step.done_handed_on", d.view, step=d.step.name, attempt=d.step.attempt, next=following.name),
    ])


def _next_dispatched(d: _Done, following: StepRow) -> Decision:
    """The claim (LockedBy) carries on to the next step (or every branch of a parallel one)."""
    running, new_state = dispatch(d.view, following, d.state, d.ctx)
    after = d.view.with_steps(d.row, *running).with_state(new_state)
    return Decision(Verdict.STEP_DONE, [
        # No index write: the order's row covers the next deadline (>= now + floor).
        # Step Done (+result) and next step Running and state, ONE transaction.
        # Crash after this: the redelivered reply is a duplicate of a Done step and
        # re-sends the next request (inflight_requests); if the reply is not redelivered,
        # the Supervisor expires the next lease at CompleteBy and redrives.
        commit(d.view, new_state, [d.row.replacing(d.step), *d.view.replacing(running)],
               [*d.events, *(dispatched(r) for r in running)], d.ctx, note="step done + next dispatched"),
        *(send for r in running for send in step_sends(after, r, d.ctx)),
        *status_sends(d.view, "step-done", d.ctx, step=d.step.name),
        info("step.done", d.view, step=d.step.name, attempt=d.step.attempt, next=new_state.step_name),
    ])


def _processed(d: _Done) -> Decision:
    """The last step done: the order is Processed."""
    now = d.ctx.now
    new_state = replace(d.state, process_state=ProcessState.PROCESSED, mode=Mode.FINISHED,
                        outcome=Outcome.PROCESSED, locked_by=None, claim_token=None, complete_by=None, lease=None,
                        updated_at=now, finished_at=now)
    told = tell(d.view, new_state, d.ctx)
    return Decision(Verdict.PROCESSED, [
        # Crash after this: the ending did not commit; its webhook watch finds no delivery and goes.
        *told.cover,
        # Crash after this: the order is Processed; status messages may be missing (best-effort);
        # its index row is deleted next (best effort), else lazily by the sweep.
        commit(d.view, new_state, [d.row.replacing(d.step), *told.ops], [*d.events, event(EventKind.PROCESSED)],
               d.ctx, note="last step done"),
        *status_sends(d.view, "step-done", d.ctx, step=d.step.name),
        *status_sends(d.view, "processed", d.ctx, processState=ProcessState.PROCESSED),
        info("order.processed", d.view, step=d.step.name),
        # Crash before these: the deadline row is kept; the Supervisor re-indexes, then deletes it.
        *reindex(d.view.order, d.state, new_state),
        *told.sends,  # the webhook's try 1, after the index (a client told may search); lost: its watch sends it
        *drop_index(d.state),
    ])


