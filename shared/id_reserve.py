"""Order ids reserved ahead, their deadline index rows already written: a keyless submission's
cover without a table request of its own.

Every order is covered by a deadline index row before its first transaction commits
(``shared.statemachine.deadlines``). An order with an Idempotency-Key has the id uuid5(key) and
puts its own row first, as always. An order without one may have any fresh id, so each instance
reserves ids ahead: it draws random ids and puts their rows in ONE transaction (one bucket, one
``Due``), and a keyless submission then takes an id whose row is already committed.

Why the rules of the deadline index still hold:

* a reserved row put at t0 is due at ``t0 + floor``: never later than ``floor`` after its put;
* an id is handed out only while its row is due at least ``floor / 2`` from now, and the
  submission's transaction sets ``CompleteBy >= now + floor``: the row is due before the
  order's deadline, so it covers it (``plan_submission`` checks this and puts a row of its own
  otherwise);
* an id that is never used (the process died, the submission failed, the rate fell) leaves an
  orphan row: the sweep deletes it like the orphan of a submission that died after its put
  (no state row, ``ORPHAN_INDEX_AGE`` after its due). Rows that go stale in the reserve are
  deleted by the instance itself, at the next take or by a timer every ``floor / 8`` (before
  they fall due: otherwise every sweep would read each one for minutes), and the rest at exit.

How many: about ``horizon`` seconds of this instance's recent keyless submissions (counted over
the last ``RATE_WINDOW`` seconds), refilled in the background when half of that is left, at most
100 (one transaction). Below ``MIN_BATCH`` ids per refill a reserve saves nothing (and may waste
rows), so a slow instance does as before: each submission puts its own row.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from opentelemetry.instrumentation.utils import suppress_instrumentation

from shared.background import Periodic
from shared.effects import PutIndex, bucket_of
from shared.logs import log_event
from shared.models import new_order_id
from shared.store import MAX_BATCH_OPS, Store

RATE_WINDOW = 2.0  # seconds of keyless submissions the refill's size is estimated from
MIN_BATCH = 2  # fewer ids than this per refill: no reserve (each submission puts its own row)
FAILURE_PAUSE = 5.0  # seconds without refills after a refill failed


@dataclass(frozen=True)
class Reserved:
    """An order id whose deadline index row, due at ``due``, is committed."""

    order_id: str
    due: datetime

    @property
    def row(self) -> PutIndex:
        """Its deadline index row."""
        return PutIndex(self.order_id, self.due, note="reserved")


class IdReserve:
    """This instance's reserved order ids (thread-safe; one per worker process)."""

    def __init__(self, store: Store, floor: timedelta, horizon: float, clock: Callable[[], datetime], *,
                 start: Callable[[Callable[[], None]], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic, timer: bool = True) -> None:
        self.store = store
        self.floor = floor
        self.horizon = horizon
        self.clock = clock
        self.monotonic = monotonic
        self._start = start or _thread
        self._lock = threading.Lock()
        self._ids: deque[Reserved] = deque()
        self._arrivals: deque[float] = deque()
        self._refilling = False
        self._paused_until = 0.0
        self._exit_registered = False
        self.refills = 0  # committed refills (for tests and logs)
        # started with the first refill (unless ``timer`` is off: tests call ``expire``): between
        # takes, stale ids' rows are deleted before they fall due
        self._periodic = Periodic(self.expire, max(0.5, floor.total_seconds() / 8), name="id-reserve",
                                  event="ids.expire_failed") if timer else None

    def take(self) -> Reserved | None:
        """A reserved id for a keyless submission, or None (the submission puts its own row)."""
        now, tick = self.clock(), self.monotonic()
        with self._lock:
            self._arrivals.append(tick)
            while self._arrivals and self._arrivals[0] < tick - RATE_WINDOW:
                self._arrivals.popleft()
            stale = self._drop_stale(now)
            got = self._ids.popleft() if self._ids else None
            want = self._want()
            refill = (want >= MIN_BATCH and len(self._ids) <= want // 2 and not self._refilling
                      and tick >= self._paused_until)
            if refill:
                self._refilling = True
        self._delete(stale)
        if refill:
            try:
                self._start(lambda: self._refill(want))
            except Exception as exc:  # noqa: BLE001 - e.g. no thread could be started: try again later
                with self._lock:
                    self._refilling = False
                log_event(logging.WARNING, "ids.reserve_failed", count=want, error=repr(exc))
        return got

    def _want(self) -> int:
        """Ids for ``horizon`` seconds at the recent rate (at most one transaction's worth)."""
        return min(MAX_BATCH_OPS, math.ceil(len(self._arrivals) / RATE_WINDOW * self.horizon))

    def _drop_stale(self, now: datetime) -> list[Reserved]:
        """Take off the ids too close to their due to hand out (the oldest are first)."""
        stale: list[Reserved] = []
        while self._ids and self._ids[0].due - now < self.floor / 2:
            stale.append(self._ids.popleft())
        return stale

    def _refill(self, count: int) -> None:
        try:
            due = self.clock() + self.floor  # read before the put: due <= floor after the row exists
            ids = [Reserved(new_order_id(), due) for _ in range(count)]
            # A refill belongs to no order: traced, each would be a root trace of its own.
            with suppress_instrumentation():
                self.store.put_indexes(bucket_of(due), [(row.row_key, row.props) for row in (r.row for r in ids)])
            with self._lock:
                self._ids.extend(ids)
                self.refills += 1
                register = not self._exit_registered
                self._exit_registered = True
            if register:
                atexit.register(self.release)
                if self._periodic is not None:
                    self._periodic.start()
        except Exception as exc:  # noqa: BLE001 - submissions put their own rows meanwhile
            with self._lock:
                self._paused_until = self.monotonic() + FAILURE_PAUSE
            log_event(logging.WARNING, "ids.reserve_failed", count=count, error=repr(exc))
        finally:
            with self._lock:
                self._refilling = False

    def expire(self) -> None:
        """Delete now the rows of ids too close to their due to hand out: when submissions stop,
        no take drops them, and they would fall due as orphans the sweep reads every time."""
        with self._lock:
            stale = self._drop_stale(self.clock())
        self._delete_now(stale)

    def release(self) -> None:
        """Give back every id not handed out: their rows are deleted now (best effort)."""
        with self._lock:
            left, self._ids = list(self._ids), deque()
        self._delete_now(left)

    def _delete_now(self, left: list[Reserved]) -> None:
        buckets: dict[str, list[str]] = {}
        for row in (r.row for r in left):
            buckets.setdefault(row.bucket, []).append(row.row_key)
        for bucket, keys in buckets.items():
            try:
                self.store.delete_indexes(bucket, keys)
            except Exception as exc:  # noqa: BLE001 - the sweep deletes orphans anyway
                log_event(logging.WARNING, "ids.release_failed", count=len(keys), error=repr(exc))

    def _delete(self, ids: list[Reserved]) -> None:
        for r in ids:
            row = r.row
            try:
                self.store.delete_index(row.bucket, row.row_key)
            except Exception as exc:  # noqa: BLE001 - the sweep deletes orphans anyway
                log_event(logging.WARNING, "index.delete_failed", order_id=r.order_id, error=repr(exc))

    def __len__(self) -> int:
        with self._lock:
            return len(self._ids)


def _thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="id-reserve", daemon=True).start()
