"""The Supervisor's pass over the breakers: no waiting step is left behind by a crash.

Each run, for each remote (one point read, and one key-only listing of its waiting steps):

* **closed with waiting steps**: the instance that closed it died before sending their resumes
  (or a step registered just as it closed): send them again, then forget them. Resumes are
  fenced by the order's lease and their ids are deterministic, so a step already resumed is not
  dispatched twice.
* **open or half-open, with waiting steps, and nobody due to probe**: the cool-down (or the probe's
  lease) is over and the wake-up set for it is overdue by ``grace`` (its resume was lost, or the
  step it woke finished otherwise): resume the oldest waiting step, which takes the probe.

Cost: 2 table requests per remote per Supervisor run, whatever the load.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from shared.breaker.state import BreakerRow, BreakerState
from shared.breaker.store import read_breaker
from shared.breaker.waiting import forget_waiting, resume_message, waiting_steps
from shared.logs import log_event
from shared.messaging import Bus
from shared.store import Store

WAKE_GRACE = timedelta(seconds=5)


def probe_overdue(row: BreakerRow, now: datetime, grace: timedelta = WAKE_GRACE) -> bool:
    """An open breaker past its cool-down, or a half-open one past its probe lease, that nobody
    has woken for ``grace``."""
    if row.state is BreakerState.OPEN:
        due = row.retry_at
    elif row.state is BreakerState.HALF_OPEN:
        due = row.probe_until
    else:
        return False
    if due is None or now < due + grace:
        return False
    return row.wake_at is None or row.wake_at < now - grace


def recover(store: Store, bus: Bus, scheduler_queue: str, remotes: Iterable[str], now: datetime) -> dict[str, int]:
    """Resumes sent per remote (only remotes that needed any)."""
    sent: dict[str, int] = {}
    for remote in remotes:
        row = read_breaker(store, remote)
        if row.state is not BreakerState.CLOSED and not probe_overdue(row, now):
            continue
        steps = waiting_steps(store, remote)
        if not steps:
            continue
        if row.state is BreakerState.CLOSED:
            for step in steps:
                bus.send(resume_message(step, scheduler_queue))
            forget_waiting(store, remote, steps)
            sent[remote] = len(steps)
        else:
            oldest = min(steps, key=lambda s: s.attempt)
            bus.send(resume_message(oldest, scheduler_queue, tag=f"probe-{now:%Y%m%d%H%M%S}"))
            sent[remote] = 1
    if sent:
        log_event(logging.WARNING, "supervisor.breaker_resumes", sent=sent)
    return sent
