"""The order workflow as DBOS Transact writes it: three durable steps, compensated in reverse.

reserve-inventory → charge-payment → create-shipment against the remotes simulator, with the
idempotency keys our agents send (``ORDERID:STEP``; compensations ``ORDERID:STEP:compensate``
with ``compensates`` naming the undone key: docs/contracts.md, "Agent messages").

* A 200 is the step's result, recorded by DBOS before the workflow goes on.
* A 422 or 409 is a permanent rejection: nothing was applied, so the done steps are undone,
  latest first (release, refund), and the order ends ``compensated``.
* A 503/429, a reset or a timeout is transient: DBOS retries the step (same key, so the remote
  applies it at most once). Retries exhausted = outcome unknown: like our scheduler after its
  failure count, the failed step is compensated too (by key: nothing applied → a tombstone);
  a shipment (the pivot, no undo) that never answers is held instead.
* After a crash DBOS re-runs the workflow: recorded steps return their recorded results, the
  step in flight runs again with the same key, and the remote replays its stored answer.

Status events (``failed``, ``compensated``, ``processed``) are POSTed to the runner's listener
from the workflow body, not from a step: a workflow re-run after a crash sends them again
(at least once, the listener keeps the first), and they cost no write to the system database.
"""

from __future__ import annotations

import json
from typing import Any

from dbos import DBOS
from dbos._error import DBOSMaxStepRetriesExceeded

from bench.peer_dbos import remote

# (step, service, operation, compensation or None)
STEPS: tuple[tuple[str, str, str, str | None], ...] = (
    ("reserve-inventory", "inventory", "reserve", "release"),
    ("charge-payment", "payment", "charge", "refund"),
    ("create-shipment", "shipping", "ship", None),
)
PIVOT = "create-shipment"  # cannot be undone: a shipment that never answers is held


@DBOS.step(retries_allowed=True, max_attempts=5, interval_seconds=0.2, backoff_rate=2.0)
def call_step(service: str, operation: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    """One forward call, retried for ~3 s. Returns ``{"outcome": "success", "result": …}`` or ``{"outcome": "error",
    "reason": …}`` (a permanent rejection); raises remote.Transient, which DBOS retries."""
    return remote.call(service, operation, key, body)


@DBOS.step(retries_allowed=True, max_attempts=10, interval_seconds=0.5, backoff_rate=1.5)
def call_compensation(service: str, operation: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    """One compensation call: retried longer than a forward step (an undo must land): ~37 s."""
    return remote.call(service, operation, key, body)


def _compensate(order_id: str, order: dict[str, Any], to_undo: list[tuple[str, str, str, Any]]) -> list[
        dict[str, Any]]:
    """Undo ``to_undo`` (step, service, compensation, result or None), latest first."""
    summary = []
    for step, service, operation, result in reversed(to_undo):
        forward_key = f"{order_id}:{step}"
        body = {"orderId": order_id, "order": order, "context": {step: result} if result is not None else {},
                "compensates": {"step": step, "idempotencyKey": forward_key}}
        try:
            reply = call_compensation(service, operation, f"{forward_key}:compensate", body)
        except DBOSMaxStepRetriesExceeded as e:
            reply = {"outcome": "error", "reason": f"retries exhausted: {e}"}
        summary.append({"step": step, "operation": operation, **reply})
    return summary


@DBOS.workflow()
def order_workflow(order_id: str, order: dict[str, Any]) -> dict[str, Any]:
    """Run the three steps; on a failure undo the done ones. Returns the order's outcome."""
    context: dict[str, Any] = {}
    done: list[tuple[str, str, str, Any]] = []  # compensable steps done: (step, service, undo, result)
    for step, service, operation, undo in STEPS:
        body = {"orderId": order_id, "order": order, "context": dict(context)}
        try:
            reply = call_step(service, operation, f"{order_id}:{step}", body)
        except DBOSMaxStepRetriesExceeded as e:
            reason = f"{step}: no answer ({e})"
            if step == PIVOT:
                notify(order_id, "failed", step=step, reason=reason + "; held")
                return {"outcome": "held", "step": step, "reason": reason, "context": context}
            if undo is not None:
                done.append((step, service, undo, None))  # outcome unknown: undo by key
            return _fail(order_id, order, step, reason, done, context)
        if reply["outcome"] != "success":
            return _fail(order_id, order, step, f"{step}: {reply.get('reason')}", done, context)
        context[step] = reply["result"]
        if undo is not None:
            done.append((step, service, undo, reply["result"]))
    notify(order_id, "processed")
    return {"outcome": "processed", "context": context}


def _fail(order_id: str, order: dict[str, Any], step: str, reason: str,
          done: list[tuple[str, str, str, Any]], context: dict[str, Any]) -> dict[str, Any]:
    notify(order_id, "failed", step=step, reason=reason)
    summary = _compensate(order_id, order, done)
    ok = all(c["outcome"] == "success" for c in summary)
    notify(order_id, "compensated", outcome="compensated" if ok else "compensation-failed")
    return {"outcome": "compensated" if ok else "compensation-failed", "step": step, "reason": reason,
            "context": context, "compensations": summary}


def notify(order_id: str, event: str, step: str | None = None, **extra: Any) -> None:
    """POST a status event to the runner's listener, if one is set; never fails the workflow."""
    body: dict[str, Any] = {"orderId": order_id, "event": event, **extra}
    if step:
        body["step"] = step
    remote.post_status(json.dumps(body).encode())
