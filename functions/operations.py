"""HTTP functions of bulk operations (issue 30): ``POST /api/operations`` starts one (an operator
route), ``GET /api/operations/{id}`` shows its progress (a viewer may read it). Thin adapters over
``shared.api.bulk``; the Supervisor's ticks carry the operation on (``shared.runtime.bulk``)."""

from __future__ import annotations

import azure.functions as func

from functions.http import to_response
from functions.operator_auth import LEVEL as OPERATOR
from functions.operator_auth import actor, operator_only, reader_only
from shared.api.bulk import get_operation, start_operation
from shared.runtime import get_runtime

bp = func.Blueprint()


@bp.function_name("start_operation")
@bp.route(route="operations", methods=["POST"], auth_level=OPERATOR)
@operator_only
def start(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(start_operation(get_runtime(), req.get_body(), dict(req.headers), by=actor(req)))


@bp.function_name("get_operation")
@bp.route(route="operations/{id}", methods=["GET"], auth_level=OPERATOR)
@reader_only
def progress(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(get_operation(get_runtime(), req.route_params.get("id")))
