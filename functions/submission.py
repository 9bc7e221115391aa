"""HTTP functions: submission, order status, operator retry/cancel. Thin adapters over
``shared.submission``: parse the request, call the core, return its result."""

from __future__ import annotations

import azure.functions as func

from shared.runtime import get_runtime
from shared.settings import Settings
from shared.submission import HttpResult, cancel_order, get_order, retry_order, submit

bp = func.Blueprint()

_max_bytes: int | None = None


def _limit() -> int:
    global _max_bytes
    if _max_bytes is None:
        _max_bytes = Settings.from_env().int("MaxRequestBytes")
    return _max_bytes


def to_response(result: HttpResult) -> func.HttpResponse:
    return func.HttpResponse(body=result.encoded(), status_code=result.status, headers=result.headers,
                             mimetype=result.content_type, charset="utf-8")


@bp.function_name("submit_order")
@bp.route(route="orders", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def submit_order(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(submit(get_runtime(), req.get_body(), dict(req.headers), max_bytes=_limit()))


@bp.function_name("get_order")
@bp.route(route="orders/{id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def get_order_status(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(get_order(get_runtime(), req.route_params.get("id")))


@bp.function_name("retry_order")
@bp.route(route="orders/{id}/retry", methods=["POST"], auth_level=func.AuthLevel.ADMIN)
def retry(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(retry_order(get_runtime(), req.route_params.get("id")))


@bp.function_name("cancel_order")
@bp.route(route="orders/{id}/cancel", methods=["POST"], auth_level=func.AuthLevel.ADMIN)
def cancel(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(cancel_order(get_runtime(), req.route_params.get("id")))
