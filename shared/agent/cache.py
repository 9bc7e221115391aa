"""A gate's short-lived copy of its breaker row, when it was last read closed with nothing counted.

Why: every agent call admits itself through its remote's breaker, and while the remote is healthy
that read says the same thing every time (closed, no failures). Served from this copy for
``ttl``, a closed breaker costs one read per ``ttl`` per instance instead of one per call (and the
instance's gates share that read: ``shared.agent.board`` refreshes all their copies with one query).

What it may never do: serve a probe, an open or half-open breaker, or a closed one with failures
counted (those are never stored here), nor serve a row older than something this instance has
since seen or done. Every event that could make the copy stale drops it, and bumps a generation:
a read that began before the drop cannot store its (older) row afterwards. So once this instance
has read the breaker open, written to it, or recorded a call failure, every admission reads the
row again until a read begun after that shows it closed and clean.

The cost (README, "Circuit breakers"): another instance's opening is seen here up to ``ttl`` later.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from shared.core.breaker.state import BreakerRow, BreakerState


def is_clean_closed(row: BreakerRow) -> bool:
    """A row the cache may keep: closed, with no failure counted (an admission it yields is a
    plain ``call`` whose success writes nothing)."""
    return row.state is BreakerState.CLOSED and row.failures == 0


@dataclass(frozen=True)
class Ticket:
    """Taken before a read: the generation it must still be at for its row to be stored."""

    generation: int


class ClosedRowCache:
    """Thread-safe: the agent instance's threads share their gate and so this copy."""

    def __init__(self, ttl: timedelta) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._generation = 0
        self._read_at: datetime | None = None  # when the stored clean closed row was read

    def fresh(self, now: datetime) -> bool:
        """Whether a clean closed row read less than ``ttl`` ago is held (a clock that went back
        does not extend it)."""
        with self._lock:
            read_at = self._read_at
        return read_at is not None and read_at <= now < read_at + self.ttl

    def ticket(self) -> Ticket:
        with self._lock:
            return Ticket(self._generation)

    def offer(self, ticket: Ticket, row: BreakerRow, read_at: datetime) -> bool:
        """Keep ``row`` (read at ``read_at`` after ``ticket`` was taken) if it is clean and closed,
        the cache is on, and nothing dropped the cache since the ticket; else drop. Kept or not."""
        if not is_clean_closed(row) or self.ttl <= timedelta(0):
            self.drop()
            return False
        with self._lock:
            if ticket.generation != self._generation:
                return False  # something newer was seen or done while this row was read
            self._read_at = read_at
            return True

    def drop(self) -> None:
        """Forget the row, and refuse every read begun before now."""
        with self._lock:
            self._generation += 1
            self._read_at = None
