"""Every breaker an agent instance holds, refreshed by ONE query of the partition ``breakers``.

Why (issue 15: at most 5 table requests per order): each gate keeps a copy of its clean closed row
for ``ttl`` (``shared.agent.cache``). At saturation every instance calls every remote all the
time, so the copies expire together and each cost its own point read: one read per ``ttl`` per
instance *per remote*. When a gate finds its copy stale, :meth:`BreakerBoard.refresh` reads the
whole partition at once and offers each gate its row (a remote never written: the default closed
row), so it is one request per ``ttl`` per instance.

The cache's contract holds unchanged. Every gate's ticket is taken BEFORE the query, and each
row goes through its own gate's ``offer``: only a clean closed row is kept, and never one read
before something this instance has since seen or done to that breaker (a recorded failure, a
write, a read showing anything else, a store error). A row moved by another instance after the
query is seen at the gate's next read, at most ``ttl`` later: the copy's trade, as before.

Only the clean closed fast path goes through here. A gate whose copy is still not fresh after
the refresh (open, half-open, failures counted, its offer refused, or the query failed) takes
its own read-decide-write path, which reads and writes its row on its ETag. For ``ttl`` after a
query showed a remote's row unclean, that remote's gate goes straight to that path (no query per
call on an open breaker), and for ``ttl`` after a query failed, every gate does (no query
per call while the table is down; each logs ``breaker.unavailable`` and calls, as before).

Single flight: of the threads that find copies stale at once, one queries; the others wait for
it (at most ``wait`` seconds) and then look at their own copy. No lock is held during the query,
nor ever during a gate's own path.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Any

from shared.agent.cache import ClosedRowCache, Ticket
from shared.observability.logs import log_event
from shared.storage.breakers import read_breakers

WAIT_SECONDS = 10.0  # longest a thread waits for another's query before taking its own path


class BreakerBoard:
    """The gates' caches of one agent instance (thread-safe; one per instance, shared by its gates)."""

    def __init__(self, store: Any, wait: float = WAIT_SECONDS) -> None:
        self.store = store
        self.wait = wait
        self._lock = threading.Lock()
        self._caches: dict[str, ClosedRowCache] = {}
        self._flight: threading.Event | None = None  # set when the query in flight has been offered
        self._unclean: dict[str, datetime] = {}  # remote -> when a query began that left its copy stale
        self._failed_at: datetime | None = None  # when the last failed query began
        self.queries = 0  # queries sent (tests)

    def join(self, remote: str, cache: ClosedRowCache) -> None:
        """Hold ``remote``'s gate's copy (one gate per remote and instance)."""
        with self._lock:
            if remote in self._caches:
                raise ValueError(f"this instance already holds a gate of {remote}")
            self._caches[remote] = cache

    def refresh(self, remote: str, now: datetime) -> None:
        """Refresh every held copy with one query, unless one is in flight (then wait for it) or
        ``remote``'s own copy could not gain from it (see the module's docstring). The caller then
        looks at its copy: still not fresh, it takes its own path."""
        with self._lock:
            if self._resting(remote, now):
                return
            flight = self._flight
            leading = flight is None
            if flight is None:
                flight = self._flight = threading.Event()
        if not leading:
            flight.wait(self.wait)
            return
        try:
            self._query(now)
        finally:
            with self._lock:
                self._flight = None
            flight.set()

    def _resting(self, remote: str, now: datetime) -> bool:
        """Whether a query begun less than ``ttl`` ago failed, or left ``remote``'s copy stale (lock held)."""
        cache = self._caches.get(remote)
        if cache is None or cache.ttl <= timedelta(0):
            return True
        for since in (self._failed_at, self._unclean.get(remote)):
            if since is not None and since <= now < since + cache.ttl:
                return True
        return False

    def _query(self, now: datetime) -> None:
        """Tickets first, then the query, then each row offered to its own copy."""
        with self._lock:
            caches = dict(self._caches)
            self.queries += 1
        tickets: dict[str, Ticket] = {remote: cache.ticket() for remote, cache in caches.items()}
        try:
            rows = read_breakers(self.store, caches)
        except Exception as exc:  # noqa: BLE001 - each gate then reads its own row, as without the board
            with self._lock:
                self._failed_at = now
            log_event(logging.WARNING, "breaker.query_failed", remotes=sorted(caches), error=repr(exc),
                      action="each breaker is read on its own")
            return
        stale = [remote for remote, cache in caches.items()
                 if remote not in rows or not cache.offer(tickets[remote], rows[remote], now)]
        with self._lock:
            self._failed_at = None
            self._unclean = dict.fromkeys(stale, now)
