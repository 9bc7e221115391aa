"""The Supervisor's work on the breakers: no waiting step is left behind by a crash.

The sweep looks at a breaker only when its watch row in the deadline index is due
(``shared.core.breaker.watch``): one point read of the breaker, and per verdict:

* **closed** (``resume-all``): list its waiting steps; the instance that closed it may have died
  before sending their resumes: send them again, forget them, then delete the watch. Resumes are
  fenced by the order's lease and their ids are deterministic, so a step already resumed is not
  dispatched twice;
* **probe overdue** (``wake``): the cool-down (or the probe's lease) is over and the wake-up set
  for it is overdue by ``grace`` (its resume was lost, or the step it woke finished otherwise):
  resume the oldest waiting step, which takes the probe; the watch stays due (next sweep). With
  no step waiting, the watch moves ``IDLE_RECHECK`` (60 s) on: an open breaker nobody uses any
  more would otherwise cost every sweep a read and a listing;
* **open or half-open, nothing overdue** (``move``): put the watch at the time it would be, then
  delete this one; **a newer opening** (``delete``): its own watch covers the breaker.

Crash at any point: the watch row stays (or both the old and the moved one), and the next sweep
does it again; every step of it is idempotent. Two Supervisors: the same resumes (dropped as
duplicates, or stale), the same moved key (an upsert), deletes of a row already gone.

:func:`full_pass` is the old pass, run once per store by each process (at its first sweep): it
puts a watch for every breaker that is not closed (breakers opened by an older version, or a
watch lost some other way) and resends the resumes of closed ones. Cost: 2 table requests per
remote, once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from shared.core.breaker.state import BreakerState
from shared.core.breaker.waiting import MAX_LISTED, probe_tag, resume_message
from shared.core.breaker.watch import IDLE_RECHECK, WAKE_GRACE, Watch, WatchVerdict, decide_watch, probe_overdue
from shared.core.messages import Bus
from shared.observability.logs import log_event
from shared.runtime.resume import resume_waiting
from shared.storage.breakers import read_breaker
from shared.storage.store import Store
from shared.storage.waiting import waiting_steps

__all__ = ["WAKE_GRACE", "full_pass", "handle_watch", "probe_overdue", "put_watch"]


def put_watch(store: Store, watch: Watch) -> None:
    store.put_index(watch.row)


def handle_watch(store: Store, bus: Bus, scheduler_queue: str, watch: Watch, now: datetime,
                 grace: timedelta = WAKE_GRACE, limit: int = MAX_LISTED) -> tuple[WatchVerdict, int]:
    """Act on a due watch: (verdict, resumes sent). The watch row is deleted only once nothing is owed."""
    if watch.due > now:  # the current minute's rows that are not due yet: no read
        return WatchVerdict.KEEP, 0
    row = read_breaker(store, watch.remote)
    decision = decide_watch(row, watch, now, grace)
    sent = 0
    if decision.verdict is WatchVerdict.KEEP:
        return decision.verdict, 0
    if decision.verdict is WatchVerdict.RESUME_ALL:
        sent = resume_waiting(store, bus, scheduler_queue, watch.remote, max(row.opens, watch.opening), limit)
        if sent >= limit:
            return decision.verdict, sent  # more to list: the watch stays due
    elif decision.verdict is WatchVerdict.WAKE:
        steps = waiting_steps(store, watch.remote, limit)
        if not steps:  # nobody to wake: look again later, not at every sweep (put first, then delete)
            put_watch(store, Watch(watch.remote, watch.opening, now + IDLE_RECHECK))
            store.delete_index(watch.bucket, watch.row_key)
            return decision.verdict, 0
        oldest = min(steps, key=lambda s: s.attempt)
        bus.send(resume_message(oldest, scheduler_queue, remote=watch.remote, why="probe", tag=probe_tag(now)))
        return decision.verdict, 1  # due again at the next sweep, until the breaker moves on
    elif decision.verdict is WatchVerdict.MOVE:
        assert decision.at is not None
        put_watch(store, Watch(watch.remote, max(row.opens, watch.opening), decision.at))
    store.delete_index(watch.bucket, watch.row_key)
    if sent:
        log_event(logging.WARNING, "supervisor.breaker_resumes", remote=watch.remote, sent=sent,
                  verdict=decision.verdict.value)
    return decision.verdict, sent


def full_pass(store: Store, bus: Bus, scheduler_queue: str, remotes: Iterable[str], now: datetime) -> dict[str, int]:
    """Read every breaker: watch each one that is not closed (due now), resume the steps still
    waiting on a closed one. Resumes sent per remote (only remotes that needed any)."""
    sent: dict[str, int] = {}
    for remote in remotes:
        row = read_breaker(store, remote)
        if row.state is not BreakerState.CLOSED:
            put_watch(store, Watch(remote, row.opens, now))
            continue
        if row.etag is None:
            continue  # never written: no step can have read it open, so none waits on it
        resumed = resume_waiting(store, bus, scheduler_queue, remote, row.opens)
        if resumed:
            sent[remote] = resumed
    if sent:
        log_event(logging.WARNING, "supervisor.breaker_resumes", sent=sent)
    return sent
