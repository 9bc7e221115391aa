"""The operator's actions on one order: ``POST /api/orders/{id}/retry``, ``/cancel``,
``/terminate``, ``/suspend`` and ``/resume``. Each reads the order, asks the core
(``shared.core.statemachine.actions``) and runs the decision; a lost race is decided again on fresh rows, a few times.
409 problem+json names the reason when the order is in the wrong state."""

from __future__ import annotations

from shared.api.http import HttpResult, problem, resolve_id
from shared.core.effects import Transact
from shared.core.rows import STATE_ROW
from shared.core.statemachine import Rejected, bound
from shared.core.statemachine.actions import ACTIONS
from shared.core.workflows import UnknownWorkflow
from shared.observability import telemetry
from shared.runtime import Runtime
from shared.storage.views import read_view

OPERATOR_RACE_RETRIES = 3


def _operate(rt: Runtime, raw_id: str | None, action: str) -> HttpResult:
    order_id = resolve_id(raw_id)
    if isinstance(order_id, HttpResult):
        return order_id
    decide = ACTIONS[action]
    for _ in range(OPERATOR_RACE_RETRIES):
        view = read_view(rt.store, order_id)
        if view.state is None:
            return problem(404, "not-found", "Order not found", f"no order {order_id}")
        with telemetry.order_span(f"operator.{action}", view.traceparent, **{"orders.order_id": order_id}):
            try:
                decision = decide(view, bound(view, rt.ctx()))
            except UnknownWorkflow as exc:
                return problem(409, "workflow-not-deployed", f"Cannot {action} this order",
                               f"{exc}: deploy its workflow file again first", orderId=order_id,
                               processState=view.state.process_state)
            except Rejected as exc:
                return problem(409, "wrong-state", f"Cannot {action} this order", str(exc), orderId=order_id,
                               processState=view.state.process_state)
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


def terminate_order(rt: Runtime, order_id: str | None) -> HttpResult:
    return _operate(rt, order_id, "terminate")


def suspend_order(rt: Runtime, order_id: str | None) -> HttpResult:
    return _operate(rt, order_id, "suspend")


def resume_order(rt: Runtime, order_id: str | None) -> HttpResult:
    return _operate(rt, order_id, "resume")
