"""Webhook functions: the delivery function (the ``WebhooksQueue`` trigger: one try of one
delivery) and the operator's routes (the failed deliveries or one order's, a resend). Thin adapters over
``shared.runtime.webhooks`` and ``shared.api.webhooks``. Settlement as the other queue triggers
(``functions.settlement``): the host completes on return and abandons on a transient failure (the
try is made again; its watch covers a message dead-lettered after too many)."""

# No ``from __future__ import annotations``: the worker reads the handlers' annotations as types.
import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

from functions.http import to_response
from functions.operator_auth import LEVEL as OPERATOR
from functions.operator_auth import operator_only, reader_only
from functions.settlement import received, settle
from shared.api.webhooks import list_deliveries, resend_delivery
from shared.runtime import get_runtime
from shared.runtime.webhooks import handle_delivery
from shared.settings import SERVICE_BUS_CONNECTION

bp = func.Blueprint()


@bp.function_name("webhooks")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%WebhooksQueue%", connection=SERVICE_BUS_CONNECTION,
                              auto_complete_messages=True)
def deliver(msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions) -> None:
    settle(message_actions, msg, lambda: _on_delivery(msg))


def _on_delivery(msg: servicebus.ServiceBusReceivedMessage) -> None:
    m = received(msg)
    handle_delivery(get_runtime(), m.body, message_id=m.message_id, traceparent=m.traceparent)


@bp.function_name("webhook_failures")
@bp.route(route="webhooks", methods=["GET"], auth_level=OPERATOR)
@reader_only
def failures(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(list_deliveries(get_runtime(), dict(req.params)))


@bp.function_name("webhook_resend")
@bp.route(route="orders/{id}/webhooks/{delivery}/resend", methods=["POST"], auth_level=OPERATOR)
@operator_only
def resend(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(resend_delivery(get_runtime(), req.route_params.get("id"), req.route_params.get("delivery")))
