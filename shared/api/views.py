"""An order as ``GET /api/orders/{id}`` shows it: its workflow, state, steps and compensation progress."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from shared.core.breaker.state import BreakerRow, BreakerState
from shared.core.statemachine import CompensationState, Mode, OrderCompensation, StepRow, View, category_of
from shared.core.states import StepState
from shared.core.times import iso
from shared.core.workflows import Step

WAITING = "Waiting"  # a step's (or compensation's) state as shown while it waits on a breaker


def room_wait(customer_id: str | None, since: datetime | None) -> dict[str, Any]:
    """An order accepted over its customer's ``CustomerMaxInFlight``, waiting for one of that
    customer's orders to end (the order's and a search result's ``waitingFor``)."""
    return {"kind": "customer", "customerId": customer_id, "since": _time(since)}


def _time(value: datetime | None) -> str | None:
    return iso(value) if value is not None else None


def next_probe(breaker: BreakerRow | None) -> dict[str, Any]:
    """What a step waiting on ``breaker``'s remote can expect: the breaker's state and when it is
    next probed (``nextProbeAt``: the end of its cool-down; None while a probe is out, or closed)."""
    if breaker is None:
        return {"breaker": None, "nextProbeAt": None}
    at = breaker.retry_at if breaker.state is BreakerState.OPEN else None
    return {"breaker": breaker.state.value, "nextProbeAt": _time(at)}


def _waiting(step: StepRow, breakers: Mapping[str, BreakerRow]) -> dict[str, Any] | None:
    """The wait of the step's attempt in flight (or its compensation's) on a remote, or None.
    ``for``: ``breaker`` (its open breaker; ``nextProbeAt``) or ``rate`` (its rate limit: the slot
    reserved for it, ``wakeAt``, when the scheduler sends the call again)."""
    if step.waiting_on is None:
        return None
    return {"remote": step.waiting_on, "since": _time(step.waiting_since),
            "for": "rate" if step.wake_at is not None else "breaker", "wakeAt": _time(step.wake_at),
            **next_probe(breakers.get(step.waiting_on))}


def _kind_view(step: StepRow, spec: Step | None, created_at: datetime) -> dict[str, Any]:
    """A step's kind, and what a wait or a delay waits for: the event (and when it came, if it
    did), or the time the delay ends."""
    if spec is None or spec.kind == "call":
        # a branch of a parallel step names its group (its lane on the console's timeline)
        return {"kind": "call", "group": spec.group if spec is not None else None}
    if spec.kind == "wait":
        return {"kind": "wait", "event": {"name": spec.event, "decision": spec.decision,
                                          "receivedAt": _time(step.event_at), "body": step.event_body}}
    due = spec.due(step.started_at, created_at) if step.started_at is not None else None
    return {"kind": "delay", "dueAt": _time(due)}


def _awaiting(view: View, spec_of: Mapping[str, Step]) -> dict[str, Any] | None:
    """The wait or the delay the order's step in flight is: what it waits for, until when."""
    state, order = view.state, view.order
    assert state is not None and order is not None
    if state.mode is not Mode.FORWARD or state.lease is None or state.lease.is_unclaimed:
        return None
    step, spec = view.step(state.lease.step), spec_of.get(state.lease.step)
    if step is None or spec is None or spec.kind == "call" or step.state is not StepState.RUNNING:
        return None
    if spec.kind == "wait":
        return {"step": step.name, "kind": "event", "event": spec.event, "decision": spec.decision,
                "until": _time(step.complete_by), "onTimeout": spec.on_timeout}
    due = spec.due(step.started_at, order.created_at) if step.started_at is not None else step.complete_by
    return {"step": step.name, "kind": "timer", "event": None, "until": _time(due)}


