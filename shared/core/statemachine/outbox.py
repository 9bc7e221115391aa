"""The messages a decision sends: agent requests, schedule notices, status, alerts, and logs.

Message ids are deterministic, so a message sent again after a crash (or by a racing
instance) is dropped by the queue's duplicate detection.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from shared.core import fence
from shared.core.effects import Alert, Effect, Log, Send
from shared.core.messages import (
    AgentRequest,
    AlertMessage,
    CompensationTarget,
    Kind,
    OutMessage,
    ScheduleMessage,
    StatusMessage,
)
from shared.core.rows import StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.view import View
from shared.core.states import StepState


def step_request(view: View, step: StepRow, ctx: Ctx, *, again: str = "") -> Send:
    """The request for the step's current attempt (its CompleteBy is the request's deadline).
    ``again``: the same attempt sent once more on that occasion (a resume's tag), under its own id."""
    assert step.complete_by is not None
    return Send(_request(view, step, "step", step.attempt, step.complete_by, ctx, again), what="request",
                fence=_fence_rows(view.with_steps(step)))


def compensation_request(view: View, step: StepRow, ctx: Ctx, *, again: str = "") -> Send:
    """The request for the current attempt of the step's compensation."""
    assert step.compensation_complete_by is not None
    return Send(_request(view, step, "compensation", step.compensation_attempt, step.compensation_complete_by, ctx,
                         again), what="compensation", fence=_fence_rows(view.with_steps(step)))


def _fence_rows(view: View) -> fence.Entities:
    return fence.carried((view.order, view.state, *view.steps))


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


def trace_properties(traceparent: str | None, kind: str) -> dict[str, str]:
    """A message's application properties: its kind, and the order's ``traceparent``, which the
    sender (``shared.observability.telemetry.send``, from the executor) replaces with the context of
    the span that sends it when that is in the order's trace."""
    return {"traceparent": traceparent, "kind": kind} if traceparent else {"kind": kind}


def idempotency_key(order_id: str, step: str, generation: int) -> str:
    """The key every attempt of a step is sent with. A restarted order (a retry after its
    effects were compensated) runs as a new generation, with fresh keys: the remote would
    otherwise answer the new run with the undone effect of the old one."""
    return f"{order_id}:{step}" if generation == 0 else f"{order_id}:g{generation}:{step}"


def schedule_message(order_id: str, seq: int, ctx: Ctx, traceparent: str | None,
                     not_before: datetime | None = None, *, priority: str | None) -> OutMessage:
    """The notice that asks a scheduler to claim the order (``seq`` makes it unique), on the
    scheduler queue of the order's lane (``priority``: the order row's)."""
    message_id = f"{order_id}:schedule:{seq}"
    return OutMessage(queue=ctx.config.lane_queue("SchedulerQueue", priority),
                      body=ScheduleMessage(kind="schedule", orderId=order_id, seq=seq).to_body(),
                      message_id=message_id, correlation_id=order_id, subject="schedule",
                      scheduled_enqueue_time=not_before if not_before and not_before > ctx.now else None,
                      application_properties=trace_properties(traceparent, "schedule"))


def status_sends(view: View, event: str, ctx: Ctx, *, step: str | None = None, **extra: Any) -> list[Effect]:
    """A status message to the order's own ``statusQueue``, if the order named one (none
    otherwise). Never critical: a missing or failing status queue must not break processing."""
    queue = view.order.status_queue if view.order is not None else None
    if not queue or view.state is None:
        return []
    order_id = view.order_id
    body = StatusMessage(order_id=order_id, event=event, at=ctx.now, step=step or None, **extra).to_body()
    generation = view.state.generation
    message_id = (f"{order_id}:status:{event}" + (f":{step}" if step else "")
                  + (f":g{generation}" if generation else ""))
    message = OutMessage(queue=queue, body=body, message_id=message_id, correlation_id=order_id, subject="status",
                         application_properties=trace_properties(view.traceparent, "status"))
    return [Send(message, critical=False, what=f"status {event}")]


def alert(view: View, step: str | None, reason: str, failure_count: int, key: str, ctx: Ctx) -> Alert:
    """An operator alert; ``key`` makes its message id unique to what it is about."""
    order_id = view.order_id
    body = AlertMessage(order_id=order_id, step=step, reason=reason, failure_count=failure_count, at=ctx.now).to_body()
    message = OutMessage(queue=ctx.config.queues["AlertsQueue"], body=body, message_id=f"{order_id}:alert:{key}",
                         correlation_id=order_id, subject="alert",
                         application_properties=trace_properties(view.traceparent, "alert"))
    return Alert(message, order_id, step, reason, failure_count, view.traceparent)


def log(level: int, event: str, view: View | None, **fields: Any) -> Log:
    """A structured log line about the order."""
    order_id = view.order_id if view is not None and view.state is not None else fields.pop("order_id", None)
    return Log(level, event, order_id, view.traceparent if view is not None else None, fields)


def info(event: str, view: View, **fields: Any) -> Log:
    return log(logging.INFO, event, view, **fields)
