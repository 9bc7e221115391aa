"""The overview's ``remotes``: each remote service's circuit breaker, as the status API shows it.

Reads, per remote of ``workflows/agents.json`` (four today): one point read of its breaker row
(state table, partition ``breakers``; a missing row is a closed breaker) and one RowKey-only
query of its waiting steps (partition ``waiting-{remote}``), counted up to
``WAITING_COUNT_CAP`` (over the cap: ``waitingCapped``). So 2 requests per remote, whatever the
load. If any of them fails, ``remotes`` is empty and ``remotesError`` says why: the rest of the
overview is still given (like ``queues``/``queuesError``).

The metric of the breakers is the counter ``orders.breaker.transitions{remote,state}`` the gate
emits on every transition it wins (``shared.agent.gate``), with ``orders.breaker.held_back
{remote}`` for the calls an open breaker spared. There is deliberately no gauge of the state: an
observable gauge would read the rows at every scrape of every instance; the current state is
this status API's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from shared.core.breaker.state import BreakerRow
from shared.core.breaker.waiting import waiting_partition
from shared.observability.logs import log_event
from shared.storage.breakers import read_breaker
from shared.storage.store import Store

WAITING_COUNT_CAP = 100


def remote_names() -> list[str]:
    """The remotes, in ``workflows/agents.json``'s order."""
    from shared.core.workflows.catalog import AGENTS

    return [agent.name for agent in AGENTS]


def remotes_overview(store: Store, names: Iterable[str]) -> tuple[list[dict[str, Any]], str | None]:
    """(one entry per remote, None), or ([], why) if reading the breakers failed."""
    try:
        return [remote_entry(store, name) for name in names], None
    except Exception as exc:  # noqa: BLE001 - a store hiccup: the rest of the overview still renders
        log_event(logging.WARNING, "overview.remotes_failed", error=repr(exc))
        return [], str(exc) or type(exc).__name__


def remote_entry(store: Store, name: str) -> dict[str, Any]:
    """One remote's breaker and the count of steps waiting on it (2 requests)."""
    row = read_breaker(store, name)
    waiting, capped = waiting_count(store, name)
    return breaker_json(row) | {"waiting": waiting, "waitingCapped": capped}


def waiting_count(store: Store, name: str, cap: int = WAITING_COUNT_CAP) -> tuple[int, bool]:
    """(steps waiting on ``name``, counted up to ``cap``; whether there may be more): one request."""
    listed = len(store.partition_keys(waiting_partition(name), cap + 1))
    return min(listed, cap), listed > cap


def breaker_json(row: BreakerRow) -> dict[str, Any]:
    """The row as the overview gives it (times UTC ``...Z``, null when unset)."""
    return {"name": row.remote, "state": row.state.value, "failures": row.failures,
            "windowStart": _utc(row.window_start), "openedAt": _utc(row.opened_at),
            "retryAt": _utc(row.retry_at), "probeUntil": _utc(row.probe_until), "opens": row.opens,
            "lastFault": row.last_fault or None, "changedAt": _utc(row.changed_at)}


def _utc(at: datetime | None) -> str | None:
    if at is None:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
