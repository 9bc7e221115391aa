"""The operator's routes of webhook deliveries (``shared.runtime.webhooks``): the failed ones
(``GET /api/webhooks``), and sending one again (``POST /api/orders/{id}/webhooks/{delivery}/resend``)."""

from __future__ import annotations

from collections.abc import Mapping

from shared.api.http import HttpResult, problem, resolve_id, unknown_query
from shared.core.webhooks import HOOK_PREFIX
from shared.runtime import Runtime
from shared.runtime.webhooks import failed_deliveries, resend

MAX_LIMIT = 200


def list_failed(rt: Runtime, params: Mapping[str, str]) -> HttpResult:
    """``?state=failed`` (the only state listed: the others need nobody) and ``limit`` (1 to 200)."""
    bad = unknown_query(params, ("state", "limit"), "Invalid webhook query")
    if bad is not None:
        return bad
    if params.get("state", "failed") != "failed":
        return problem(400, "invalid-query", "Invalid webhook query", "state: only failed deliveries are listed",
                       errors=[{"field": "state", "message": "must be failed"}])
    raw = params.get("limit", "50")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        return problem(400, "invalid-query", "Invalid webhook query", f"limit: 1 to {MAX_LIMIT}",
                       errors=[{"field": "limit", "message": f"must be 1 to {MAX_LIMIT}"}])
    return HttpResult(200, {"deliveries": failed_deliveries(rt, int(raw))})


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