def _step_view(step: StepRow, breakers: Mapping[str, BreakerRow]) -> dict[str, Any]:
    compensating = step.compensation is CompensationState.RUNNING
    waiting = _waiting(step, breakers) if compensating or step.state is StepState.RUNNING else None
    compensation = None
    if step.compensation is not CompensationState.NONE:
        compensation = {"state": WAITING if compensating and waiting else step.compensation,
                        "attempt": step.compensation_attempt,
                        "startedAt": _time(step.compensation_started_at),
                        "finishedAt": _time(step.compensation_finished_at),
                        "completeBy": _time(step.compensation_complete_by), "result": step.compensation_result,
                        "reason": step.compensation_reason}
    state = WAITING if waiting and not compensating else step.state
    return {"name": step.name, "state": state, "attempt": step.attempt, "startedAt": _time(step.started_at),
            "finishedAt": _time(step.finished_at), "completeBy": _time(step.complete_by), "result": step.result,
            "failureReason": step.failure_reason, "compensation": compensation,
            # its last attempt ended without an answer (timed out, stopped by a terminate or by its
            # parallel step's failure): its call may have been applied, and is compensated by its key
            "outcomeUnknown": step.outcome_unknown,
            # the attempt in flight (or its compensation) waits on this remote's open circuit breaker:
            # no call, no failure, until the breaker closes or BreakerMaxWaitSeconds
            "waiting": waiting, "waitingOn": waiting["remote"] if waiting else None,
            "waitingSince": waiting["since"] if waiting else None}


def waiting_remote(view: View) -> str | None:
    """The remote whose breaker the order's step in flight waits on, if it waits."""
    state = view.state
    if state is None or state.lease is None or state.lease.is_unclaimed:
        return None
    step = view.step(state.lease.step)
    return step.waiting_on if step is not None else None


def order_view(view: View, breakers: Mapping[str, BreakerRow] | None = None,
               workflow: Sequence[Step] | None = None) -> dict[str, Any]:
    """The order as ``GET /api/orders/{id}`` shows it. ``breakers``: the breaker of the remote
    its step in flight waits on (``waiting_remote``), for the time of its next probe.
    ``workflow``: the order's steps (None if it is not deployed: every step shown as a call)."""
    state, order = view.state, view.order
    assert state is not None and order is not None
    spec_of = {s.name: s for s in workflow} if workflow is not None else {}
    steps = [_step_view(s, breakers or {}) | _kind_view(s, spec_of.get(s.name), order.created_at)
             for s in view.steps]
    remote = waiting_remote(view)
    current = next((s for s in steps if remote is not None and s["waiting"] is not None
                    and state.lease is not None and s["name"] == state.lease.step), None)
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
        # an operator suspended it: it dispatches no new step until resumed (shared.core.statemachine.suspend)
        "suspended": state.suspended and state.mode is Mode.FORWARD,
        "category": category_of(state),
        "generation": state.generation,
        "workflow": {"name": order.workflow, "version": order.workflow_version},
        # the W3C trace id of the order's telemetry: its operation id in Application Insights
        "traceId": view.trace_id,
        "createdAt": _time(order.created_at),
        "updatedAt": _time(state.updated_at),
        "order": {"customerId": order.customer_id, "currency": order.currency, "items": order.items,
                  "total": order.total, "priority": order.priority, "statusQueue": order.status_queue},
        # the step in flight waits on a remote's open breaker (its step's ``waiting``, and its name)
        "waiting": {"step": current["name"], **current["waiting"]} if current else None,
        # the step in flight is a wait for an event, or a delay's timer: what it waits for, until when
        "awaiting": _awaiting(view, spec_of),
        # accepted over its customer's CustomerMaxInFlight: it starts when a slot frees, in submission order
        "waitingFor": room_wait(order.customer_id, order.created_at) if state.waits_for_room else None,
        "steps": steps,
        "compensation": {
            "state": state.compensation_state or OrderCompensation.NONE,
            "total": len(compensations),
            "done": compensations.count(CompensationState.DONE),
            "failed": compensations.count(CompensationState.FAILED),
            "pending": sum(1 for c in compensations if c in (CompensationState.PENDING, CompensationState.RUNNING)),
        },
    }
