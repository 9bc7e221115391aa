"""The rows of the steps waiting on a remote's open breaker (``shared.core.breaker.waiting``):
registered, listed and forgotten through the state table's ``Store`` methods.

No wake-up is lost (``shared.agent.guard.hold``): a step is registered BEFORE the breaker is
read again. Either the closer's listing, which follows its close write, sees the row, or this
second read, which follows the row's write, sees the close and the step goes on at once. Every
write is idempotent: registering twice is a 409 taken as done, forgetting a row already gone is fine.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from shared.core.breaker.waiting import MAX_LISTED, WaitingStep, waiting_partition
from shared.core.rows import Op
from shared.core.times import iso
from shared.storage.store import MAX_BATCH_OPS, Conflict, Store


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
    forget_rows(store, remote, [s.row_key for s in steps])


def forget_rows(store: Store, remote: str, row_keys: Sequence[str]) -> None:
    """Delete these rows of ``remote``'s waiting list; rows already gone are fine."""
    partition = waiting_partition(remote)
    keys = sorted(set(row_keys))
    for i in range(0, len(keys), MAX_BATCH_OPS):
        chunk = keys[i:i + MAX_BATCH_OPS]
        try:
            store.transact(partition, [Op("delete", {"RowKey": k}, etag="*") for k in chunk])
        except Conflict:  # one of them was gone: the others one by one
            if len(chunk) == 1:
                continue
            for key in chunk:
                try:
                    store.transact(partition, [Op("delete", {"RowKey": key}, etag="*")])
                except Conflict:
                    pass
