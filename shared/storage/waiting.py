"""The rows of the steps waiting on a remote's open breaker (``shared.core.breaker.waiting``):
registered, listed and forgotten through the state table's ``Store`` methods.

No wake-up is lost (``shared.agent.guard.hold``): a step is registered BEFORE the breaker is
read again. Either the closer's listing, which follows its close write, sees the row, or this
second read, which follows the row's write, sees the close and the step goes on at once. Every
write is idempotent: registering again rewrites the row (a new ETag), forgetting a row already gone
is fine. A closer deletes the rows it listed on their ETags, so a step that waits again (a new
opening) while the closer of the last one is still at work keeps its row.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from shared.core.breaker.waiting import MAX_LISTED, WaitingStep, waiting_partition
from shared.core.rows import Op
from shared.core.times import iso
from shared.storage.store import Conflict, Store, transact_or_each


def register_waiting(store: Store, remote: str, step: WaitingStep, now: datetime) -> None:
    """Record that ``step`` waits on ``remote`` (idempotent). A row already there (an earlier wait of
    the same attempt) is written again: its new ETag keeps a closer that listed the old one from
    deleting it (``forget_rows`` deletes what it listed, on its ETag)."""
    row = {"RowKey": step.row_key, "Since": iso(now)}
    for _ in range(3):
        try:
            store.transact(waiting_partition(remote), [Op("create", row)])
            return
        except Conflict:
            pass
        try:
            store.transact(waiting_partition(remote), [Op("replace", row, etag="*")])
            return
        except Conflict:
            pass  # deleted in between (by a closer): create it again


def waiting_rows(store: Store, remote: str, limit: int = MAX_LISTED) -> list[tuple[WaitingStep, str]]:
    """The steps waiting on ``remote``, at most ``limit``, in key order, each with its row's ETag."""
    return [(WaitingStep.from_row_key(key), etag) for key, etag in store.partition_keys(waiting_partition(remote),
                                                                                       limit)]


def waiting_steps(store: Store, remote: str, limit: int = MAX_LISTED) -> list[WaitingStep]:
    """The steps waiting on ``remote``, at most ``limit``, in key order."""
    return [step for step, _etag in waiting_rows(store, remote, limit)]


def forget_waiting(store: Store, remote: str, steps: Sequence[WaitingStep]) -> None:
    """Delete the rows of ``steps`` (resumed, or going on after all); rows already gone are fine."""
    forget_rows(store, remote, [(s.row_key, "*") for s in steps])


def forget_rows(store: Store, remote: str, rows: Sequence[tuple[str, str]]) -> None:
    """Delete these rows (RowKey, ETag: ``*`` for whatever is there) of ``remote``'s waiting list;
    a row already gone, or written again since its ETag was read, is left as it is."""
    partition = waiting_partition(remote)
    deletes = [Op("delete", {"RowKey": key}, etag=etag) for key, etag in sorted(dict(rows).items())]

    def delete_one(op: Op) -> None:
        try:
            store.transact(partition, [op])
        except Conflict:
            pass  # gone, or written again since: left as it is

    transact_or_each(lambda chunk: store.transact(partition, chunk), deletes, delete_one)
