"""One remote's rate limit as an agent instance uses it: ``take`` a slot before a call,
``throttled`` after a 429 (``shared.core.ratelimit``: the design; ``shared.storage.ratelimits``: the row).

The instance's threads take their slots one at a time (a lock), so that they do not race each
other for the row: only instances race, and a thread starts from the row its instance wrote last
(one table request per call while no other instance wrote in between). The lock is never held
while a call waits for its slot. The limiter never stops the agent on its own failure: a store
error or a row that keeps moving (``RateBusy``) is logged and the call goes, as if there were no
limit (the remote's 429s, retried at its Retry-After, are then the limit).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from opentelemetry import metrics

from shared.core.ratelimit.bucket import DEFAULT_HOLD, RateDecision, RateRow, decide_take, decide_throttled
from shared.core.workflows.ratelimits import RateLimit
from shared.observability.logs import log_event
from shared.storage.ratelimits import apply

_meter = metrics.get_meter("orders")
held = _meter.create_counter("orders.ratelimit.held_back", unit="{call}",
                             description="Calls to a rate-limited remote that waited for their slot, by remote and how")
throttled_calls = _meter.create_counter("orders.ratelimit.throttled", unit="{call}",
                                        description="429 answers from a remote, by remote")

UNKNOWN = RateDecision("rate limiter unknown: call", "call")


def utcnow() -> datetime:
    return datetime.now(UTC)


class RateGate:
    """The rate limit of ``remote`` for one instance (thread-safe)."""

    def __init__(self, store: object, remote: str, limit: RateLimit, *, hold: timedelta = DEFAULT_HOLD,
                 now: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.remote = remote
        self.limit = limit
        self.hold = hold
        self._now = now
        self._lock = threading.Lock()
        self._known: RateRow | None = None  # the row as this instance last wrote it (with its ETag)

    def now(self) -> datetime:
        return self._now()

    def take(self, time_left: timedelta | None = None) -> RateDecision:
        """A slot for one call: ``call`` (now), ``sleep`` (until ``slot``, short) or ``wait`` (reserved)."""
        decision = self._apply(lambda row: decide_take(row, self._now(), self.limit, hold=self.hold,
                                                       time_left=time_left))
        if decision is None:
            return UNKNOWN
        if decision.admission != "call":
            held.add(1, {"remote": self.remote, "how": decision.admission})
        return decision

    def paused_after(self, slot: datetime) -> bool:
        """Whether the row this instance last wrote pauses the remote past ``slot`` (a reserved
        slot's call then takes a new one; no table request: what another instance wrote since is
        not seen, its 429 is)."""
        known = self._known
        return known is not None and known.paused_until is not None and known.paused_until > slot

    def throttled(self, retry_after: float | None) -> None:
        """The remote answered 429: pause every instance for its Retry-After."""
        throttled_calls.add(1, {"remote": self.remote})
        pause = timedelta(seconds=retry_after) if retry_after is not None else None
        decision = self._apply(lambda row: decide_throttled(row, self._now(), pause, self.limit))
        if decision is not None and decision.row is not None:
            log_event(logging.WARNING, "ratelimit.throttled", remote=self.remote, retryAfter=retry_after,
                      pausedUntil=decision.slot.isoformat() if decision.slot else None)

    def _apply(self, decide: Callable[[RateRow], RateDecision]) -> RateDecision | None:
        with self._lock:
            try:
                decision, self._known = apply(self.store, self.remote, decide, self._known)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - the limiter never stops the agent
                self._known = None
                log_event(logging.WARNING, "ratelimit.unavailable", remote=self.remote, error=repr(exc))
                return None
            return decision
