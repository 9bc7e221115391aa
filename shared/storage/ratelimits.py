"""The rate limiters' rows in the state table: partition ``ratelimits``, RowKey = the agent's name
(``shared.core.ratelimit``). Like the breakers' (``shared.storage.breakers``): read, decide, write
on the ETag read, and on a lost race read and decide again.

:func:`apply` may start from a row the caller kept from its own last write (``known``, with the
ETag that write returned): then a call costs ONE table request (the conditional write) while no
other instance wrote in between, and two more (a read and a write) per race it loses.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.core.ratelimit.bucket import RATE_PARTITION, RateDecision, RateRow
from shared.core.rows import Op
from shared.storage.store import Conflict, Store

MAX_ROUNDS = 20  # read-decide-write rounds before giving up (each lost round: another instance took a slot;
# an instance that wrote last writes without a read, so a loser may lose several rounds in a row)


class RateBusy(RuntimeError):
    """Every round lost its race: the caller calls as if there were no limit this time."""


def read_rate(store: Store, remote: str) -> RateRow:
    """The remote's limiter as stored (nothing taken if it was never written)."""
    return RateRow.from_props(remote, store.read_row(RATE_PARTITION, remote))


def write_rate(store: Store, row: RateRow) -> RateRow:
    """Create (no ETag yet) or replace it on the ETag it was decided on; ``Conflict`` if it moved.
    Returns the row as written, with its new ETag (None if the service returned none)."""
    op = Op("create", row.to_props()) if row.etag is None else Op("replace", row.to_props(), etag=row.etag)
    etags = store.transact(RATE_PARTITION, [op])
    return RateRow(row.remote, row.tat, row.paused_until, row.throttled, etags.get(row.remote))


def apply(store: Store, remote: str, decide: Callable[[RateRow], RateDecision], known: RateRow | None = None,
          rounds: int = MAX_ROUNDS) -> tuple[RateDecision, RateRow | None]:
    """Decide on ``known`` (if given, with an ETag) or on the row read, write what was decided,
    again on a lost race. Returns the decision whose write won (or that wrote nothing) and the row
    as it now is (to pass as ``known`` next time; None: read it next time)."""
    row = known if known is not None and known.etag is not None else None
    for _ in range(rounds):
        if row is None:
            row = read_rate(store, remote)
        decision = decide(row)
        if decision.row is None:
            return decision, row
        try:
            return decision, write_rate(store, decision.row)
        except Conflict:
            row = None  # another instance took a slot: read it again
    raise RateBusy(f"rate limiter {remote}: {rounds} writes lost their race")
