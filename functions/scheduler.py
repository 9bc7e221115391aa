"""Scheduler functions: the scheduler queue (claim + dispatch) and the replies queue.
Thin adapters over ``shared.scheduler``; settlement: auto-complete on return, abandon on
raise (transient failures, and poison messages, which the broker dead-letters after
MaxDeliveryCount; see shared/scheduler.py)."""

from __future__ import annotations

import azure.functions as func

from shared.runtime import get_runtime
from shared.scheduler import handle_reply, handle_schedule
from shared.settings import SERVICE_BUS_CONNECTION

bp = func.Blueprint()


def _traceparent(msg: func.ServiceBusMessage) -> str | None:
    props = msg.application_properties or {}
    value = props.get("traceparent")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


@bp.function_name("scheduler")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%SchedulerQueue%", connection=SERVICE_BUS_CONNECTION)
def scheduler(msg: func.ServiceBusMessage) -> None:
    handle_schedule(get_runtime(), msg.get_body(), message_id=msg.message_id, traceparent=_traceparent(msg))


@bp.function_name("scheduler_replies")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%RepliesQueue%", connection=SERVICE_BUS_CONNECTION)
def replies(msg: func.ServiceBusMessage) -> None:
    handle_reply(get_runtime(), msg.get_body(), message_id=msg.message_id, traceparent=_traceparent(msg))
