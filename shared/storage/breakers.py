"""The breakers' rows in the state table: partition ``breakers``, RowKey = the agent's name.

Order partitions are 32 hex characters and every query of the state table names its partition,
so this partition meets no order. Reads and writes go through the ``Store`` protocol's
``read_row`` / ``transact`` (ETag-conditioned; ``create`` of a row another instance created
first is a ``Conflict`` too): :func:`apply` reads, decides, writes, and on a lost race reads and
decides again, so that racing instances open a breaker once and take one probe lease. :func:`read_breakers`
reads every breaker at once (``read_rows``: one query of the partition).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from shared.core.breaker.state import BreakerDecision, BreakerRow
from shared.core.rows import Op
from shared.storage.store import Conflict, Store

BREAKER_PARTITION = "breakers"
MAX_BREAKERS = 1000  # rows one query of the partition returns (one page; there is one per agent)
MAX_ROUNDS = 5  # read-decide-write rounds before giving up (each lost round means another instance moved it)


class BreakerBusy(RuntimeError):
    """Every round lost its race: the caller treats the breaker as unknown this time."""


def read_breaker(store: Store, remote: str) -> BreakerRow:
    """The remote's breaker as stored (closed if it was never written)."""
    return BreakerRow.from_props(remote, store.read_row(BREAKER_PARTITION, remote))


def read_breakers(store: Store, remotes: Iterable[str]) -> dict[str, BreakerRow]:
    """Each of ``remotes``' breakers as stored (closed if never written), with its ETag: ONE query
    of the partition (``shared.agent.board``). Were the partition ever cut at ``MAX_BREAKERS``
    rows, a remote it did not return would be left out (unknown), never taken for closed."""
    stored = store.read_rows(BREAKER_PARTITION, MAX_BREAKERS)
    complete = len(stored) < MAX_BREAKERS
    return {remote: BreakerRow.from_props(remote, stored.get(remote)) for remote in remotes
            if complete or remote in stored}


def write_breaker(store: Store, row: BreakerRow) -> None:
    """Create (no ETag yet) or replace it on the ETag it was decided on; ``Conflict`` if it moved."""
    if row.etag is None:
        op = Op("create", row.to_props())
    else:
        op = Op("replace", row.to_props(), etag=row.etag)
    store.transact(BREAKER_PARTITION, [op])


def apply(store: Store, remote: str, decide: Callable[[BreakerRow], BreakerDecision],
          rounds: int = MAX_ROUNDS,
          before_write: Callable[[BreakerDecision], None] | None = None) -> BreakerDecision:
    """Read the row, ``decide`` on it and write what it decided, again on a lost race. The decision
    returned is the one whose write won (or that wrote nothing): only its effects may run.
    ``before_write`` runs before each write (an error in it: nothing is written, it propagates)."""
    for _ in range(rounds):
        row = read_breaker(store, remote)
        decision = decide(row)
        if decision.row is None:
            return decision
        if before_write is not None:
            before_write(decision)
        try:
            write_breaker(store, decision.row)
        except Conflict:
            continue
        return decision
    raise BreakerBusy(f"breaker {remote}: {rounds} writes lost their race")
