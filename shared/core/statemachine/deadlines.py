"""The deadline index, and the hand-off of an order to "a scheduler, later".

The Supervisor finds overdue orders through the deadline index without reading history:
about one row per order in flight, ``Due`` never later than the order's ``CompleteBy``. Two
rules make one row enough, with no index write on the forward path:

* every write that sets a ``CompleteBy`` at time t sets it at least ``floor`` later, where
  ``floor = min(every step timeout, UnclaimedGraceSeconds)`` (``Config.index_floor``);
* every index row put at time t is due at most ``floor`` later (:func:`cover`).

So a row that exists covers every deadline the order will ever get: a claim, a next step, a
compensation or a redrive sets ``CompleteBy >= now + floor >= Due``. The submission puts the
order's row before its transaction; the last transition (Processed, held, finished) deletes
it, best effort (the state row's ``IndexDue`` names it). When a row falls due and the order
is merely slower than that (``CompleteBy`` still ahead), the sweep moves it: a new row at
``min(CompleteBy, now + floor)``, then the old one deleted. When the deadline has passed, the
Supervisor acts and covers the new deadline the same way. An order whose rows were all
deleted (held, finished) and that an operator retries or cancels gets a new row first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from shared.core.effects import DeleteIndex, Effect, PutIndex, Send, index_row_key, order_bucket
from shared.core.lease import Lease
from shared.core.rows import StateRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.outbox import schedule_message
from shared.core.statemachine.view import View

# A due index row whose order has no state row is kept this long: the submission writes its
# index row just before its transaction.
ORPHAN_INDEX_AGE = timedelta(minutes=5)


def cover(order_id: str, complete_by: datetime, ctx: Ctx, note: str) -> PutIndex:
    """The index row that covers ``complete_by`` and every later deadline of the order."""
    return PutIndex(order_id, min(complete_by, ctx.now + ctx.config.index_floor()), note=note)


def drop_index(state: StateRow) -> list[Effect]:
    """Best-effort delete of the order's index row (the one named by ``IndexDue``), when the
    order has no deadline left. A row the sweep moved meanwhile, or one written before the index's
    shards (another partition), is deleted by the sweep."""
    if state.index_due is None:
        return []
    return [DeleteIndex(order_bucket(state.index_due, state.order_id), index_row_key(state.order_id, state.index_due))]


class IndexVerdict(StrEnum):
    KEEP = "keep"  # not due yet, or an orphan too young to tell
    DELETE = "delete"  # the order has no deadline: finished, held, or never came to exist
    MOVE = "move"  # the order is slower than the row: cover its deadline with a later row
    ACT = "act"  # the deadline has passed: the Supervisor decides
    JOIN = "join"  # the order waits for its customer's room: joined to its waiters (again), then deleted


def index_verdict(state: StateRow | None, due: datetime, now: datetime) -> IndexVerdict:
    """What a due index row means, from a point read of the state row alone."""
    if due > now:
        return IndexVerdict.KEEP
    if state is None:
        return IndexVerdict.DELETE if due < now - ORPHAN_INDEX_AGE else IndexVerdict.KEEP
    if state.waits_for_room:
        return IndexVerdict.JOIN
    if state.complete_by is None or state.lease is None:
        return IndexVerdict.DELETE
    return IndexVerdict.MOVE if state.complete_by > now else IndexVerdict.ACT


@dataclass(frozen=True)
class Handoff:
    """An order released to "a scheduler, later": no claim, lease ``unclaimed``, a new schedule
    message (sequence ``seq``, delayed by ``delay``), and a deadline ``delay + grace`` ahead that
    the index row ``cover`` backs up. If the notice is lost, the row fires and the Supervisor
    sends it again (``decide_expired``, unclaimed)."""

    due: datetime
    seq: int
    at: datetime
    cover: PutIndex | None
    notice: Send

    def apply(self, state: StateRow) -> StateRow:
        """``state`` released to a scheduler: no claim, lease unclaimed, the new deadline."""
        released = replace(state, locked_by=None, claim_token=None, complete_by=self.due, lease=Lease.unclaimed(),
                           schedule_seq=self.seq, updated_at=self.at)
        return released if self.cover is None else replace(released, index_due=self.cover.due)

    @property
    def puts(self) -> list[Effect]:
        return [self.cover] if self.cover is not None else []


def hand_off(view: View, ctx: Ctx, *, note: str, delay: timedelta = timedelta(0), needs_cover: bool = True) -> Handoff:
    """Release the claim, bump ScheduleSeq, set the deadline to now + delay + grace and cover
    it (unless ``needs_cover`` is false: the order's existing row already covers it)."""
    state = view.state
    assert state is not None
    due = ctx.now + delay + ctx.config.grace
    seq = state.schedule_seq + 1
    row = cover(view.order_id, due, ctx, note=note) if needs_cover else None
    priority = view.order.priority if view.order is not None else None
    notice = Send(schedule_message(view.order_id, seq, ctx, view.traceparent, not_before=ctx.now + delay,
                                   priority=priority),
                  critical=False, what=f"schedule ({note})")
    return Handoff(due, seq, ctx.now, row, notice)
