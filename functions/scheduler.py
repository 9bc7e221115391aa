"""Scheduler functions: the scheduler queue (claim + dispatch) and the replies queue, one function
each per priority lane (``shared.core.workflows.lanes``; a message is handled the same on every lane).
Thin adapters over ``shared.scheduler``; settlement: auto-complete on return, abandon on
raise (transient failures, and poison messages, which the broker dead-letters after
MaxDeliveryCount; see shared/scheduler/handlers.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import azure.functions as func

from shared.core.workflows.lanes import LANES
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


def _on_schedule(msg: func.ServiceBusMessage) -> None:
    handle_schedule(get_runtime(), msg.get_body(), message_id=msg.message_id, traceparent=_traceparent(msg))


def _on_reply(msg: func.ServiceBusMessage) -> None:
    handle_reply(get_runtime(), msg.get_body(), message_id=msg.message_id, traceparent=_traceparent(msg))


def _register(name: str, queue_setting: str, handle: Callable[[func.ServiceBusMessage], None]) -> Any:
    """One trigger on ``%queue_setting%`` named ``name``; every lane's trigger runs the same handler."""

    def handler(msg: func.ServiceBusMessage) -> None:
        handle(msg)

    handler.__name__ = handler.__qualname__ = name
    return bp.function_name(name=name)(
        bp.service_bus_queue_trigger(arg_name="msg", queue_name=f"%{queue_setting}%",
                                     connection=SERVICE_BUS_CONNECTION)(handler))


# One scheduler and one replies function per priority lane (workflows/lanes.json): "scheduler" and
# "scheduler_replies" on the default lane's queues, "scheduler_high" and "scheduler_replies_high"...
FUNCTIONS: dict[str, Any] = {}  # function name -> its builder
for _lane in LANES:
    for _name, _setting, _handle in (("scheduler", "SchedulerQueue", _on_schedule),
                                     ("scheduler_replies", "RepliesQueue", _on_reply)):
        FUNCTIONS[_lane.function(_name)] = _register(_lane.function(_name), _lane.setting(_setting), _handle)
scheduler = FUNCTIONS["scheduler"]  # the default lane's, by their historical names
replies = FUNCTIONS["scheduler_replies"]
