"""Dispatching a step, in one place: putting it in flight, and what it sends.

``dispatch`` puts a step in flight (or every branch of a parallel step not done yet, ``groups``):
its row Running with its next attempt and its CompleteBy (``deadline``), and the state row whose
lease names it. ``dispatched`` is its history event, written in the same transaction as the rows.
``step_sends`` is what it sends once that transaction is committed, by the step's kind:

* ``call``: the agent's request (``step_request``), on the agent's queue of the order's lane, with
  the rows its fencing token is built from (``shared.core.fence``; the executor seals it).
* ``delay``: a wake-up for itself on the scheduler queue, scheduled for when the delay ends
  (a Service Bus scheduled message). The Supervisor is the backstop: a lost wake-up leaves the
  step Running past its CompleteBy, and the Supervisor ends the delay (``events.waited_out``).
* ``wait``: nothing, unless its event came before the step started and was kept: then a wake-up
  now, which ends the wait with that event (and the Supervisor does, if the wake-up is lost).

Message ids are deterministic: a request's names the order, the step and the attempt, and so does
a wake-up's, so a copy is dropped by the queue's duplicate detection, and a wake-up for an earlier
attempt changes nothing. A compensation is dispatched the same way (``dispatch_compensation``,
``compensation_dispatched``, ``compensation_request``). After a crash, ``inflight_requests`` finds
what the state row says is in flight, to send it again; ``request_not_in_flight`` tells an agent
whether its request is still one of them.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from shared.core import fence
from shared.core.effects import Send
from shared.core.lease import Lease, LeaseKind
from shared.core.messages import AgentRequest, CompensationTarget, Kind, OutMessage
from shared.core.rows import StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.groups import in_flight, members, rank
from shared.core.statemachine.history import Event, EventKind, event
from shared.core.statemachine.outbox import trace_properties
from shared.core.statemachine.view import View
from shared.core.states import CompensationState, Mode, StepState
from shared.core.times import iso
from shared.core.wakeup import WakeMessage


# --------------------------------------------------------------------------- a step put in flight
def dispatch(view: View, step: StepRow, state: StateRow, ctx: Ctx) -> tuple[list[StepRow], StateRow]:
    """``step`` put in flight, or, for a branch of a parallel step, every branch of its group not
    done yet (``groups``): the rows Running, and the state row whose lease names the step or the
    group, with the latest of their deadlines. No branch left to run: no rows."""
    group = ctx.config.spec(step.name).group
    if group is None:
        running = _running(step, state, ctx)
        assert running.complete_by is not None
        return [running], replace(state, step_index=step.index, step_name=step.name, attempt=running.attempt,
                                  complete_by=running.complete_by, lease=Lease.for_step(step.name, running.attempt),
                                  updated_at=ctx.now)
    branches = members(view, step, ctx)
    rows = [_running(s, state, ctx) for s in branches if s.state not in (StepState.DONE, StepState.SKIPPED)]
    if not rows:
        return [], state
    complete_by = max(r.complete_by for r in rows if r.complete_by is not None)
    attempt = max(r.attempt for r in rows)
    return rows, replace(state, step_index=branches[0].index, step_name=group, attempt=attempt,
                         complete_by=complete_by, lease=Lease.for_step(group, attempt), updated_at=ctx.now)


def _running(step: StepRow, state: StateRow, ctx: Ctx) -> StepRow:
    return replace(step, state=StepState.RUNNING, attempt=step.attempt + 1, complete_by=deadline(step, state, ctx),
                   started_at=ctx.now, finished_at=None, waiting_on=None, waiting_since=None,
                   waiting_opening=None, wake_at=None)


def deadline(step: StepRow, state: StateRow, ctx: Ctx) -> datetime:
    """The CompleteBy of a step put in flight now: a call's timeout, a wait's own, or a delay's end
    (never sooner than the index floor: the order's deadline row covers it, ``deadlines``)."""
    spec = ctx.config.spec(step.name)
    if spec.kind == "delay":
        return max(spec.due(ctx.now, state.created_at or ctx.now), ctx.now + ctx.config.index_floor())
    return ctx.now + ctx.config.timeout(spec)


def dispatched(step: StepRow) -> Event:
    """The history event of a step put in flight (its attempt and deadline)."""
    deadline = step.complete_by
    return event(EventKind.DISPATCHED, step.name, step.attempt, completeBy=iso(deadline) if deadline else None)


# --------------------------------------------------------------------------- what it sends
def step_sends(view: View, step: StepRow, ctx: Ctx) -> list[Send]:
    """What ``step``, just put in flight (Running, its attempt), sends (module docstring)."""
    spec = ctx.config.spec(step.name)
    if spec.kind == "call":
        return [step_request(view, step, ctx)]
    if spec.kind == "delay":
        assert view.state is not None and step.started_at is not None
        return [wake(view, step, ctx, at=spec.due(step.started_at, view.state.created_at or step.started_at))]
    return [wake(view, step, ctx)] if step.event_key is not None else []


def first_sends(view: View, step: StepRow, ctx: Ctx) -> list[Send]:
    """The submission's sends: not critical (the client's retry, or the Supervisor, re-sends)."""
    return [replace(send, critical=False) for send in step_sends(view, step, ctx)]


def step_request(view: View, step: StepRow, ctx: Ctx, *, again: str = "") -> Send:
    """The request for the step's current attempt (its CompleteBy is the request's deadline).
    ``again``: the same attempt sent once more on that occasion (a resume's tag), under its own id."""
    assert step.complete_by is not None
    return Send(_request(view, step, "step", step.attempt, step.complete_by, ctx, again), what="request",
                fence=_fence(view, step))


def _fence(view: View, step: StepRow) -> fence.Entities:
    """The rows the request's fencing token is built from: the order's live rows, ``step`` as sent."""
    sent = view.with_steps(step)
    return fence.carried((sent.order, sent.state, *sent.steps))


def _request(view: View, step: StepRow, kind: Kind, attempt: int, complete_by: datetime, ctx: Ctx,
             again: str = "") -> OutMessage:
    cfg = ctx.config
    spec = cfg.spec(step.name)
    order_id = view.order_id
    assert view.order is not None and view.state is not None
    step_key = idempotency_key(order_id, spec.name, view.state.generation)
    if kind == "step":
        operation = spec.operation
        key = step_key
        message_id = f"{order_id}:{spec.name}:{attempt}"
        context = {s.name: s.result for s in view.steps if s.index < step.index and s.state is StepState.DONE}
    else:
        assert spec.compensation is not None
        operation = spec.compensation
        key = f"{step_key}:compensate"
        message_id = f"{order_id}:{spec.name}:compensate:{attempt}"
        # The step's result when it has one (a Done step); a step whose outcome is unknown
        # (timed out) has none: the remote finds the effect by the step's idempotency key.
        context = {spec.name: step.result} if step.result is not None else {}
    if again:
        message_id = f"{message_id}:{again}"
    target = None if kind == "step" else CompensationTarget(step=spec.name, idempotency_key=step_key)
    # ``compensates``: the effect to undo, addressed by the stable idempotency key every attempt
    # of the step was sent with. A remote with nothing applied under it answers "nothing to
    # undo" and tombstones the key, so a late original call with it is refused.
    body = AgentRequest(kind=kind, order_id=order_id, step=spec.name, operation=operation, attempt=attempt,
                        idempotency_key=key, complete_by=complete_by, order=view.order.payload(), context=context,
                        compensates=target, workflow=cfg.workflow_name, workflow_version=cfg.workflow_version).to_body()
    ttl = max(complete_by - ctx.now, timedelta(seconds=1))
    # The order's lane (shared.core.workflows.lanes): its agent's request queue, and the replies queue the
    # agent answers on, are that lane's copies.
    priority = view.order.priority
    return OutMessage(queue=cfg.agent_queue(spec, priority), body=body, message_id=message_id,
                      correlation_id=message_id, reply_to=cfg.lane_queue("RepliesQueue", priority), subject=kind,
                      time_to_live=ttl,
                      application_properties=trace_properties(view.traceparent, kind))


def idempotency_key(order_id: str, step: str, generation: int) -> str:
    """The key every attempt of a step is sent with. A restarted order (a retry after its
    effects were compensated) runs as a new generation, with fresh keys: the remote would
    otherwise answer the new run with the undone effect of the old one."""
    return f"{order_id}:{step}" if generation == 0 else f"{order_id}:g{generation}:{step}"


def wake(view: View, step: StepRow, ctx: Ctx, *, at: datetime | None = None) -> Send:
    """The wake-up of the step's attempt, on the scheduler queue of the order's lane, at ``at``."""
    assert view.order is not None
    order_id = view.order_id
    body = WakeMessage(kind="wake", orderId=order_id, step=step.name, attempt=step.attempt).to_body()
    message_id = f"{order_id}:wake:{step.name}:{step.attempt}"
    message = OutMessage(queue=ctx.config.lane_queue("SchedulerQueue", view.order.priority), body=body,
                         message_id=message_id, correlation_id=order_id, subject="wake",
                         scheduled_enqueue_time=at if at is not None and at > ctx.now else None,
                         application_properties=trace_properties(view.traceparent, "wake"))
    return Send(message, what="wake-up" if at is None else "timer")


# --------------------------------------------------------------------------- a compensation put in flight
def dispatch_compensation(step: StepRow, state: StateRow, ctx: Ctx) -> tuple[StepRow, StateRow]:
    """The step's compensation Running with its next attempt, and the state row that says so."""
    attempt = step.compensation_attempt + 1
    complete_by = ctx.now + ctx.config.timeout(ctx.config.spec(step.name))
    running = replace(step, compensation=CompensationState.RUNNING, compensation_attempt=attempt,
                      compensation_complete_by=complete_by, compensation_started_at=ctx.now,
                      compensation_finished_at=None, waiting_on=None, waiting_since=None,
                      waiting_opening=None, wake_at=None)
    return running, replace(state, comp_index=step.index, complete_by=complete_by,
                            lease=Lease.for_compensation(step.name, attempt), updated_at=ctx.now)


def compensation_dispatched(step: StepRow) -> Event:
    deadline = step.compensation_complete_by
    return event(EventKind.COMPENSATION_DISPATCHED, step.name, step.compensation_attempt,
                 completeBy=iso(deadline) if deadline else None)


def compensation_request(view: View, step: StepRow, ctx: Ctx, *, again: str = "") -> Send:
    """The request for the current attempt of the step's compensation."""
    assert step.compensation_complete_by is not None
    return Send(_request(view, step, "compensation", step.compensation_attempt, step.compensation_complete_by, ctx,
                         again), what="compensation", fence=_fence(view, step))


# --------------------------------------------------------------------------- what is in flight, what to undo
def outcome_unknown(step: StepRow, ctx: Ctx) -> bool:
    """A step not Done whose last attempt ended without an answer (timed out): the remote may
    have applied its effect. It is compensated too (by its idempotency key), if it has a
    compensation. An error reply settles it: the remote rejected the key, applied nothing."""
    return (step.state is not StepState.DONE and step.outcome_unknown
            and bool(ctx.config.spec(step.name).compensation))


def to_compensate(view: View, ctx: Ctx) -> list[StepRow]:
    """Every step to compensate, in compensation (reverse) order: the Done steps with a
    compensation, and a step whose outcome is unknown (the latest one: it comes first). A
    parallel step's branches come in reverse order of completion (``groups.rank``)."""
    chosen = [s for s in view.steps if (s.state is StepState.DONE and ctx.config.spec(s.name).compensation)
              or outcome_unknown(s, ctx)]
    return sorted(chosen, key=lambda s: rank(s, ctx), reverse=True)


def inflight_requests(view: View, ctx: Ctx) -> list[Send]:
    """The requests the state row says are in flight (to re-send after a crash), if still live:
    a step's (a wait with no event kept sends nothing), a parallel step's running branches', or
    a compensation's."""
    state = view.state
    if state is None or not state.claimed or state.lease is None or state.complete_by is None:
        return []
    lease = state.lease
    if state.complete_by <= ctx.now or lease.is_unclaimed:
        return []
    if lease.kind is LeaseKind.STEP:
        return [replace(send, what=f"{send.what} (resume)") for step in in_flight(view, ctx)
                for send in step_sends(view, step, ctx)]
    step = view.step(lease.step)
    if (step is not None and step.compensation is CompensationState.RUNNING
            and step.compensation_attempt == lease.attempt):
        return [replace(compensation_request(view, step, ctx), what="compensation (resume)")]
    return []


def request_not_in_flight(view: View, kind: str, step_name: str, attempt: int, ctx: Ctx) -> str | None:
    """Why an agent request (``kind`` "step" or "compensation", its step and attempt) is not one the
    order has in flight, or None when it is: the same rows :func:`inflight_requests` re-sends from
    (a step's or a parallel step's Running branch with that attempt under the order's step lease; a
    Running compensation with that attempt under its lease), time aside (the request's own
    completeBy is the agent's to check). ``ctx``: bound to the order's workflow (``bound``)."""
    state = view.state
    if state is None:
        return "no such order"
    if state.mode is Mode.FINISHED:
        return f"the order is finished ({state.process_state})"
    lease = state.lease
    if not state.claimed or lease is None or lease.is_unclaimed:
        return "the order has nothing in flight"
    step = view.step(step_name)
    if step is None:
        return f"the order has no step {step_name!r}"
    if kind == "compensation":
        if (lease == Lease.for_compensation(step_name, attempt) and step.compensation is CompensationState.RUNNING
                and step.compensation_attempt == attempt):
            return None
    elif lease.kind is LeaseKind.STEP and any(s.name == step_name and s.attempt == attempt
                                                for s in in_flight(view, ctx)):
        return None
    return (f"{kind} {step_name!r} attempt {attempt} is not in flight (the order's lease: "
            f"{lease.kind} {lease.step!r} attempt {lease.attempt})")
