"""The order workflow as Temporal writes it: three activities, compensated in reverse.

The same saga as bench/peer_dbos/workflow.py, with the same idempotency keys and bodies
(``ORDERID:STEP``; compensations ``ORDERID:STEP:compensate`` naming the undone key):

* an activity's ``{"outcome": "success"}`` is the step's result, recorded in the workflow's history;
* ``{"outcome": "error"}`` (a 422/409) is a permanent rejection: the done steps are undone, latest
  first, and the order ends ``compensated``;
* a transient failure (503/429, a reset, a timeout) raises in the activity: Temporal retries it
  with the same key (same schedule as DBOS's: 5 attempts from 0.2 s, doubling). Retries exhausted =
  outcome unknown: the failed step is compensated too (by key), except the pivot (create-shipment,
  no undo), which is held;
* after a worker crash the server re-dispatches the activity once its attempt timed out
  (``ATTEMPT_TIMEOUT``), on whichever worker polls; the remote replays its stored answer.

Status events go through a local activity (run in the worker, recorded as a marker in the
workflow task: no extra task round trip through the server), at least once, like DBOS's.

Deterministic: no I/O and no clock here (activities by name; the sandbox imports only this).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

TASK_QUEUE = "peer-order"
WORKFLOW = "order"
# (step, service, operation, compensation or None)
STEPS: tuple[tuple[str, str, str, str | None], ...] = (
    ("reserve-inventory", "inventory", "reserve", "release"),
    ("charge-payment", "payment", "charge", "refund"),
    ("create-shipment", "shipping", "ship", None),
)
PIVOT = "create-shipment"  # cannot be undone: a shipment that never answers is held
# the remote call's own timeout is 10 s (bench/peer_dbos/remote.py): an attempt gets a little more.
# It is also how long a step in flight on a killed worker waits before it runs again elsewhere.
ATTEMPT_TIMEOUT = timedelta(seconds=12)
FORWARD_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.2), backoff_coefficient=2.0, maximum_attempts=5)
UNDO_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.5), backoff_coefficient=1.5, maximum_attempts=10)
NOTIFY_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.2), maximum_attempts=3)


@workflow.defn(name=WORKFLOW)
class OrderWorkflow:
    @workflow.run
    async def run(self, order_id: str, order: dict[str, Any]) -> dict[str, Any]:
        context: dict[str, Any] = {}
        done: list[tuple[str, str, str, Any]] = []  # compensable steps done: (step, service, undo, result)
        for step, service, operation, undo in STEPS:
            body = {"orderId": order_id, "order": order, "context": dict(context)}
            try:
                reply = await workflow.execute_activity(
                    "call_step", args=[service, operation, f"{order_id}:{step}", body],
                    start_to_close_timeout=ATTEMPT_TIMEOUT, retry_policy=FORWARD_RETRY)
            except ActivityError as e:
                reason = f"{step}: no answer ({e.cause or e})"
                if step == PIVOT:
                    await notify(order_id, "failed", step=step, reason=reason + "; held")
                    return {"outcome": "held", "step": step, "reason": reason, "context": context}
                if undo is not None:
                    done.append((step, service, undo, None))  # outcome unknown: undo by key
                return await self._fail(order_id, order, step, reason, done, context)
            if reply["outcome"] != "success":
                return await self._fail(order_id, order, step, f"{step}: {reply.get('reason')}", done, context)
            context[step] = reply["result"]
            if undo is not None:
                done.append((step, service, undo, reply["result"]))
        await notify(order_id, "processed")
        return {"outcome": "processed", "context": context}

    async def _fail(self, order_id: str, order: dict[str, Any], step: str, reason: str,
                    done: list[tuple[str, str, str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        await notify(order_id, "failed", step=step, reason=reason)
        summary = []
        for done_step, service, operation, result in reversed(done):
            forward_key = f"{order_id}:{done_step}"
            body = {"orderId": order_id, "order": order, "context": {done_step: result} if result is not None else {},
                    "compensates": {"step": done_step, "idempotencyKey": forward_key}}
            try:
                reply = await workflow.execute_activity(
                    "call_compensation", args=[service, operation, f"{forward_key}:compensate", body],
                    start_to_close_timeout=ATTEMPT_TIMEOUT, retry_policy=UNDO_RETRY)
            except ActivityError as e:
                reply = {"outcome": "error", "reason": f"retries exhausted: {e.cause or e}"}
            summary.append({"step": done_step, "operation": operation, **reply})
        ok = all(c["outcome"] == "success" for c in summary)
        await notify(order_id, "compensated", outcome="compensated" if ok else "compensation-failed")
        return {"outcome": "compensated" if ok else "compensation-failed", "step": step, "reason": reason,
                "context": context, "compensations": summary}


async def notify(order_id: str, event: str, step: str | None = None, **extra: Any) -> None:
    """A status event to the runner's listener, by a local activity; never fails the workflow."""
    body: dict[str, Any] = {"orderId": order_id, "event": event, **extra}
    if step:
        body["step"] = step
    try:
        await workflow.execute_local_activity("notify", body, start_to_close_timeout=timedelta(seconds=10),
                                              retry_policy=NOTIFY_RETRY)
    except ActivityError:
        pass
