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

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.agent.board import BreakerBoard
from shared.agent.gate import BreakerGate
from shared.core.breaker.state import BreakerDecision, BreakerPolicy
from shared.core.breaker.waiting import WaitingStep
from shared.core.messages import Bus
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


@dataclass
class CallGuard:
    """The breaker as one request's calls see it (one per request; the gate is shared)."""

    gate: BreakerGate
    step: WaitingStep
    probe_id: str = ""
    counted: int = 0  # failures counted when the call was admitted: an answer resets them

    def before_call(self) -> None:
        """Admit the next call (a probe remembers its lease) or raise :class:`BreakerWait`."""
        decision = hold(self.gate, self.step)
        if decision.admission == "wait":
            until = decision.until or self.gate.now() + self.gate.policy.cool_down
            raise BreakerWait(self.gate.remote, until, decision.verdict, self.gate.claim_wake(until),
                              decision.opening)
        self.probe_id = decision.probe_id
        self.counted = decision.failures

    def after_call(self, status: int | str, *, final: bool = True, cut_by_deadline: bool = False) -> None:
        """Count one call's outcome (``status``: HTTP status or transport fault)."""
        probe_id, self.probe_id = self.probe_id, ""
        if cut_by_deadline:
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
