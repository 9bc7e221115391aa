"""Submission and the order API (HTTP), framework-neutral: bytes + headers in, HttpResult out.

* POST /api/orders: 415 unless the body is JSON (content type, UTF-8, parseable), 413 over
  MaxRequestBytes, 400 problem+json naming every bad field; nothing is written on any
  rejection. Then the order row + state row + step rows in ONE transaction (preceded by the
  order's deadline index row), and the Scheduler told in-process: that transaction is its
  first claim, and the first step's request is sent right after it; 202 + Location.
* Idempotency-Key: the order id is uuid5(key), so a replay hits the same partition and its
  create conflicts. Same body hash -> 200 with the existing order's id and state (and the
  request in flight re-sent, deduplicated by its message id, in case the first submission
  died before sending it); different body -> 409 problem+json.
* GET /api/orders/{id}: the order, its state, steps and compensation progress.
* POST /api/orders/{id}/retry | /cancel (operator): 409 problem+json with the reason when the
  order is in the wrong state.
Ids are validated (32 hex) before any table call; Table filters are parameterised.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from shared.effects import Send, Transact
from shared.logs import log_event, new_traceparent, parse_traceparent
from shared.models import (
    IDEMPOTENCY_KEY,
    MAX_IDEMPOTENCY_KEY_LENGTH,
    DuplicateKeyError,
    OrderRequest,
    dumps,
    is_order_id,
    loads,
    new_order_id,
    order_id_for_key,
    too_deep,
    validation_errors,
)
from shared.runtime import Runtime
from shared.statemachine import (
    UNCLAIMED,
    Rejected,
    View,
    decide_cancel,
    decide_retry,
    inflight_request,
    plan_submission,
    schedule_message,
)
from shared.store import ORDER_ROW, STATE_ROW

PROBLEM = "application/problem+json"
PROBLEM_BASE = "https://errors.orders.example/"
OPERATOR_RACE_RETRIES = 3


@dataclass
class HttpResult:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"

    def encoded(self) -> bytes:
        return b"" if self.body is None else dumps(self.body).encode("utf-8")

    def json(self) -> Any:
        return self.body


# An order nests three levels ({items: [{...}]}); anything far deeper is hostile, and is named
# before the recursive JSON parser could exhaust its stack on it.
MAX_JSON_DEPTH = 32

def problem(status: int, kind: str, title: str, detail: str, errors: list[dict[str, str]] | None = None,
            **extra: Any) -> HttpResult:
    body: dict[str, Any] = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    body.update(extra)
    return HttpResult(status, body, content_type=PROBLEM)


def _lower(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in (headers or {}).items()}


def _is_json_type(content_type: str | None) -> bool:
    if not content_type:
        return False
    parts = [p.strip().lower() for p in content_type.split(";")]
    media = parts[0]
    if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
        return False
    for p in parts[1:]:
        if p.startswith("charset=") and p.split("=", 1)[1].strip('"') not in ("utf-8", "utf8"):
            return False
    return True


def bad_id(order_id: str | None) -> HttpResult | None:
    if is_order_id(order_id):
        return None
    return problem(400, "invalid-order-id", "Invalid order id", "an order id is 32 lower-case hex characters",
                   errors=[{"field": "id", "message": "must be 32 lower-case hexadecimal characters"}])


# ---------------------------------------------------------------------------------------------
def submit(rt: Runtime, body: bytes | None, headers: Mapping[str, str] | None, *, max_bytes: int) -> HttpResult:
    h = _lower(headers)
    body = body or b""
    declared = h.get("content-length")
    if len(body) > max_bytes or (declared and declared.isdigit() and int(declared) > max_bytes):
        return problem(413, "too-large", "Request body too large", f"the body must be at most {max_bytes} bytes")
    if not _is_json_type(h.get("content-type")):
        return problem(415, "unsupported-media-type", "Unsupported media type",
                       "the body must be JSON (Content-Type: application/json, UTF-8)")
    try:
        deep = too_deep(body.decode("utf-8"), MAX_JSON_DEPTH)
    except UnicodeDecodeError:
        return problem(415, "unsupported-media-type", "Unsupported media type", "the body is not valid UTF-8 JSON")
    if deep is not None:
        return problem(400, "validation", "Invalid order", f"JSON nests deeper than {MAX_JSON_DEPTH} levels",
                       errors=[{"field": deep, "message": f"nests deeper than {MAX_JSON_DEPTH} levels"}])
    try:
        payload = loads(body)
    except DuplicateKeyError as exc:
        return problem(400, "validation", "Invalid order", str(exc), errors=[{"field": "(body)", "message": str(exc)}])
    except (UnicodeDecodeError, ValueError):
        return problem(415, "unsupported-media-type", "Unsupported media type", "the body is not valid UTF-8 JSON")
    except RecursionError:  # nesting deep enough to exhaust the parser's stack, yet under the size limit
        return problem(400, "validation", "Invalid order", "the JSON nests too deeply",
                       errors=[{"field": "(body)", "message": "nests too deeply"}])
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
    if errors or order is None:
        return problem(400, "validation", "Invalid order", f"{len(errors)} invalid field(s)", errors=errors)

    order_id = order_id_for_key(key) if key else new_order_id()
    traceparent = parse_traceparent(h.get("traceparent")) or new_traceparent()
    canonical = order.canonical()
    body_hash = order.body_hash()
    ctx = rt.ctx()
    effects = plan_submission(order_id, canonical, total=format(order.total, "f"), body_hash=body_hash,
                              idempotency_key=key, traceparent=traceparent, ctx=ctx)
    try:
        outcome = rt.run(effects)
    except Exception as exc:  # store unavailable: nothing (or only an orphan index row) was written
        log_event(logging.ERROR, "order.store_failed", order_id=order_id, traceparent=traceparent, error=repr(exc))
        result = problem(503, "unavailable", "Service unavailable", "the order could not be stored; retry later")
        result.headers["Retry-After"] = "5"
        return result
    if outcome.lost_race:  # the create conflicted: this order id exists already
        return _replay(rt, order_id, body_hash, key)
    log_event(logging.INFO, "order.accepted", order_id=order_id, traceparent=traceparent,
              items=len(order.items), total=format(order.total, "f"), idempotent=key is not None)
    return HttpResult(202, {"orderId": order_id, "processState": "Processing"},
                      headers={"Location": f"/api/orders/{order_id}"})


def _replay(rt: Runtime, order_id: str, body_hash: str, key: str | None) -> HttpResult:
    rows = rt.store.read_partition(order_id)
    order, state = rows.get(ORDER_ROW), rows.get(STATE_ROW)
    if order is None or state is None or key is None:
        raise RuntimeError(f"order {order_id} conflicted but cannot be read")
    if order.get("BodyHash") != body_hash:
        return problem(409, "idempotency-key-reuse", "Idempotency-Key reused",
                       "this Idempotency-Key was used for a different order body", orderId=order_id)
    view = View(rows)
    ctx = rt.ctx()
    if state.get("LeaseKey") == UNCLAIMED and not state.get("LockedBy"):
        # redriven and waiting for a claim: its schedule notice may have been lost (deduplicated)
        rt.run([Send(schedule_message(order_id, int(state.get("ScheduleSeq") or 0), ctx, view.traceparent),
                     critical=False, what="schedule (replay)")])
    elif (resend := inflight_request(view, ctx)) is not None:
        # the first submission may have died between its transaction and its send
        rt.run([Send(resend.message, critical=False, what="request (replay)")])
    log_event(logging.INFO, "order.replayed", order_id=order_id, traceparent=view.traceparent)
    return HttpResult(200, {"orderId": order_id, "processState": state.get("ProcessState")},
                      headers={"Location": f"/api/orders/{order_id}", "Idempotent-Replayed": "true"})


# ---------------------------------------------------------------------------------------------
def _json_or_none(raw: str | None) -> Any:
    return loads(raw) if raw else None


def order_view(rows: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    v = View(rows)
    st, order = v.state or {}, v.order or {}
    steps = []
    for s in v.steps:
        comp = None
        if s.get("Compensation"):
            comp = {"state": s.get("Compensation"), "attempt": s.get("CompensationAttempt") or 0,
                    "startedAt": s.get("CompensationStartedAt"), "finishedAt": s.get("CompensationFinishedAt"),
                    "completeBy": s.get("CompensationCompleteBy"),
                    "result": _json_or_none(s.get("CompensationResult")), "reason": s.get("CompensationReason")}
        steps.append({"name": s["Name"], "state": s["State"], "attempt": s.get("Attempt") or 0,
                      "startedAt": s.get("StartedAt"), "finishedAt": s.get("FinishedAt"),
                      "completeBy": s.get("CompleteBy"), "result": _json_or_none(s.get("Result")),
                      "failureReason": s.get("FailureReason"), "compensation": comp})
    comp_steps = [s for s in steps if s["compensation"]]
    return {
        "orderId": st.get("OrderID"),
        "processState": st.get("ProcessState"),
        "failureCount": st.get("FailureCount") or 0,
        "outcome": st.get("Outcome"),
        "reason": st.get("Reason"),
        "failedStep": st.get("FailedStep"),
        "lockedBy": st.get("LockedBy"),
        "completeBy": st.get("CompleteBy"),
        "currentStep": st.get("StepName") if st.get("Mode") == "forward" else None,
        "createdAt": order.get("CreatedAt"),
        "updatedAt": st.get("UpdatedAt"),
        "order": {"customerId": order.get("CustomerId"), "currency": order.get("Currency"),
                  "items": _json_or_none(order.get("Items")), "total": order.get("Total"),
                  "priority": order.get("Priority"), "statusQueue": order.get("StatusQueue")},
        "steps": steps,
        "compensation": {
            "state": st.get("CompensationState") or "none",
            "total": len(comp_steps),
            "done": sum(1 for s in comp_steps if s["compensation"]["state"] == "Done"),
            "failed": sum(1 for s in comp_steps if s["compensation"]["state"] == "Failed"),
            "pending": sum(1 for s in comp_steps if s["compensation"]["state"] in ("Pending", "Running")),
        },
    }


def get_order(rt: Runtime, order_id: str | None) -> HttpResult:
    if (bad := bad_id(order_id)) is not None:
        return bad
    assert order_id is not None
    rows = rt.store.read_partition(order_id)
    if STATE_ROW not in rows or ORDER_ROW not in rows:
        return problem(404, "not-found", "Order not found", f"no order {order_id}")
    return HttpResult(200, order_view(rows))


def _operate(rt: Runtime, order_id: str | None, action: str) -> HttpResult:
    if (bad := bad_id(order_id)) is not None:
        return bad
    assert order_id is not None
    decide = decide_retry if action == "retry" else decide_cancel
    for _ in range(OPERATOR_RACE_RETRIES):
        rows = rt.store.read_partition(order_id)
        if STATE_ROW not in rows:
            return problem(404, "not-found", "Order not found", f"no order {order_id}")
        try:
            decision = decide(View(rows), rt.ctx())
        except Rejected as exc:
            return problem(409, "wrong-state", f"Cannot {action} this order", str(exc), orderId=order_id,
                           processState=rows[STATE_ROW].get("ProcessState"))
        outcome = rt.run(decision.effects)
        if not outcome.lost_race:
            new_state = next((op.row for e in decision.effects if isinstance(e, Transact) for op in e.ops
                              if op.row_key == STATE_ROW), {})
            return HttpResult(202, {"orderId": order_id, "action": action, "result": decision.verdict,
                                    "processState": new_state.get("ProcessState")},
                              headers={"Location": f"/api/orders/{order_id}"})
    return problem(409, "conflict", f"Cannot {action} this order", "the order kept changing; try again",
                   orderId=order_id)


def retry_order(rt: Runtime, order_id: str | None) -> HttpResult:
    return _operate(rt, order_id, "retry")


def cancel_order(rt: Runtime, order_id: str | None) -> HttpResult:
    return _operate(rt, order_id, "cancel")
