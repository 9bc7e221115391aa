"""One remote's breaker as an agent instance uses it: ``admit`` before a call, ``record`` after.

The I/O around the pure core (``shared.core.breaker.state``): the read-decide-write loop
(``shared.storage.breakers.apply``), then the effects of a write that won, once: an operator alert
(AlertsQueue + an error log line) when the breaker opens and when it closes, a metric on every
transition. The breaker never stops the agent on its own failure: a store error or a row that
keeps moving (``BreakerBusy``) is logged and the call is admitted, as if there were no breaker.

What counts as the remote failing (:func:`failure_of`): a transport fault (timeout, connection
or protocol error), 408, any 5xx, a 2xx without a JSON object. Any other answer, 425/429 and the
business 4xx included, shows the remote is up.

A closed breaker with nothing counted is served for ``policy.cache`` from the gate's copy
(``shared.agent.cache``): no read per call. Any failure this instance records, any write it
makes, any read showing something else, and any store error drop that copy. A gate given the
instance's ``board`` (``shared.agent.board``) refreshes a stale copy with the other gates',
by one query of every breaker; only if its copy is still not fresh does it read its own row.

A write that opens the breaker is preceded by the opening's watch row in the deadline index
(``shared.core.breaker.watch``), and followed once it won by a second one (a late write may land after
the Supervisor dropped the first as a stray): the Supervisor looks at the breaker only while one
is due.

When a write that closes the breaker wins, ``on_closed(gate, opening)`` runs (the agent's: end the
wait of every step waiting on the remote, ``shared.runtime.resume.resume_waiting``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from opentelemetry import metrics

from shared.agent.board import BreakerBoard
from shared.agent.cache import ClosedRowCache
from shared.core.breaker.state import (
    BreakerDecision,
    BreakerPolicy,
    BreakerRow,
    Effect,
    decide_admit,
    decide_failure,
    decide_reset,
    decide_success,
    decide_wake,
)
from shared.core.breaker.watch import Watch, confirming_watch, opening_watch
from shared.core.messages import BreakerAlert, Bus, OutMessage
from shared.core.times import iso
from shared.observability import telemetry
from shared.observability.logs import log_event
from shared.storage.breakers import apply

_meter = metrics.get_meter("orders")
transitions = _meter.create_counter("orders.breaker.transitions", unit="{transition}",
                                    description="Circuit breaker transitions, by remote and state entered")
held_back = _meter.create_counter("orders.breaker.held_back", unit="{call}",
                                  description="Calls not made because the remote's breaker was open")



def failure_of(status: int | str, *, final: bool = True) -> str | None:
    """Why this call counts as the remote failing, or None. ``status``: the HTTP status or the
    transport fault (``timeout``, ``connection-error``, ``protocol-error``); ``final``: the agent
    took the answer as the service's (False for a 2xx whose body was not a JSON object)."""
    if isinstance(status, str):
        return status
    if status == 408 or status >= 500:
        return f"HTTP {status}"
    if 200 <= status < 300 and not final:
        return f"HTTP {status} without a JSON object"
    return None


CACHED_CALL = BreakerDecision("closed (cached)", admission="call", failures=0)


def utcnow() -> datetime:
    return datetime.now(UTC)


