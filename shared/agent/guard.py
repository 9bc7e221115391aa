"""The agent's side of its remote's circuit breaker: admit every call, record every outcome.

Before each call (the first and every retry) :meth:`CallGuard.before_call` asks the breaker
(``shared.agent.guard.hold``: admit, or register the attempt as waiting and read again). A
``wait`` raises :class:`BreakerWait`: the agent stops retrying, makes no call and replies
``waiting``; the scheduler records it without a failure and a resume re-dispatches the step when
the breaker closes. After each call :meth:`CallGuard.after_call` counts its outcome (a success
outside a probe costs nothing). A call cut short by completeBy is not the remote's fault and is
not counted.

:func:`breaker_for` builds the gate an agent instance shares between its threads; when a close
write wins, that gate sends a resume for every waiting step (``resume_waiting``). The gates of
one instance share its ``BreakerBoard`` (``shared.agent.board``): one query refreshes them all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shared.agent.board import BreakerBoard
from shared.agent.gate import BreakerGate
from shared.agent.limiter import RateGate
from shared.core.breaker.state import BreakerDecision, BreakerPolicy
from shared.core.breaker.waiting import WaitingStep
from shared.core.messages import Bus
from shared.core.ratelimit.bucket import missed, wake_time
from shared.runtime.resume import resume_waiting
from shared.storage.store import Store
from shared.storage.waiting import forget_waiting, register_waiting


class BreakerWait(Exception):
    """The remote's breaker is open (or a probe is out): no call; reply ``waiting``."""

    def __init__(self, remote: str, until: datetime, verdict: str, wake: bool, opening: int = 0) -> None:
        super().__init__(f"breaker of {remote}: {verdict}")
        self.remote = remote
        self.until = until
        self.verdict = verdict
        self.wake = wake  # this step is the one re-dispatched at ``until`` (it drives the next probe)
        self.opening = opening  # the breaker's opening it read (0: unknown), told in the reply


class RateWait(BreakerWait):
    """The remote's rate limit: the call's slot is reserved at ``until``; reply ``waiting`` and
    claim the wake-up then (the request sent again at the slot is named after it). The same wait
    as a breaker's: no FailureCount, the step's deadline moved, nothing registered for a closer."""

    def __init__(self, remote: str, until: datetime, verdict: str) -> None:
        super().__init__(remote, until, verdict, wake=True)


@dataclass
class CallGuard:
    """The breaker and the rate limit as one request's calls see them (one per request; the
    gates are shared). ``reserved``: the slot the request was sent again for (its first call
    goes then without taking another)."""

    gate: BreakerGate | None
    step: WaitingStep
    probe_id: str = ""
    counted: int = 0  # failures counted when the call was admitted: an answer resets them
    rate: RateGate | None = None
    reserved: datetime | None = None
    sleep: Callable[[float], None] = time.sleep
    time_left: Callable[[], float] | None = None

    def before_call(self) -> None:
        """Admit the next call (a probe remembers its lease) or raise :class:`BreakerWait`
        (:class:`RateWait`: the rate limit's slot is later than the agent may wait for it here)."""
        if self.gate is not None:
            decision = hold(self.gate, self.step)
            if decision.admission == "wait":
                until = decision.until or self.gate.now() + self.gate.policy.cool_down
                raise BreakerWait(self.gate.remote, until, decision.verdict, self.gate.claim_wake(until),
                                  decision.opening)
            self.probe_id = decision.probe_id
            self.counted = decision.failures
        if self.rate is not None:
            self._take_slot(self.rate)

    def _take_slot(self, rate: RateGate) -> None:
        reserved, self.reserved = self.reserved, None
        now = rate.now()
        if reserved is not None and (rate.paused_after(reserved) or missed(reserved, now)):
            # a 429 this instance saw paused the remote past the slot, or the request came after
            # it: a new one (a late call would bunch up with the calls in the slots after it)
            reserved = None
        if reserved is None:
            left = timedelta(seconds=self.time_left()) if self.time_left is not None else None
            decision = rate.take(left)
            if decision.admission == "wait":
                assert decision.slot is not None
                raise RateWait(rate.remote, wake_time(decision.slot), decision.verdict)
            reserved = decision.slot if decision.admission == "sleep" else None
        if reserved is not None and reserved > now:
            self.sleep((reserved - now).total_seconds())  # a slot within the hold (or one sent early)

    def after_call(self, status: int | str, *, final: bool = True, cut_by_deadline: bool = False,
                   retry_after: float | None = None) -> None:
        """Count one call's outcome (``status``: HTTP status or transport fault); a 429 pauses
        every instance's calls to the remote for its Retry-After."""
        probe_id, self.probe_id = self.probe_id, ""
        if status == 429 and self.rate is not None:
            self.rate.throttled(retry_after)
        if cut_by_deadline or self.gate is None:
            return  # completeBy ended the call, not the remote: a probe's lease simply expires
        self.gate.record(status, final=final, probe_id=probe_id, counted=self.counted)


def breaker_for(remote: str, store: Store, bus: Bus, settings: Any, instance: str,
                board: BreakerBoard | None = None) -> BreakerGate:
    """The gate of ``remote`` for this instance: alerts on the AlertsQueue, and on a close, a
    resume on the SchedulerQueue for every step that waited. ``board``: the instance's, shared by
    all of its gates (None: this gate reads its own row when its copy is stale)."""
    scheduler_queue = settings["SchedulerQueue"]

    def resume(gate: BreakerGate, opening: int) -> None:
        resume_waiting(store, bus, scheduler_queue, gate.remote, opening)

    return BreakerGate(store, remote, BreakerPolicy.from_settings(settings), instance, bus,
                       settings["AlertsQueue"], on_closed=resume, board=board)


def hold(gate: BreakerGate, step: WaitingStep) -> BreakerDecision:
    """Admit ``step``'s call, or register it as waiting: register, then read the breaker again.

    Returns the decision to act on: ``call``/``probe`` (not registered: the row, if written, is
    removed again) or ``wait`` (registered; the closer will resume it)."""
    first = gate.admit()
    if first.admission != "wait":
        return first
    register_waiting(gate.store, gate.remote, step, gate.now())
    second = gate.admit()
    if second.admission != "wait":
        forget_waiting(gate.store, gate.remote, [step])
    return second
