"""A breaker's watch: its row in the deadline index while the Supervisor may owe it anything.

Why: the Supervisor's breaker pass used to read every remote's breaker and list its waiting
steps on every sweep (8 table requests with 4 remotes, forever), although it only has work
after a breaker opened: resending the resumes of a closer that died after its close write, and
waking the oldest waiting step when the probe is overdue. So the breaker is looked at only
while a watch row in ``DeadlineTable`` is due, as an order is (``shared.core.statemachine``, "The
deadline index"); a sweep with nothing due reads nothing else.

The rules that make it enough:

* the instance that opens a breaker puts the watch of that opening (``Opens`` N) BEFORE its open
  write (``shared.storage.breakers.apply``'s ``before_write``): no breaker is open without one. A
  watch put by an open write that then lost or died is a stray; the Supervisor finds the breaker
  closed, lists (nothing) and deletes it. An open write that was only late (SDK retries, a paused
  process) may land after that delete, so once it won the opener puts the opening's second watch
  (:func:`confirming_watch`, another key: a delete of the first can never remove it);
* a step registers as waiting only after reading its breaker open or half-open
  (``shared.agent.guard.hold``), so a step can wait only on an opening that has a watch;
* the Supervisor deletes the watch of opening N only after reading the breaker CLOSED and then
  listing its waiting steps (and resuming them): every step registered before the close is in
  that listing; a step registering later read an opening N+1, whose own watch was put first.
  A closed breaker reopens only as a new opening (``Opens`` + 1); a failed probe reopens the same
  opening, still watched.

RowKey ``breaker:{remote}:{opening:06d}:{due}``: the due instant is in the key, so a moved watch
never shares a key with the row it replaces (put the new one, then delete the old one).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from shared.core.breaker.state import BreakerRow, BreakerState
from shared.core.effects import bucket_of
from shared.core.rows import IndexRow

WATCH_PREFIX = "breaker:"
WAKE_GRACE = timedelta(seconds=5)  # a wake-up overdue by this much is taken as lost
# A probe overdue with no step waiting (nobody uses the remote any more): look again this much later,
# not at every sweep. A step that waits later read a probe's lease; its own wake-up covers it first.
IDLE_RECHECK = timedelta(seconds=60)
_STAMP = "%Y%m%dT%H%M%S%f"


@dataclass(frozen=True)
class Watch:
    """The Supervisor looks at ``remote``'s breaker (opening ``opening``) at ``due``."""

    remote: str
    opening: int
    due: datetime

    @property
    def bucket(self) -> str:
        return bucket_of(self.due)

    @property
    def row_key(self) -> str:
        return f"{WATCH_PREFIX}{self.remote}:{self.opening:06d}:{self.due.strftime(_STAMP)}"

    @property
    def row(self) -> IndexRow:
        """The watch's row in the deadline index (no order id)."""
        return IndexRow(self.bucket, self.row_key, None, self.due)

    @classmethod
    def from_row(cls, row_key: str, due: datetime | None) -> Watch | None:
        """The watch an index row is, or None (an order's row, or a watch row that is malformed)."""
        if not row_key.startswith(WATCH_PREFIX) or due is None:
            return None
        parts = row_key[len(WATCH_PREFIX):].split(":")
        if len(parts) != 3 or not parts[0] or not parts[1].isdigit():
            return None
        return cls(parts[0], int(parts[1]), due)


def opening_watch(opened: BreakerRow, grace: timedelta = WAKE_GRACE) -> Watch:
    """The watch an open write puts first: due when its cool-down's probe would be overdue."""
    assert opened.retry_at is not None
    return Watch(opened.remote, opened.opens, opened.retry_at + grace)


def confirming_watch(opened: BreakerRow, grace: timedelta = WAKE_GRACE) -> Watch:
    """The watch an open write puts once it won: the opening's, due 1 µs after :func:`opening_watch`
    (its own row; the first MOVE puts both at one key)."""
    first = opening_watch(opened, grace)
    return Watch(first.remote, first.opening, first.due + timedelta(microseconds=1))


def probe_overdue(row: BreakerRow, now: datetime, grace: timedelta = WAKE_GRACE) -> bool:
    """An open breaker past its cool-down, or a half-open one past its probe lease, that nobody
    has woken for ``grace``."""
    due = _probe_due(row)
    if due is None or now < due + grace:
        return False
    return row.wake_at is None or row.wake_at < now - grace


def _probe_due(row: BreakerRow) -> datetime | None:
    if row.state is BreakerState.OPEN:
        return row.retry_at
    if row.state is BreakerState.HALF_OPEN:
        return row.probe_until
    return None


class WatchVerdict(StrEnum):
    KEEP = "keep"  # not due yet, or due again at the next sweep
    RESUME_ALL = "resume-all"  # closed: resume every waiting step, then delete the watch
    WAKE = "wake"  # the probe is overdue: resume the oldest waiting step; look again next sweep
    MOVE = "move"  # open or half-open, nothing overdue: look again at ``at``
    DELETE = "delete"  # a newer opening's watch covers the breaker


@dataclass(frozen=True)
class WatchDecision:
    verdict: WatchVerdict
    at: datetime | None = None  # MOVE: the new watch's due


def decide_watch(row: BreakerRow, watch: Watch, now: datetime, grace: timedelta = WAKE_GRACE) -> WatchDecision:
    """What a due watch means, from the breaker row read after the watch was read."""
    if watch.due > now:
        return WatchDecision(WatchVerdict.KEEP)
    if row.state is BreakerState.CLOSED:
        return WatchDecision(WatchVerdict.RESUME_ALL)
    if row.opens > watch.opening:
        return WatchDecision(WatchVerdict.DELETE)
    if probe_overdue(row, now, grace):
        return WatchDecision(WatchVerdict.WAKE)
    due = _probe_due(row)
    candidates = [t + grace for t in (due, row.wake_at) if t is not None]
    at = max(candidates, default=now)
    if at <= now:
        return WatchDecision(WatchVerdict.KEEP)  # a wake-up within ``grace``: the next sweep looks again
    return WatchDecision(WatchVerdict.MOVE, at=at + timedelta(microseconds=1))
