"""The other messages a decision sends: schedule notices, status, alerts, and logs (a step's
request and wake-ups are sent where it is dispatched, ``dispatch``).

Message ids are deterministic, so a message sent again after a crash (or by a racing
instance) is dropped by the queue's duplicate detection.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from shared.core.effects import Alert, Effect, Log, Send
from shared.core.messages import (
    AlertMessage,
    OutMessage,
    ScheduleMessage,
    StatusMessage,
)
from shared.core.room import ROOM_SEQ
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.view import View


def trace_properties(traceparent: str | None, kind: str) -> dict[str, str]:
    """A message's application properties: its kind, and the order's ``traceparent``, which the
    sender (``shared.observability.telemetry.send``, from the executor) replaces with the context of
    the span that sends it when that is in the order's trace."""
    return {"traceparent": traceparent, "kind": kind} if traceparent else {"kind": kind}


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


def admission_message(order_id: str, queue: str, traceparent: str | None, again: str = "") -> OutMessage:
    """An order's admission to its customer's room (``shared.core.room``): the schedule message of
    sequence ``ROOM_SEQ`` on the scheduler queue of its lane. Its id is the same whoever gives the
    slot (a copy is dropped, a late one finds the order claimed); ``again``: the room's watch sending
    it once more, under an id of that watch (an admission lost after it was sent is not a copy)."""
    message_id = f"{order_id}:schedule:{ROOM_SEQ}" + (f":{again}" if again else "")
    return OutMessage(queue=queue, body=ScheduleMessage(kind="schedule", orderId=order_id, seq=ROOM_SEQ).to_body(),
                      message_id=message_id, correlation_id=order_id, subject="schedule",
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
