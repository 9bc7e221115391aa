"""The steps waiting on a remote's open breaker: partition ``waiting-{remote}`` of the state table.

One row per waiting step attempt, RowKey ``{orderId}:{attempt:06d}:{step}`` (a compensation's:
``...:{step}:compensation``), property ``Since``. The instance that closes the breaker lists them
and sends each a ``resume`` message on the SchedulerQueue (:func:`resume_waiting`), which
re-dispatches the step if it still waits on that attempt (``shared.statemachine.waiting``).

No wake-up is lost (:func:`hold`): a step is registered BEFORE the breaker is read again. Either
the closer's listing, which follows its close write, sees the row, or this second read, which
follows the row's write, sees the close and the step goes on at once. Every write is idempotent:
registering twice is a 409 taken as done, forgetting a row already gone is fine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from shared.breaker.gate import BreakerGate
from shared.breaker.state import BreakerDecision
from shared.effects import iso
from shared.logs import log_event
from shared.messaging import Bus, OutMessage
from shared.store import MAX_BATCH_OPS, Conflict, Op, Store

WAITING_PREFIX = "waiting-"
MAX_LISTED = 5000  # rows the closer lists per pass (the rest: the next pass, see the design)


def waiting_partition(remote: str) -> str:
    return f"{WAITING_PREFIX}{remote}"


@dataclass(frozen=True, order=True)
class WaitingStep:
    """A step attempt waiting on a breaker: what a resume names."""

    order_id: str
    attempt: int
    step: str
    kind: Literal["step", "compensation"] = "step"

    @property
    def row_key(self) -> str:
        key = f"{self.order_id}:{self.attempt:06d}:{self.step}"
        return key if self.kind == "step" else f"{key}:compensation"

    @classmethod
    def from_row_key(cls, row_key: str) -> WaitingStep:
        order_id, attempt, step, *rest = row_key.split(":", 3)
        return cls(order_id, int(attempt), step, "compensation" if rest else "step")


def resume_message(step: WaitingStep, queue: str, *, not_before: datetime | None = None,
                   tag: str = "") -> OutMessage:
    """The SchedulerQueue message that re-dispatches ``step`` if it still waits on that attempt.
    Its id names the attempt (and ``tag``, e.g. a wake): duplicates are dropped."""
    message_id = f"resume:{step.row_key}" + (f":{tag}" if tag else "")
    body = {"kind": "resume", "orderId": step.order_id, "step": step.step, "attempt": step.attempt,
            "for": step.kind}
    return OutMessage(queue=queue, body=body, message_id=message_id, correlation_id=step.order_id,
                      subject="resume", scheduled_enqueue_time=not_before,
                      application_properties={"kind": "resume"})


def resume_waiting(store: Store, bus: Bus, queue: str, remote: str, limit: int = MAX_LISTED) -> int:
    """Send a resume for every step waiting on ``remote``, then forget them: how many were sent.
    A crash in between leaves rows behind: the Supervisor sends them again (same message ids)."""
    steps = waiting_steps(store, remote, limit)
    for step in steps:
        bus.send(resume_message(step, queue))
    forget_waiting(store, remote, steps)
    if steps:
        log_event(logging.INFO, "breaker.resumed", remote=remote, steps=len(steps))
    return len(steps)


def register_waiting(store: Store, remote: str, step: WaitingStep, now: datetime) -> None:
    """Record that ``step`` waits on ``remote`` (idempotent)."""
    try:
        store.transact(waiting_partition(remote), [Op("create", {"RowKey": step.row_key, "Since": iso(now)})])
    except Conflict:
        pass  # registered already: a redelivered request, or the same attempt again


def waiting_steps(store: Store, remote: str, limit: int = MAX_LISTED) -> list[WaitingStep]:
    """The steps waiting on ``remote``, at most ``limit``, in key order."""
    return [WaitingStep.from_row_key(key) for key, _etag in store.partition_keys(waiting_partition(remote), limit)]


def forget_waiting(store: Store, remote: str, steps: Sequence[WaitingStep]) -> None:
    """Delete the rows of ``steps`` (resumed, or going on after all); rows already gone are fine."""
    partition = waiting_partition(remote)
    keys = sorted({s.row_key for s in steps})
    for i in range(0, len(keys), MAX_BATCH_OPS):
        chunk = keys[i:i + MAX_BATCH_OPS]
        try:
            store.transact(partition, [Op("delete", {"RowKey": k}, etag="*") for k in chunk])
        except Conflict:  # one of them was gone: one by one
            for key in chunk:
                try:
                    store.transact(partition, [Op("delete", {"RowKey": key}, etag="*")])
                except Conflict:
                    pass


def hold(gate: BreakerGate, store: Store, step: WaitingStep) -> BreakerDecision:
    """Admit ``step``'s call, or register it as waiting: register, then read the breaker again.

    Returns the decision to act on: ``call``/``probe`` (not registered: the row, if written, is
    removed again) or ``wait`` (registered; the closer will resume it)."""
    first = gate.admit()
    if first.admission != "wait":
        return first
    register_waiting(store, gate.remote, step, gate.now())
    second = gate.admit()
    if second.admission != "wait":
        forget_waiting(store, gate.remote, [step])
    return second
