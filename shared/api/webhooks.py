"""The operator's routes of webhook deliveries (``shared.runtime.webhooks``): the failed ones, or one
order's (``GET /api/webhooks``), and sending one again (``POST /api/orders/{id}/webhooks/{delivery}/resend``)."""

from __future__ import annotations

from collections.abc import Mapping

from shared.api.http import HttpResult, problem, resolve_id, unknown_query
from shared.core.webhooks import HOOK_PREFIX
from shared.runtime import Runtime
from shared.runtime.webhooks import failed_deliveries, order_deliveries, resend

MAX_LIMIT = 200


def list_deliveries(rt: Runtime, params: Mapping[str, str]) -> HttpResult:
    """``?state=failed`` (the default): the deliveries that gave up, every order's; ``?orderId=``:
    that order's deliveries, whatever their status (``state=failed``: its failed ones); ``limit``
    (1 to 200)."""
    bad = unknown_query(params, ("state", "orderId", "limit"), "Invalid webhook query")
    if bad is not None:
        return bad
    state = params.get("state")
    if state not in (None, "failed"):
        return problem(400, "invalid-query", "Invalid webhook query", "state: only failed is a state to list by",
                       errors=[{"field": "state", "message": "must be failed"}])
    raw = params.get("limit", "50")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3 and 1 <= int(raw) <= MAX_LIMIT):
        return problem(400, "invalid-query", "Invalid webhook query", f"limit: 1 to {MAX_LIMIT}",
                       errors=[{"field": "limit", "message": f"must be 1 to {MAX_LIMIT}"}])
    if "orderId" not in params:
        return HttpResult(200, {"deliveries": failed_deliveries(rt, int(raw))})
    order_id = resolve_id(params["orderId"])
    if isinstance(order_id, HttpResult):
        return order_id
    deliveries = order_deliveries(rt, order_id, int(raw))
    if state == "failed":
        deliveries = [d for d in deliveries if d["status"] == "failed"]
    return HttpResult(200, {"deliveries": deliveries})


def resend_delivery(rt: Runtime, raw_id: str | None, delivery: str | None) -> HttpResult:
    order_id = resolve_id(raw_id)
    if isinstance(order_id, HttpResult):
        return order_id
    if not delivery or not delivery.startswith(HOOK_PREFIX) or not delivery[len(HOOK_PREFIX):].isdigit():
        return problem(400, "invalid-delivery", "Invalid delivery", "a delivery is hook-NNNNNNNN (its listing's "
                       "delivery field)", errors=[{"field": "delivery", "message": "must be hook-NNNNNNNN"}])
    shown = resend(rt, order_id, delivery)
    if shown is None:
        return problem(404, "not-found", "Delivery not found", f"order {order_id} has no delivery {delivery}")
    return HttpResult(202 if shown["status"] == "pending" else 200, shown)
