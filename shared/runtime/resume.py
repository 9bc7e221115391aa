"""Resuming the steps that waited on a remote's breaker, once it closes: the closing agent's gate
does it right after its close write wins, and the Supervisor again for whatever a crash left."""

from __future__ import annotations

import logging

from shared.core.breaker.waiting import MAX_LISTED, closed_tag, resume_message
from shared.core.messages import Bus
from shared.observability.logs import log_event
from shared.storage.store import Store
from shared.storage.waiting import forget_rows, waiting_rows


def resume_waiting(store: Store, bus: Bus, queue: str, remote: str, opening: int, limit: int = MAX_LISTED) -> int:
    """Send a resume for every step waiting on ``remote``'s ``opening``, then forget them: how many
    were sent. A crash in between leaves rows behind: the Supervisor sends them again (same ids)."""
    rows = waiting_rows(store, remote, limit)
    steps = [step for step, _etag in rows]
    for step in steps:
        bus.send(resume_message(step, queue, remote=remote, why="closed", tag=closed_tag(opening)))
    # On the ETags listed: a step registered again meanwhile (it waits on a newer opening) keeps its row.
    forget_rows(store, remote, [(step.row_key, etag) for step, etag in rows])
    if steps:
        log_event(logging.INFO, "breaker.resumed", remote=remote, steps=len(steps))
    return len(steps)
