"""HTTP functions: submission, order status and history, search, the loaded workflows, the
operator's retry, cancel, terminate, suspend and resume, and an order's external events. Thin
adapters over ``shared.api.orders``, ``.search`` and ``.operator``: parse the request, call
shared/, return its result."""

from __future__ import annotations

import azure.functions as func

from functions.http import to_response
from functions.operator_auth import LEVEL as OPERATOR
from functions.operator_auth import actor, operator_only, reader_only
from shared.api.operator import cancel_order, resume_order, retry_order, send_event, suspend_order, terminate_order
from shared.api.orders import get_history, get_order, list_workflows, submit
from shared.api.search import search_orders
from shared.core.once import once
from shared.runtime import get_runtime
from shared.settings import Settings

bp = func.Blueprint()

@once
def _limit() -> int:
    return Settings.from_env().int("MaxRequestBytes")


@bp.function_name("submit_order")
@bp.route(route="orders", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def submit_order(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(submit(get_runtime(), req.get_body(), dict(req.headers), max_bytes=_limit()))


@bp.function_name("get_order")
@bp.route(route="orders/{id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def get_order_status(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(get_order(get_runtime(), req.route_params.get("id")))


@bp.function_name("search_orders")
@bp.route(route="orders", methods=["GET"], auth_level=OPERATOR)
@reader_only
def search(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(search_orders(get_runtime(), dict(req.params)))


@bp.function_name("order_history")
@bp.route(route="orders/{id}/history", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def history(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(get_history(get_runtime(), req.route_params.get("id"), dict(req.params)))


@bp.function_name("list_workflows")
@bp.route(route="workflows", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def workflows(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(list_workflows(get_runtime()))


@bp.function_name("retry_order")
@bp.route(route="orders/{id}/retry", methods=["POST"], auth_level=OPERATOR)
@operator_only
def retry(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(retry_order(get_runtime(), req.route_params.get("id"), by=actor(req)))


@bp.function_name("cancel_order")
@bp.route(route="orders/{id}/cancel", methods=["POST"], auth_level=OPERATOR)
@operator_only
def cancel(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(cancel_order(get_runtime(), req.route_params.get("id"), by=actor(req)))


@bp.function_name("terminate_order")
@bp.route(route="orders/{id}/terminate", methods=["POST"], auth_level=OPERATOR)
@operator_only
def terminate(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(terminate_order(get_runtime(), req.route_params.get("id"), by=actor(req)))


@bp.function_name("suspend_order")
@bp.route(route="orders/{id}/suspend", methods=["POST"], auth_level=OPERATOR)
@operator_only
def suspend(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(suspend_order(get_runtime(), req.route_params.get("id"), by=actor(req)))


@bp.function_name("resume_order")
@bp.route(route="orders/{id}/resume", methods=["POST"], auth_level=OPERATOR)
@operator_only
def resume(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(resume_order(get_runtime(), req.route_params.get("id"), by=actor(req)))


@bp.function_name("send_event")
@bp.route(route="orders/{id}/events/{name}", methods=["POST"], auth_level=OPERATOR)
@operator_only
def event(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(send_event(get_runtime(), req.route_params.get("id"), req.route_params.get("name"),
                                  req.get_body(), dict(req.headers), by=actor(req)))
