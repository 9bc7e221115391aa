"""Scheduler functions: the scheduler queue (claim + dispatch) and the replies queue, one function
each per priority lane (``shared.core.workflows.lanes``; a message is handled the same on every lane).
Thin adapters over ``shared.scheduler``. Settlement (SDK-type binding, ``autoCompleteMessages`` true;
``functions.settlement.settle``): the host completes on return and abandons on a transient failure; a
poison message is dead-lettered at once with its reason (see shared/scheduler/handlers.py)."""

# No ``from __future__ import annotations``: the worker reads the handlers' annotations as types.
from collections.abc import Callable
from typing import Any

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

from functions.settlement import received, settle
from shared.core.workflows.lanes import LANES
from shared.runtime import get_runtime
from shared.scheduler import handle_reply, handle_schedule
from shared.settings import SERVICE_BUS_CONNECTION

bp = func.Blueprint()


def _on_schedule(msg: Any) -> None:
    m = received(msg)
    handle_schedule(get_runtime(), m.body, message_id=m.message_id, traceparent=m.traceparent)


def _on_reply(msg: Any) -> None:
    m = received(msg)
    handle_reply(get_runtime(), m.body, message_id=m.message_id, traceparent=m.traceparent)


def _register(name: str, queue_setting: str, handle: Callable[[Any], None]) -> Any:
    """One trigger on ``%queue_setting%`` named ``name``; every lane's trigger runs the same handler."""

    def handler(msg: servicebus.ServiceBusReceivedMessage,
                message_actions: servicebus.ServiceBusMessageActions) -> None:
        settle(message_actions, msg, lambda: handle(msg))

    handler.__name__ = handler.__qualname__ = name
    return bp.function_name(name=name)(
        bp.service_bus_queue_trigger(arg_name="msg", queue_name=f"%{queue_setting}%",
                                     connection=SERVICE_BUS_CONNECTION, auto_complete_messages=True)(handler))


# One scheduler and one replies function per priority lane (workflows/lanes.json): "scheduler" and
# "scheduler_replies" on the default lane's queues, "scheduler_high" and "scheduler_replies_high"...
FUNCTIONS: dict[str, Any] = {}  # function name -> its builder
for _lane in LANES:
    for _name, _setting, _handle in (("scheduler", "SchedulerQueue", _on_schedule),
                                     ("scheduler_replies", "RepliesQueue", _on_reply)):
        FUNCTIONS[_lane.function(_name)] = _register(_lane.function(_name), _lane.setting(_setting), _handle)
scheduler = FUNCTIONS["scheduler"]  # the default lane's, by their historical names
replies = FUNCTIONS["scheduler_replies"]