class BreakerGate:
    """The breaker of ``remote`` for one instance (thread-safe: its only state is the cached
    closed row, behind a lock)."""

    def __init__(self, store: Any, remote: str, policy: BreakerPolicy, instance: str, bus: Bus,
                 alerts_queue: str, now: Callable[[], datetime] = utcnow,
                 on_closed: Callable[[BreakerGate, int], None] | None = None,
                 board: BreakerBoard | None = None) -> None:
        self.on_closed = on_closed
        self.store = store
        self.remote = remote
        self.policy = policy
        self.instance = instance
        self.bus = bus
        self.alerts_queue = alerts_queue
        self._now = now
        self.cache = ClosedRowCache(policy.cache)
        self.board = board  # the instance's gates, refreshed together (None: this gate reads its own row)
        if board is not None:
            board.join(remote, self.cache)

    def now(self) -> datetime:
        return self._now()

    def admit(self) -> BreakerDecision:
        """``call``, ``probe`` (report with its ``probe_id``) or ``wait`` (``until``)."""
        now = self._now()
        if self.cache.fresh(now):
            return CACHED_CALL
        if self.board is not None:
            self.board.refresh(self.remote, now)  # one query for every gate of the instance
            if self.cache.fresh(self._now()):
                return CACHED_CALL
        decision = self._apply(lambda row: decide_admit(row, now, self.policy, self.instance), now)
        if decision is None:
            return BreakerDecision("breaker unknown: call", admission="call")
        if decision.admission == "wait":
            held_back.add(1, {"remote": self.remote})
        return decision

    def record(self, status: int | str, *, final: bool = True, probe_id: str = "",
               counted: int = 0) -> BreakerDecision | None:
        """Count the outcome of one call (``probe_id``: the call was this instance's probe;
        ``counted``: the failures the breaker had counted when the call was admitted)."""
        now = self._now()
        fault = failure_of(status, final=final)
        if fault is not None:
            self.cache.drop()  # from now on every admission reads the row (and sees the count)
            return self._apply(lambda row: decide_failure(row, now, self.policy, fault, probe_id), now)
        if probe_id:
            return self._apply(lambda row: decide_success(row, now, probe_id), now)
        if counted:
            return self._apply(lambda row: decide_reset(row, now), now)
        return None  # an answer while nothing is counted changes nothing: no read, no write

    def claim_wake(self, until: datetime) -> bool:
        """Whether this waiting step is THE one to re-dispatch at ``until`` (one per ``until``)."""
        decision = self._apply(lambda row: decide_wake(row, until), self._now())
        return decision is not None and decision.row is not None

    def _apply(self, decide: Callable[[BreakerRow], BreakerDecision], now: datetime) -> BreakerDecision | None:
        """Read-decide-write (``shared.storage.breakers.apply``); keep the row read if it may be cached."""
        ticket = self.cache.ticket()
        seen: list[BreakerRow] = []

        def observe(row: BreakerRow) -> BreakerDecision:
            seen.append(row)
            return decide(row)

        try:
            decision = apply(self.store, self.remote, observe, before_write=self._watch_opening)
        except Exception as exc:  # noqa: BLE001 - the breaker never stops the agent
            self.cache.drop()
            log_event(logging.WARNING, "breaker.unavailable", remote=self.remote, error=repr(exc))
            return None
        if decision.row is not None:
            self.cache.drop()  # this gate moved the row: read it again next time
            if Effect.OPENED in decision.effects:
                self._put_watch(confirming_watch(decision.row))
            self._run_effects(decision, decision.row, now)
        elif seen:
            self.cache.offer(ticket, seen[-1], now)
        return decision

    def _watch_opening(self, decision: BreakerDecision) -> None:
        """Before a write that opens the breaker: the watch of that opening (``shared.core.breaker.watch``),
        so that no breaker is ever open unwatched. If this put fails, the breaker is not opened."""
        if Effect.OPENED in decision.effects and decision.row is not None:
            watch = opening_watch(decision.row)
            self.store.put_index(watch.row)

    def _put_watch(self, watch: Watch) -> None:
        """After an open write won: its second watch, in case the Supervisor dropped the first as a
        stray while the write was late. Best effort: the first one covers every other case."""
        try:
            self.store.put_index(watch.row)
        except Exception as exc:  # noqa: BLE001 - the breaker never stops the agent
            log_event(logging.WARNING, "breaker.watch_failed", remote=self.remote, error=repr(exc))

    def _run_effects(self, decision: BreakerDecision, row: BreakerRow, now: datetime) -> None:
        """After the write won: the metric of the state entered, and the alerts."""
        if decision.effects or decision.admission == "probe":
            transitions.add(1, {"remote": self.remote, "state": row.state.value})
        for effect in decision.effects:
            if effect is Effect.REOPENED:
                log_event(logging.WARNING, "breaker.reopened", remote=self.remote, fault=row.last_fault,
                          retryAt=iso(row.retry_at) if row.retry_at else None)
                continue
            self._alert(effect, row, now)
            if effect is Effect.CLOSED and self.on_closed is not None:
                try:
                    self.on_closed(self, row.opens)
                except Exception as exc:  # noqa: BLE001 - the Supervisor resumes them later
                    log_event(logging.ERROR, "breaker.resume_failed", remote=self.remote, error=repr(exc),
                              action="the Supervisor resumes the waiting steps at its next run")

    def _alert(self, effect: Effect, row: BreakerRow, now: datetime) -> None:
        state: Literal["open", "closed"] = "open" if effect is Effect.OPENED else "closed"
        opened = effect is Effect.OPENED
        body = BreakerAlert(remote=self.remote, state=state, at=now, opens=row.opens, reason=row.last_fault,
                            failures=row.failures if opened else None, retry_at=row.retry_at if opened else None,
                            open_seconds=None if opened or row.opened_at is None else
                            round((now - row.opened_at).total_seconds(), 3)).to_body()
        # one message id per opening and state: a replay is dropped by duplicate detection
        message = OutMessage(queue=self.alerts_queue, body=body, subject="alert",
                             message_id=f"breaker:{self.remote}:{row.opens}:{state}")
        log_event(logging.ERROR, f"breaker.{state}", **{k: v for k, v in body.items() if k != "kind"})
        try:
            telemetry.send(self.bus, message)
        except Exception as exc:  # noqa: BLE001 - the alert is best effort; the log line is written
            log_event(logging.ERROR, "alert.send_failed", remote=self.remote, error=repr(exc))
