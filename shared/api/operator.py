"""The operator's actions on one order: ``POST /api/orders/{id}/retry``, ``/cancel``,
``/terminate``, ``/suspend`` and ``/resume``, and an external event,
``POST /api/orders/{id}/events/{name}``. Each reads the order, asks the core
(``shared.core.statemachine.actions``, ``.events``) and runs the decision; a lost race is decided
again on fresh rows, a few times. 409 problem+json names the reason when the order is in the
wrong state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from shared.api.http import HttpResult, lower_headers, parse_json_body, problem, resolve_id
from shared.core.effects import Transact
from shared.core.jsonio import dumps
from shared.core.orders import IDEMPOTENCY_KEY, MAX_IDEMPOTENCY_KEY_LENGTH
from shared.core.rows import STATE_ROW
from shared.core.statemachine import BadEvent, Ctx, Decision, Rejected, View, bound, decide_event, event_key
from shared.core.statemachine.actions import ACTIONS
from shared.core.workflows import UnknownWorkflow
from shared.core.workflows.schema import NAME_PATTERN
from shared.observability import telemetry
from shared.runtime import Runtime
from shared.storage.views import read_view

OPERATOR_RACE_RETRIES = 3
MAX_EVENT_BYTES = 16 * 1024  # an event's body is kept on its step's row (a Table property holds 64 KiB)


def _operate(rt: Runtime, raw_id: str | None, action: str, decide: Callable[[View, Ctx], Decision] | None = None,
             *, by: str | None = None, verb: str | None = None, **answer: Any) -> HttpResult:
    """``action`` on the order (``decide``, else the operator action of that name); ``by``: who
    asked (every event it records says so); ``verb``: what a 409's title says cannot be done;
    ``answer``: fields of the 202's body."""
    verb = verb or action
    order_id = resolve_id(raw_id)
    if isinstance(order_id, HttpResult):
        return order_id
    decide = decide or ACTIONS[action]
    for _ in range(OPERATOR_RACE_RETRIES):
        view = read_view(rt.store, order_id)
        if view.state is None:
            return problem(404, "not-found", "Order not found", f"no order {order_id}")
        with telemetry.order_span(f"operator.{action}", view.traceparent,
                                  **{"orders.order_id": order_id, telemetry.KEEP: True}):
            try:
                decision = decide(view, bound(view, rt.ctx(actor=by)))
            except UnknownWorkflow as exc:
                return problem(409, "workflow-not-deployed", f"Cannot {verb} this order",
                               f"{exc}: deploy its workflow file again first", orderId=order_id,
                               processState=view.state.process_state)
            except Rejected as exc:
                return problem(409, "wrong-state", f"Cannot {verb} this order", str(exc), orderId=order_id,
                               processState=view.state.process_state)
            except BadEvent as exc:
                return problem(400, "validation", "Invalid event", str(exc),
                               errors=[{"field": "(body)", "message": str(exc)}])
            outcome = rt.run(decision.effects)
        if not outcome.lost_race:
            new_state = next((op.row for e in decision.effects if isinstance(e, Transact) for op in e.ops
                              if op.row_key == STATE_ROW), {})
            named = {"action": action} if action in ACTIONS else {}  # an event's answer names the event
            return HttpResult(202, {"orderId": order_id, **named, **answer, "result": decision.verdict,
                                    "processState": new_state.get("ProcessState") or view.state.process_state},
                              headers={"Location": f"/api/orders/{order_id}"})
    return problem(409, "conflict", f"Cannot {verb} this order", "the order kept changing; try again",
                   orderId=order_id)


def retry_order(rt: Runtime, order_id: str | None, by: str | None = None) -> HttpResult:
    return _operate(rt, order_id, "retry", by=by)


def cancel_order(rt: Runtime, order_id: str | None, by: str | None = None) -> HttpResult:
    return _operate(rt, order_id, "cancel", by=by)


def terminate_order(rt: Runtime, order_id: str | None, by: str | None = None) -> HttpResult:
    return _operate(rt, order_id, "terminate", by=by)


def suspend_order(rt: Runtime, order_id: str | None, by: str | None = None) -> HttpResult:
    return _operate(rt, order_id, "suspend", by=by)


def resume_order(rt: Runtime, order_id: str | None, by: str | None = None) -> HttpResult:
    return _operate(rt, order_id, "resume", by=by)


def send_event(rt: Runtime, raw_id: str | None, name: str | None, body: bytes | None,
               headers: Mapping[str, str] | None, by: str | None = None) -> HttpResult:
    """``POST /api/orders/{id}/events/{name}``: the event for the order's wait step
    (``shared.core.statemachine.events``). 202 accepted (the wait ended, or the event is kept for
    when it starts, or it is a copy), 400 a bad name or a body that is not a JSON object, 404 no
    such order, 409 a finished order, or one whose workflow waits for no such event."""
    h = lower_headers(headers)
    order_id = resolve_id(raw_id)
    if isinstance(order_id, HttpResult):
        return order_id
    if not name or not NAME_PATTERN.fullmatch(name):
        return problem(400, "validation", "Invalid event name", "an event name is lower-case letters, digits and "
                       "'-', starting with a letter (as a workflow's wait step names it)",
                       errors=[{"field": "name", "message": "must match ^[a-z][a-z0-9-]{0,62}$"}])
    payload, rejected = parse_json_body(body or b"", h, MAX_EVENT_BYTES, title="Invalid event")
    if rejected is not None:
        return rejected
    if not isinstance(payload, dict):
        return problem(400, "validation", "Invalid event", "the body must be a JSON object",
                       errors=[{"field": "(body)", "message": "must be a JSON object"}])
    try:  # an escaped lone UTF-16 surrogate ("\ud800") parses, but is no text to store or hash
        dumps(payload).encode("utf-8")
    except UnicodeEncodeError:
        return problem(400, "validation", "Invalid event", "the body holds a lone UTF-16 surrogate "
                       "(an escaped \\ud800-\\udfff without its pair): not Unicode text",
                       errors=[{"field": "(body)", "message": "holds a lone UTF-16 surrogate"}])
    key = h.get("idempotency-key")
    if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH and IDEMPOTENCY_KEY.fullmatch(key)):
        return problem(400, "validation", "Invalid event", "invalid Idempotency-Key",
                       errors=[{"field": "Idempotency-Key",
                                "message": f"must be 1-{MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters"}])
    decide = partial(_decide_event, name, payload, event_key(payload, key))
    return _operate(rt, order_id, "event", decide, by=by, verb=f"send {name!r} to", event=name)


def _decide_event(name: str, body: dict[str, Any], key: str, view: View, ctx: Ctx) -> Decision:
    return decide_event(view, name, body, key, ctx)
