"""A remote's rate limiter row, shared by every instance, and the pure decisions on it (the
package's docstring has the design)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from shared.core.rows import ETAG, Entity
from shared.core.times import iso, parse_iso
from shared.core.workflows.ratelimits import RateLimit

RATE_PARTITION = "ratelimits"
DEFAULT_HOLD = timedelta(seconds=1)  # a slot this close is waited for in the agent (a sleep), not on the bus
# A step waiting for a reserved slot is woken this much before it: the request sent again then
# arrives before its slot whatever the bus's delay (up to this much), and the agent sleeps until
# the slot itself, so that the calls keep their spacing instead of their messages' jitter.
WAKE_LEAD = timedelta(seconds=1.5)
# A reserved slot is kept only by a call that comes at most this late for it; a later call (its
# request sent again reached the agent after the slot: a slow bus or a busy host) takes a new one.
# Any N+1 calls in a row span N intervals, MARGIN (5%) more than one second: 50 ms of slack for a
# remote counting in a sliding second, whatever the rate. Calls made late in their slots, in a bunch,
# spend it: measured, 8 of 158 charges answered 429 in a burst of 150 on a loaded machine
# (tests/e2e/test_rate_limit.py), in runs of calls a few ms apart, each one a late reserved call.
SLOT_LATENESS = timedelta(milliseconds=20)
_PROBE_TAG = re.compile(r":probe-(\d{8}T\d{12})$")


@dataclass(frozen=True)
class RateRow:
    """A remote's rate limiter as stored (a missing row: nothing taken yet)."""

    remote: str
    tat: datetime | None = None  # the theoretical arrival time of the next call
    paused_until: datetime | None = None  # a 429's Retry-After, honoured by every instance
    throttled: int = 0  # 429s counted (for the overview and the logs)
    etag: str | None = None

    @classmethod
    def from_props(cls, remote: str, props: Entity | None) -> RateRow:
        if not props:
            return cls(remote)
        return cls(remote, _time(props.get("Tat")), _time(props.get("PausedUntil")),
                   int(props.get("Throttled") or 0), props.get(ETAG))

    def to_props(self) -> dict[str, Any]:
        return {"PartitionKey": RATE_PARTITION, "RowKey": self.remote,
                "Tat": iso(self.tat) if self.tat else None,
                "PausedUntil": iso(self.paused_until) if self.paused_until else None,
                "Throttled": self.throttled}


Admission = Literal["call", "sleep", "wait"]


@dataclass(frozen=True)
class RateDecision:
    """``admission``: ``call`` now, ``sleep`` until ``slot`` then call, ``wait`` (reply ``waiting``
    until ``slot``, which is reserved). ``row``: what to write first (None: nothing)."""

    verdict: str
    admission: Admission = "call"
    slot: datetime | None = None
    row: RateRow | None = None


def decide_take(row: RateRow, now: datetime, limit: RateLimit, *, hold: timedelta = DEFAULT_HOLD,
                time_left: timedelta | None = None) -> RateDecision:
    """Take the next free slot for one call (module docstring). Every admission writes the row.

    Effects, each after the write won:
    * ``call``: crash before the call -> the slot is spent unused (the rate is only undershot);
      the request is redelivered and takes a new slot.
    * ``sleep``: the same, after the sleep.
    * ``wait``: the agent replies ``waiting`` (until = :func:`wake_time` of the slot, claiming the
      wake-up). A crash before the reply: the request is redelivered and takes another slot (the
      reserved one goes unused); after it: the scheduler records the wait (a copy of the reply is
      a duplicate, its wake-up has the same message id and is dropped) and sends the request
      again at the wake time; the agent sleeps from its arrival until the slot.
    """
    paused = row.paused_until if row.paused_until and row.paused_until > now else now
    base = max(row.tat or now, now, paused)
    slot = max(now, (row.tat or now) - limit.tolerance, paused)
    taken = replace(row, tat=base + limit.interval)
    if slot <= now:
        return RateDecision("a slot is free", "call", now, taken)
    ahead = slot - now
    if ahead <= hold and (time_left is None or ahead < time_left):
        return RateDecision(f"slot in {ahead.total_seconds():.3f}s: wait for it here", "sleep", slot, taken)
    return RateDecision(f"slot in {ahead.total_seconds():.3f}s: reserved, the step waits for it", "wait", slot, taken)


def decide_throttled(row: RateRow, now: datetime, retry_after: timedelta | None,
                     limit: RateLimit) -> RateDecision:
    """The remote answered 429: no instance calls it before ``now + retry_after`` (one interval
    when it gave none). Written only if it pauses longer than the row already does.

    Effect after the write won: none (every instance's next take reads the pause). A crash
    before the write: the pause is not shared; the other instances' calls get their own 429s and
    write it themselves. Racing writers: the loser re-reads and writes only a longer pause."""
    until = now + (retry_after if retry_after is not None else limit.interval)
    if row.paused_until is not None and row.paused_until >= until:
        return RateDecision("paused already until then")
    return RateDecision(f"429: paused until {iso(until)}", "wait", until,
                        replace(row, paused_until=until, throttled=row.throttled + 1))


def missed(slot: datetime, now: datetime) -> bool:
    """Whether a call at ``now`` is too late for its reserved ``slot`` (``SLOT_LATENESS``): it takes
    a new one. The missed slot goes unused: the rate is undershot, never overshot."""
    return now - slot > SLOT_LATENESS


def wake_time(slot: datetime) -> datetime:
    """When the step waiting for ``slot`` is woken (``WAKE_LEAD`` before it): its reply's ``until``."""
    return slot - WAKE_LEAD


def reserved_slot(message_id: str | None) -> datetime | None:
    """The slot a request was sent again for (its message id ends in ``:probe-{wake time}``), or None."""
    match = _PROBE_TAG.search(message_id or "")
    if match is None:
        return None
    return datetime.strptime(match.group(1) + "+0000", "%Y%m%dT%H%M%S%f%z") + WAKE_LEAD


def _time(value: Any) -> datetime | None:
    return parse_iso(str(value)) if value else None
