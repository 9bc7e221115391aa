"""Submission and the order API (HTTP), framework-neutral: bytes + headers in, HttpResult out.

* POST /api/orders: 413 over MaxRequestBytes, 415 unless the Content-Type is JSON (UTF-8),
  400 problem+json when the body so declared is not valid UTF-8 JSON (``invalid-json``, saying
  where) or names a bad field (``validation``, naming every one); nothing is written on any
  rejection. Then the order row + state row + step rows in ONE transaction (preceded by the
  order's deadline index row), and the Scheduler told in-process: that transaction is its
  first claim, and the first step's request is sent right after it; 202 + Location.
* Idempotency-Key: the order id is uuid5(key), so a replay hits the same partition and its
  create conflicts. Same body hash -> 200 with the existing order's id and state (and the
  request in flight re-sent, deduplicated by its message id, in case the first submission
  died before sending it); different body -> 409 problem+json.
* ``"workflow"`` names the workflow the order runs (default ``order``), at its highest loaded
  version; an unknown name is a 400 naming ``workflow``. GET /api/workflows lists every loaded
  version.
* GET /api/orders/{id}: the order, its workflow (name, version), state, steps, compensation
  progress and the first page of its history; GET /api/orders/{id}/history pages through the rest.
* The operator's retry, cancel and terminate: ``shared.api.operator``. Search: ``shared.api.search``.
Ids (32 lower-case hex, or a UUID with dashes in any case: the same order) are validated and
brought to their stored form before any table call; Table filters are parameterised.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from shared.api.http import HttpResult, lower_headers, parse_json_body, problem, resolve_id, unknown_query
from shared.api.tokens import InvalidToken, issue, redeem
from shared.api.views import order_view, waiting_remote
from shared.core.effects import Effect
from shared.core.orders import (
    IDEMPOTENCY_KEY,
    MAX_IDEMPOTENCY_KEY_LENGTH,
    OrderRequest,
    new_order_id,
    order_id_for_key,
    validation_errors,
)
from shared.core.room import room_partition
from shared.core.rows import STATE_ROW
from shared.core.statemachine import Ctx, bound, plan_replay, plan_submission
from shared.core.statemachine.actions import allowed_actions
from shared.core.statemachine.admission import replay_room
from shared.core.workflows import UnknownWorkflow
from shared.observability import metrics, telemetry
from shared.observability.logs import log_event
from shared.runtime import Runtime, rooms
from shared.storage.breakers import read_breaker
from shared.storage.views import read_view

HISTORY_PAGE = 100
MAX_HISTORY_PAGE = 1000


# ---------------------------------------------------------------------------------------------
def submit(rt: Runtime, body: bytes | None, headers: Mapping[str, str] | None, *, max_bytes: int) -> HttpResult:
    """POST /api/orders, in the HTTP server span that starts the order's trace (a child of the
    request's ``traceparent``); that span's traceparent is stored on the order row."""
    h = lower_headers(headers)
    with telemetry.server_span("POST /api/orders", h, **{"http.request.method": "POST",
                                                         "url.path": "/api/orders"}) as span:
        result = _submit(rt, body, h, max_bytes=max_bytes)
        span.set_attribute("http.response.status_code", result.status)
        order_id = result.body.get("orderId") if isinstance(result.body, dict) else None
        if isinstance(order_id, str):
            span.set_attribute("orders.order_id", order_id)
        return result


def _submit(rt: Runtime, body: bytes | None, h: dict[str, str], *, max_bytes: int) -> HttpResult:
    payload, rejected = parse_json_body(body or b"", h, max_bytes)
    if rejected is not None:
        return rejected
    key = h.get("idempotency-key")
    errors: list[dict[str, str]] = []
    if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH and IDEMPOTENCY_KEY.fullmatch(key)):
        errors.append({"field": "Idempotency-Key",
                       "message": f"must be 1-{MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters"})
    order: OrderRequest | None = None
    if not isinstance(payload, dict):
        errors.append({"field": "(body)", "message": "must be a JSON object"})
    else:
        try:
            order = OrderRequest.model_validate(payload)
        except ValidationError as exc:
            errors.extend(validation_errors(exc))
    if order is not None and order.statusQueue:
        # Service Bus entity names ignore case: "Scheduler" is the scheduler queue.
        own = {q.lower() for name, q in rt.config.queues.items() if name != "StatusQueue"}
        if order.statusQueue.lower() in own:
            errors.append({"field": "statusQueue", "message": "must not name one of the app's own queues"})
    known = rt.config.registry.names()
    if order is not None and order.workflow_name not in known:
        errors.append({"field": "workflow", "message": f"unknown workflow (loaded: {', '.join(known)})"})
    if errors or order is None:
        return problem(400, "validation", "Invalid order", f"{len(errors)} invalid field(s)", errors=errors)

    order_id = order_id_for_key(key) if key else new_order_id()
    traceparent = telemetry.current_traceparent() or ""  # the server span's: always valid there
    canonical = order.canonical()
    body_hash = order.body_hash()
    workflow = rt.config.registry.latest(order.workflow_name)  # a new order runs the highest version
    ctx = rt.ctx()
    ctx = replace(ctx, config=ctx.config.bound(workflow.name, workflow.version))
    try:
        room, waiting = _at_the_door(rt, order.customerId, order_id, ctx.now)
        effects = plan_submission(order_id, canonical, total=format(order.total, "f"), body_hash=body_hash,
                                  idempotency_key=key, traceparent=traceparent, ctx=ctx, room=room, waiting=waiting)
        outcome = rt.run(effects)
    except Exception as exc:  # store unavailable: nothing (or only an orphan index row) was written
        log_event(logging.ERROR, "order.store_failed", order_id=order_id, traceparent=traceparent, error=repr(exc))
        result = problem(503, "unavailable", "Service unavailable", "the order could not be stored; retry later")
        result.headers["Retry-After"] = "5"
        return result
    if outcome.lost_race:  # the create conflicted: this order id exists already
        return _replay(rt, order_id, body_hash, key, effects, holds=room if not waiting else None)
    metrics.submitted.add(1)
    log_event(logging.INFO, "order.accepted", order_id=order_id, traceparent=traceparent,
              items=len(order.items), total=format(order.total, "f"), idempotent=key is not None,
              workflow=workflow.label)
    accepted: dict[str, Any] = {"orderId": order_id, "processState": "Pending" if waiting else "Processing"}
    if waiting:
        accepted["waitingFor"] = "customer"  # over CustomerMaxInFlight: it starts when a slot frees, in its turn
    return HttpResult(202, accepted, headers={"Location": f"/api/orders/{order_id}"})


def _at_the_door(rt: Runtime, customer_id: str, order_id: str, now: datetime) -> tuple[str | None, bool]:
    """The customer's room when ``CustomerMaxInFlight`` caps it (``shared.core.room``), and whether
    the order waits there (False: it holds a slot, taken here before its order is written)."""
    cap = rt.config.customer_max_in_flight
    if cap <= 0:
        return None, False
    partition = room_partition(customer_id)
    return partition, not rooms.enter(rt.store, partition, order_id, cap, now)


def _replay(rt: Runtime, order_id: str, body_hash: str, key: str | None, submitted: list[Effect], *,
            holds: str | None = None) -> HttpResult:
    """The order exists: the same order again (200, and what its first submission may not have
    sent, sent: ``plan_replay``), or another body under the same key (409). ``holds``: the room
    where this request took a slot at the door (``replay_room``)."""
    view = read_view(rt.store, order_id)
    order, state = view.order, view.state
    if order is None or state is None or key is None:
        raise RuntimeError(f"order {order_id} conflicted but cannot be read")
    same_body = order.body_hash == body_hash
    try:
        ctx: Ctx | None = bound(view, rt.ctx())
    except UnknownWorkflow:  # nothing to re-send: the next message or sweep holds the order
        ctx = None
    rt.run([*plan_replay(view, submitted, ctx, same_body=same_body), *replay_room(view, holds, rt.ctx())])
    if not same_body:
        return problem(409, "idempotency-key-reuse", "Idempotency-Key reused",
                       "this Idempotency-Key was used for a different order body", orderId=order_id)
    log_event(logging.INFO, "order.replayed", order_id=order_id, traceparent=view.traceparent)
    return HttpResult(200, {"orderId": order_id, "processState": state.process_state},
                      headers={"Location": f"/api/orders/{order_id}", "Idempotent-Replayed": "true"})


# ---------------------------------------------------------------------------------------------
def get_order(rt: Runtime, raw_id: str | None) -> HttpResult:
    order_id = resolve_id(raw_id)
    if isinstance(order_id, HttpResult):
        return order_id
    view = read_view(rt.store, order_id)
    if view.state is None or view.order is None:
        return problem(404, "not-found", "Order not found", f"no order {order_id}")
    events, token = _history_page(rt, order_id, 0, HISTORY_PAGE)
    remote = waiting_remote(view)
    breakers = {remote: read_breaker(rt.store, remote)} if remote is not None else {}  # one read, while it waits
    try:
        ctx = bound(view, rt.ctx())
        actions, workflow = allowed_actions(view, ctx), ctx.config.workflow
    except UnknownWorkflow:  # every action answers 409 workflow-not-deployed
        actions, workflow = [], None
    return HttpResult(200, {**order_view(view, breakers, workflow), "actions": actions, "history": events,
                            "historyContinuationToken": token})


def _history_page(rt: Runtime, order_id: str, after: int, limit: int) -> tuple[list[dict[str, Any]], str | None]:
    """Up to ``limit`` events after event ``after``, and the token for the rest (if any)."""
    rows = rt.store.read_history(order_id, after, limit + 1)
    more = len(rows) > limit
    page = rows[:limit]
    token = issue(rt.keys, f"history:{order_id}", {"after": page[-1].seq}) if more and page else None
    return [r.to_json() for r in page], token


def _bad_history_token(reason: str) -> HttpResult:
    return problem(400, "invalid-continuation-token", "Invalid history query",
                   f"continuationToken: not a token this order's history issued ({reason})",
                   errors=[{"field": "continuationToken", "message": "not a token this history issued"}])


def get_history(rt: Runtime, raw_id: str | None, params: Mapping[str, str]) -> HttpResult:
    """``GET /api/orders/{id}/history?limit=&continuationToken=``: the order's events, oldest first."""
    order_id = resolve_id(raw_id)
    if isinstance(order_id, HttpResult):
        return order_id
    unknown = unknown_query(params, ("limit", "continuationToken"), "Invalid history query")
    if unknown is not None:
        return unknown
    raw_limit = params.get("limit", str(HISTORY_PAGE))
    if not (raw_limit.isascii() and raw_limit.isdigit() and len(raw_limit) <= 5
            and 1 <= int(raw_limit) <= MAX_HISTORY_PAGE):
        return problem(400, "invalid-query", "Invalid history query", f"limit: must be 1 to {MAX_HISTORY_PAGE}",
                       errors=[{"field": "limit", "message": f"must be a whole number from 1 to {MAX_HISTORY_PAGE}"}])
    after: Any = 0
    token = params.get("continuationToken")
    if token is not None:
        try:
            after = redeem(rt.keys, f"history:{order_id}", token).get("after")
        except InvalidToken as exc:
            return _bad_history_token(str(exc))
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            return _bad_history_token("out of range")
    if rt.store.read_row(order_id, STATE_ROW) is None:
        return problem(404, "not-found", "Order not found", f"no order {order_id}")
    events, following = _history_page(rt, order_id, after, int(raw_limit))
    return HttpResult(200, {"orderId": order_id, "history": events, "continuationToken": following})


def list_workflows(rt: Runtime) -> HttpResult:
    """``GET /api/workflows``: every loaded version of every workflow, with its steps."""
    return HttpResult(200, {"workflows": [wf.to_json() for wf in rt.config.registry.all()]})
