"""An order as ``GET /api/orders/{id}`` shows it: its workflow, state, steps and compensation progress."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shared.core.statemachine import CompensationState, Mode, OrderCompensation, StepRow, View, category_of
from shared.core.times import iso


def _time(value: datetime | None) -> str | None:
    return iso(value) if value is not None else None


def _step_view(step: StepRow) -> dict[str, Any]:
    compensation = None
    if step.compensation is not CompensationState.NONE:
        compensation = {"state": step.compensation, "attempt": step.compensation_attempt,
                        "startedAt": _time(step.compensation_started_at),
                        "finishedAt": _time(step.compensation_finished_at),
                        "completeBy": _time(step.compensation_complete_by), "result": step.compensation_result,
                        "reason": step.compensation_reason}
    return {"name": step.name, "state": step.state, "attempt": step.attempt, "startedAt": _time(step.started_at),
            "finishedAt": _time(step.finished_at), "completeBy": _time(step.complete_by), "result": step.result,
            "failureReason": step.failure_reason, "compensation": compensation,
            # the attempt in flight waits on this remote's open circuit breaker (no call, no failure)
            "waitingOn": step.waiting_on, "waitingSince": _time(step.waiting_since)}


def order_view(view: View) -> dict[str, Any]:
    """The order as ``GET /api/orders/{id}`` shows it."""
    state, order = view.state, view.order
    assert state is not None and order is not None
    steps = [_step_view(s) for s in view.steps]
    compensations = [s.compensation for s in view.steps if s.compensation is not CompensationState.NONE]
    return {
        "orderId": state.order_id,
        "processState": state.process_state,
        "failureCount": state.failure_count,
        "outcome": state.outcome,
        "reason": state.reason,
        "failedStep": state.failed_step,
        "lockedBy": state.locked_by,
        "completeBy": _time(state.complete_by),
        "currentStep": state.step_name if state.mode is Mode.FORWARD else None,
        "category": category_of(state),
        "generation": state.generation,
        "workflow": {"name": order.workflow, "version": order.workflow_version},
        "createdAt": _time(order.created_at),
        "updatedAt": _time(state.updated_at),
        "order": {"customerId": order.customer_id, "currency": order.currency, "items": order.items,
                  "total": order.total, "priority": order.priority, "statusQueue": order.status_queue},
        "steps": steps,
        "compensation": {
            "state": state.compensation_state or OrderCompensation.NONE,
            "total": len(compensations),
            "done": compensations.count(CompensationState.DONE),
            "failed": compensations.count(CompensationState.FAILED),
            "pending": sum(1 for c in compensations if c in (CompensationState.PENDING, CompensationState.RUNNING)),
        },
    }
