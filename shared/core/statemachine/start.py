"""What a step sends when it is put in flight, by its kind.

* ``call``: the agent's request (``outbox.step_request``).
* ``delay``: a wake-up for itself on the scheduler queue, scheduled for when the delay ends
  (a Service Bus scheduled message). The Supervisor is the backstop: a lost wake-up leaves the
  step Running past its CompleteBy, and the Supervisor ends the delay (``events.waited_out``).
* ``wait``: nothing, unless its event came before the step started and was kept: then a wake-up
  now, which ends the wait with that event (and the Supervisor does, if the wake-up is lost).

A wake-up is named by the order, the step and the attempt: a copy of it is dropped by the
queue's duplicate detection, and one for an earlier attempt changes nothing.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from shared.core.effects import Send
from shared.core.messages import OutMessage
from shared.core.rows import StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.outbox import step_request, trace_properties
from shared.core.statemachine.view import View
from shared.core.wakeup import WakeMessage


def deadline(step: StepRow, state: StateRow, ctx: Ctx) -> datetime:
    """The CompleteBy of a step put in flight now: a call's timeout, a wait's own, or a delay's end
    (never sooner than the index floor: the order's deadline row covers it, ``deadlines``)."""
    spec = ctx.config.spec(step.name)
    if spec.kind == "delay":
        return max(spec.due(ctx.now, state.created_at or ctx.now), ctx.now + ctx.config.index_floor())
    return ctx.now + ctx.config.timeout(spec)


def step_sends(view: View, step: StepRow, ctx: Ctx) -> list[Send]:
    """What ``step``, just put in flight (Running, its attempt), sends (module docstring)."""
    spec = ctx.config.spec(step.name)
    if spec.kind == "call":
        return [step_request(view, step, ctx)]
    if spec.kind == "delay":
        assert view.state is not None and step.started_at is not None
        return [wake(view, step, ctx, at=spec.due(step.started_at, view.state.created_at or step.started_at))]
    return [wake(view, step, ctx)] if step.event_key is not None else []


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


def first_sends(view: View, step: StepRow, ctx: Ctx) -> list[Send]:
    """The submission's sends: not critical (the client's retry, or the Supervisor, re-sends)."""
    return [replace(send, critical=False) for send in step_sends(view, step, ctx)]
