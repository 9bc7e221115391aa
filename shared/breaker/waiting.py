"""The steps waiting on a remote's open breaker: partition ``waiting-{remote}`` of the state table.

One row per waiting step attempt, RowKey ``{orderId}:{attempt:06d}:{step}`` (``Since``). The
instance that closes the breaker lists them and re-dispatches them; nobody else needs to know.

No wake-up is lost (:func:`hold`): a step is registered BEFORE the breaker is read again. Either
the closer's listing, which follows its close write, sees the row, or this second read, which
follows the row's write, sees the close and the step goes on at once. Every write is idempotent:
registering twice is a 409 taken as done, forgetting a row already gone is fine.

Not wired yet: the scheduler's ``waiting`` reply and the resume on close must come with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from shared.breaker.gate import BreakerGate
from shared.breaker.state import BreakerDecision
from shared.effects import iso
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

    @property
    def row_key(self) -> str:
        return f"{self.order_id}:{self.attempt:06d}:{self.step}"

    @classmethod
    def from_row_key(cls, row_key: str) -> WaitingStep:
        order_id, attempt, step = row_key.split(":", 2)
        return cls(order_id, int(attempt), step)


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
