"""Steps that wait on a remote's open circuit breaker: one state, from the first ``waiting`` reply
to the resume that ends it, however many probes the breaker makes meanwhile.

An agent whose remote's breaker is open makes no call: it registers the step as waiting (one row
per waiting step, ``shared.core.breaker.waiting``) and replies ``waiting``. The first such reply of
the attempt in flight records the wait: ``WaitingOn`` and ``WaitingSince`` on the step row,
``WaitingOn`` on the state row, one ``stepWaiting`` event, and CompleteBy moved to the end of the
longest wait (``BreakerMaxWaitSeconds`` from the attempt's first wait). The attempt, its
idempotency key and FailureCount do not move while it waits.

Resumes (:func:`decide_resume`) are of two kinds:

* ``probe``: the breaker's cool-down is over and this step carries its probe (the wake-up its
  reply claimed, or the Supervisor's when that one was lost). Its request is sent again, same
  attempt, and nothing is written: a probe that fails brings another ``waiting`` reply, which
  changes nothing but schedules the next wake-up.
* ``closed``: the breaker closed. The wait ends: one ``resumed`` event, CompleteBy back to the
  step's timeout, the request sent again. A live step whose wait is not recorded (yet) gets its
  request again too, and the close is recorded on it (``WaitingOpening``): its ``waiting`` reply,
  behind this resume and read on the opening that closed, is then stale.

A rate limit's wait (``shared.core.ratelimit``: a ``waiting`` reply that claims its wake-up with
no breaker opening) is the same wait, with no breaker to watch it: the step row keeps the wake-up
it is owed (``WakeAt``) and the order's deadline is that wake-up's (:func:`wake_deadline`), so a
wake-up lost in a crash is sent again by the Supervisor (:func:`rewake`), not failed.

A reply of the waiting attempt (done, or an error) ends the wait as well (:func:`end_wait`): its
probe got an answer. Past the longest wait, the Supervisor fails the step for good
(``shared.core.statemachine.expiry``), and a terminate stops it. Each end of a wait forgets the
step's waiting row after the state write; a stale resume forgets the row that named it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta

from shared.core.breaker.waiting import WaitingStep, closed_opening, probe_tag, resume_message
from shared.core.breaker.watch import WAKE_GRACE
from shared.core.effects import Effect, ForgetWaiting, Send
from shared.core.jsonio import present
from shared.core.lease import Lease
from shared.core.messages import ReplyMessage, ResumeMessage
from shared.core.rows import StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.deadlines import cover
from shared.core.statemachine.dispatch import compensation_request, step_request
from shared.core.statemachine.history import Event, EventKind, commit, event
from shared.core.statemachine.outbox import info, log
from shared.core.statemachine.verdicts import Decision, Verdict
from shared.core.statemachine.view import View
from shared.core.states import CompensationState, Mode, StepState
from shared.core.times import iso


def waiting_reply(view: View, step: StepRow, reply: ReplyMessage, ctx: Ctx) -> Decision:
    """A live ``waiting`` reply (its attempt holds the lease): record the wait, no failure."""
    state = view.state
    assert state is not None and reply.breaker is not None
    compensation = reply.kind == "compensation"
    wake = _wake(view, step, reply, ctx)
    rate = rate_wake(reply)
    if step.waiting_on is not None:
        # A later slot still ahead is owed; one already past (a late copy) goes out at once, unrecorded.
        if rate is not None and rate > ctx.now and (step.wake_at is None or rate > step.wake_at):
            return _rewaited(view, step, reply, rate, wake, ctx)
        if step.wake_at is not None and reply.opening is not None and not _before_close(step, reply.opening):
            return _now_the_breakers(view, step, reply, wake, ctx)
        # Recorded already (a copy of the reply, or the reply of a probe that failed): only the
        # next wake-up, if this reply claimed it.
        return Decision(Verdict.WAITING_DUPLICATE, [*wake, info("step.waiting_duplicate", view, step=step.name,
                                                                attempt=reply.attempt, wake=reply.wake)])
    if _before_close(step, reply.opening):
        # The agent read an opening whose close already ended this attempt's wait: a copy of an
        # earlier waiting reply, or one from before that close. The breaker is not open on it any
        # more, and the request the close sent again answers for the step: no new wait, no probe.
        return Decision(Verdict.STALE, [info("step.waiting_stale", view, step=step.name, attempt=reply.attempt,
                                             opening=reply.opening, closed=step.waiting_opening)])
    since = step.waiting_since or ctx.now
    complete_by = max(since + timedelta(seconds=ctx.config.breaker_max_wait_seconds), ctx.now)
    opening = reply.opening or step.waiting_opening
    waiting = _with_end(replace(step, waiting_on=reply.breaker, waiting_since=since, waiting_opening=opening,
                                wake_at=rate), compensation, complete_by)
    # A rate limit's wait: the order's deadline is its wake-up's (the Supervisor sends it again once
    # overdue); the step's own stays the longest wait's.
    deadline = complete_by if rate is None else wake_deadline(rate, complete_by, ctx)
    new_state = replace(state, complete_by=deadline, updated_at=ctx.now)
    detail = {"breaker": reply.breaker, "until": iso(reply.until) if reply.until else None,
              "since": iso(since), "completeBy": iso(complete_by), "compensation": compensation or None}
    return Decision(Verdict.WAITING, [
        # No index write: the order's deadline row fires at the old CompleteBy or earlier, and the
        # Supervisor then finds the later CompleteBy and moves it.
        # Crash after this: the wake-up below is not sent; the Supervisor sends it for an open
        # breaker whose wake time has passed (and the closer resumes every waiting step anyway);
        # for a rate limit's wait, at the order's deadline (``rewake``).
        commit(view, new_state, [waiting.replacing(step)],
               [event(EventKind.STEP_WAITING, step.name, reply.attempt,
                      **present(detail))],
               ctx, note="step waits on an open breaker", waiting_on=reply.breaker),
        *wake,
        info("step.waiting", view, step=step.name, attempt=reply.attempt, breaker=reply.breaker,
             until=reply.until, completeBy=complete_by, wake=reply.wake),
    ])


def _wake(view: View, step: StepRow, reply: ReplyMessage, ctx: Ctx) -> list[Effect]:
    """The probe resume, at ``until``, of the one step that wakes the breaker up."""
    if not reply.wake or reply.until is None or reply.breaker is None:
        return []
    return [_wake_send(view, WaitingStep(view.order_id, reply.attempt, step.name, reply.kind), reply.breaker,
                       reply.until, ctx)]


def _wake_send(view: View, target: WaitingStep, remote: str, until: datetime, ctx: Ctx,
               tag: str | None = None) -> Send:
    """The resume that wakes ``target`` at ``until`` (one id per wake-up: a copy of it is dropped).
    ``tag``: its own (default: the probe's at ``until``, which the request sent again is named after)."""
    not_before = until if until > ctx.now else None
    priority = view.order.priority if view.order is not None else None
    queue = ctx.config.lane_queue("SchedulerQueue", priority)  # the order's lane (shared.core.workflows.lanes)
    return Send(resume_message(target, queue, remote=remote, why="probe", tag=tag or probe_tag(until),
                               not_before=not_before), what="resume (probe)")


def rewake_tag(at: datetime) -> str:
    """The tag of the Supervisor's re-sent wake-up at ``at``: a new one each time."""
    return f"rewake-{at:%Y%m%dT%H%M%S%f}"


def rate_wake(reply: ReplyMessage) -> datetime | None:
    """The wake-up a rate limit's ``waiting`` reply claims (``wake`` and no breaker opening:
    docs/contracts.md), or None (a breaker's wait)."""
    return reply.until if reply.wake and reply.opening is None else None


def wake_deadline(until: datetime, end: datetime, ctx: Ctx) -> datetime:
    """The order's deadline while a rate limit's wake-up at ``until`` is owed: ``WAKE_GRACE``
    after it, never sooner than the index floor (the order's deadline row covers it, ``deadlines``)
    and never later than the longest wait's ``end``."""
    return min(max(until + WAKE_GRACE, ctx.now + ctx.config.index_floor()), end)


def _with_end(step: StepRow, compensation: bool, end: datetime) -> StepRow:
    return replace(step, compensation_complete_by=end) if compensation else replace(step, complete_by=end)


def _wait_end(step: StepRow, compensation: bool) -> datetime | None:
    return step.compensation_complete_by if compensation else step.complete_by


def _rewaited(view: View, step: StepRow, reply: ReplyMessage, until: datetime, wake: list[Effect],
              ctx: Ctx) -> Decision:
    """A later slot for a step that waits already (its woken call was retried, or a 429 paused the
    remote past its slot): its wake-up recorded as the one owed, then sent."""
    state = view.state
    end = _wait_end(step, reply.kind == "compensation")
    assert state is not None and end is not None and reply.breaker is not None
    new_state = replace(state, complete_by=wake_deadline(until, end, ctx), updated_at=ctx.now)
    return Decision(Verdict.WAITING_DUPLICATE, [
        # Crash after this: the redelivered reply finds this wake-up recorded (a copy: it sends it),
        # and the Supervisor sends it at the order's deadline anyway (``rewake``).
        commit(view, new_state, [replace(step, wake_at=until).replacing(step)],
               [event(EventKind.STEP_WAITING, step.name, reply.attempt, breaker=reply.breaker, until=iso(until),
                      again=True, compensation=(reply.kind == "compensation") or None)],
               ctx, note="a waiting step's next slot", waiting_on=step.waiting_on),
        *wake,
        info("step.waiting_again", view, step=step.name, attempt=reply.attempt, until=until),
    ])


def _now_the_breakers(view: View, step: StepRow, reply: ReplyMessage, wake: list[Effect], ctx: Ctx) -> Decision:
    """A rate wait's woken call found the remote's breaker open (a newer opening): the step now
    waits on the breaker, whose probe or closer wakes it. No wake-up is owed any more, and the
    order's deadline is the longest wait's again (else the Supervisor would send one every index
    floor until the breaker closed)."""
    state = view.state
    end = _wait_end(step, reply.kind == "compensation")
    assert state is not None and end is not None and reply.breaker is not None
    new_state = replace(state, complete_by=end, updated_at=ctx.now)
    return Decision(Verdict.WAITING, [
        # Crash after this: the wake-up below is not sent; the breaker's watch sends it (as for
        # any breaker's wait). Crash before: the redelivered reply does this again.
        commit(view, new_state, [replace(step, wake_at=None, waiting_opening=reply.opening).replacing(step)],
               [event(EventKind.STEP_WAITING, step.name, reply.attempt, breaker=reply.breaker,
                      opening=reply.opening, until=iso(reply.until) if reply.until else None, again=True,
                      compensation=(reply.kind == "compensation") or None)],
               ctx, note="a rate wait is now the breaker's", waiting_on=step.waiting_on),
        *wake,
        info("step.waiting_breaker", view, step=step.name, attempt=reply.attempt, opening=reply.opening),
    ])


def rewake(view: View, step: StepRow, ctx: Ctx, *, compensation: bool = False) -> Decision | None:
    """The Supervisor at the deadline of an order whose step waits for a rate limit's wake-up
    (``wake_at``): a wake-up sent now, the deadline moved on (None: no wake-up owed, or the
    longest wait is over). The scheduler may have died between the wait's commit and its send, or
    the wake-up or the request it sent again may have been lost after it (expired, dead-lettered,
    or its instance killed): so this one has ids of its own (``rewake_tag``), where one named
    after the slot would be dropped as a copy of the lost one for the queue's duplicate window. Its
    request names no slot: the agent takes a new one (the reserved one is past). If the step was
    woken meanwhile, it finds the wait ended (or sends a request the agent answers as a copy)."""
    state = view.state
    end = _wait_end(step, compensation)
    if state is None or step.waiting_on is None or step.wake_at is None or end is None or end <= ctx.now:
        return None
    attempt = step.compensation_attempt if compensation else step.attempt
    target = WaitingStep(view.order_id, attempt, step.name, "compensation" if compensation else "step")
    new_state = replace(state, complete_by=wake_deadline(ctx.now, end, ctx), updated_at=ctx.now)
    assert new_state.complete_by is not None
    return Decision(Verdict.RESCHEDULED, [
        # Crash after this: the overdue row is still there; the next sweep redoes this.
        cover(view.order_id, new_state.complete_by, ctx, note="wake-up overdue"),
        # ETag-conditional: two Supervisors send it once. Crash after this (wake-up not sent):
        # the new deadline falls due and the next sweep sends it.
        commit(view, new_state, [], [event(EventKind.RESCHEDULED, step.name, attempt, breaker=step.waiting_on,
                                           wakeUp=iso(step.wake_at), compensation=compensation or None)],
               ctx, note="wake-up sent again", waiting_on=step.waiting_on),
        _wake_send(view, target, step.waiting_on, ctx.now, ctx, tag=rewake_tag(ctx.now)),
        log(logging.WARNING, "supervisor.wake_resent", view, step=step.name, attempt=attempt,
            breaker=step.waiting_on, wakeUp=step.wake_at),
    ])


def decide_resume(view: View, msg: ResumeMessage, ctx: Ctx) -> Decision:
    """A resume of the attempt ``msg`` names (module docstring), if it is still the order's lease."""
    state = view.state
    if state is None or view.order is None:
        return Decision(Verdict.UNKNOWN_ORDER, [log(logging.ERROR, "resume.unknown_order", None, order_id=msg.orderId)])
    step = view.step(msg.step)
    if step is None:
        return Decision(Verdict.IGNORED, [log(logging.WARNING, "resume.unknown_step", view, step=msg.step)])
    fields = {"step": msg.step, "attempt": msg.attempt, "target": msg.target, "why": msg.why}
    if not _live(state, step, msg):
        # The row that named this attempt can never be live again: forget it, or it would be
        # resumed at every close (and picked for every probe the Supervisor sends).
        forget = [ForgetWaiting(msg.remote, _waiting_step(view.order_id, msg).row_key)] if msg.remote else []
        return Decision(Verdict.STALE, [*forget, info("resume.stale", view, lease=str(state.lease), **fields)])
    if step.waiting_on is None:
        if msg.why == "probe":  # its wait ended already: its request is under way
            return Decision(Verdict.IGNORED, [info("resume.not_waiting", view, **fields)])
        closed = closed_opening(msg.tag)
        if closed is not None and (step.waiting_opening is None or closed > step.waiting_opening):
            return _closed_first(view, step, msg, closed, ctx)
        return Decision(Verdict.RESENT, [_request(view, step, msg, ctx), info("resume.resent", view, **fields)])
    if msg.why == "probe":
        return Decision(Verdict.PROBING, [_request(view, step, msg, ctx), info("step.probing", view, **fields)])
    closed = closed_opening(msg.tag)
    if closed is not None and step.waiting_opening is not None and closed < step.waiting_opening:
        # The close of an older opening (a late copy): the step waits on a newer one, which its own
        # close ends. Its request goes again, as a probe's does (nothing written): if that older
        # closer took the step's row with it, the request registers it again.
        return Decision(Verdict.RESENT, [_request(view, step, msg, ctx),
                                         info("resume.older_opening", view, waiting=step.waiting_opening, **fields)])
    ended, new_state = _ended(step, state, msg.target == "compensation", closed, ctx)
    after = view.with_steps(ended).with_state(new_state)
    return Decision(Verdict.RESUMED, [
        # Crash after this: the request is not sent; the Supervisor expires the attempt at its
        # CompleteBy (the step's timeout) and redrives it, as for any lost request. A copy of
        # this resume finds the wait ended and sends the request again under the same id.
        commit(view, new_state, [ended.replacing(step)], _resumed(step, msg.target == "compensation"), ctx,
               note="wait ended"),
        _request(after, ended, msg, ctx),
        info("step.resumed", view, breaker=step.waiting_on, **fields),
    ])


def _closed_first(view: View, step: StepRow, msg: ResumeMessage, closed: int, ctx: Ctx) -> Decision:
    """A close that reached a live step before its ``waiting`` reply did (the agent registered the
    step, the closer resumed it, the reply is still on its way): the close is recorded on the step
    (``WaitingOpening``), so that reply, read on the opening that closed, starts no wait
    (``_before_close``), and the request goes again. Without it the late reply recorded a wait that
    no close would end: when the request sent again got no answer (it expired in the agent, past
    the step's deadline), the step waited out the longest wait and failed for good."""
    state = view.state
    assert state is not None
    compensation = msg.target == "compensation"
    noted = replace(step, waiting_opening=closed)
    new_state = replace(state, updated_at=ctx.now)
    after = view.with_steps(noted).with_state(new_state)
    return Decision(Verdict.RESENT, [
        # Crash after this: the request is not sent; the late reply is stale all the same, so the
        # step's deadline stands and the Supervisor redrives it then. A copy of this resume finds
        # the close recorded and only sends the request again (the same id: dropped as a copy).
        commit(view, new_state, [noted.replacing(step)],
               [event(EventKind.RESUMED, step.name, step.compensation_attempt if compensation else step.attempt,
                      breaker=msg.remote, opening=closed, early=True, compensation=compensation or None)],
               ctx, note="a close before the wait"),
        _request(after, noted, msg, ctx),
        info("resume.resent", view, step=msg.step, attempt=msg.attempt, target=msg.target, why=msg.why,
             closed=closed),
    ])


def end_wait(view: View, step: StepRow) -> tuple[StepRow, list[Event], list[Effect]]:
    """For a reply of a waiting attempt: the step without its wait, the ``resumed`` event to
    record before the reply's own, and the forgetting of its waiting row (after the write)."""
    if step.waiting_on is None:
        return step, [], []
    compensation = step.compensation is CompensationState.RUNNING
    return replace(step, waiting_on=None, wake_at=None), _resumed(step, compensation), forget_wait(view.order_id, step)


def forget_wait(order_id: str, step: StepRow) -> list[Effect]:
    """Forget ``step``'s waiting row, if it waits (after the write that ends its wait)."""
    if step.waiting_on is None:
        return []
    compensation = step.compensation is CompensationState.RUNNING
    waiting = WaitingStep(order_id, step.compensation_attempt if compensation else step.attempt, step.name,
                          "compensation" if compensation else "step")
    return [ForgetWaiting(step.waiting_on, waiting.row_key)]


def _live(state: StateRow, step: StepRow, msg: ResumeMessage) -> bool:
    """Whether the attempt ``msg`` names is the one in flight (the lease and the step agree)."""
    if msg.target == "compensation":
        return (state.mode is Mode.COMPENSATE and state.claimed
                and state.lease == Lease.for_compensation(msg.step, msg.attempt)
                and step.compensation is CompensationState.RUNNING and step.compensation_attempt == msg.attempt)
    return (state.mode is Mode.FORWARD and state.claimed and state.lease == Lease.for_step(msg.step, msg.attempt)
            and step.state is StepState.RUNNING and step.attempt == msg.attempt)


def _waiting_step(order_id: str, msg: ResumeMessage) -> WaitingStep:
    return WaitingStep(order_id, msg.attempt, msg.step, msg.target)


def _resumed(step: StepRow, compensation: bool) -> list[Event]:
    attempt = step.compensation_attempt if compensation else step.attempt
    return [event(EventKind.RESUMED, step.name, attempt, breaker=step.waiting_on, compensation=compensation or None)]


def _before_close(step: StepRow, opening: int | None) -> bool:
    """Whether a waiting reply of ``opening`` was read before the close that ended the step's wait."""
    return opening is not None and step.waiting_opening is not None and opening <= step.waiting_opening


def _ended(step: StepRow, state: StateRow, compensation: bool, closed: int | None,
           ctx: Ctx) -> tuple[StepRow, StateRow]:
    """The step without its wait, and its deadline back to the step's timeout (from now).
    ``WaitingSince`` stays: a later wait of the same attempt counts its longest wait from it.
    ``WaitingOpening`` becomes the opening that ``closed`` (when known): a waiting reply read on it
    or before it is then stale."""
    complete_by = ctx.now + ctx.config.timeout(ctx.config.spec(step.name))
    opening = max(closed, step.waiting_opening or 0) if closed is not None else step.waiting_opening
    ended = _with_end(replace(step, waiting_on=None, waiting_opening=opening, wake_at=None), compensation, complete_by)
    return ended, replace(state, complete_by=complete_by, updated_at=ctx.now)


def _request(view: View, step: StepRow, msg: ResumeMessage, ctx: Ctx) -> Send:
    """The attempt's request once more, named after the resume (a copy of it sends no other)."""
    again = msg.tag or msg.why
    if msg.target == "compensation":
        return replace(compensation_request(view, step, ctx, again=again), what="compensation (resume)")
    return replace(step_request(view, step, ctx, again=again), what="request (resume)")
