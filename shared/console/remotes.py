"""The overview's ``remotes``: each remote service's circuit breaker, as the status API shows it.

Reads, per remote of ``workflows/agents.json`` (four today): one point read of its breaker row
(state table, partition ``breakers``; a missing row is a closed breaker) and one RowKey-only
query of its waiting steps (partition ``waiting-{remote}``), counted up to
``WAITING_COUNT_CAP`` (over the cap: ``waitingCapped``); for a remote with a rate limit, one
point read of its limiter row too (partition ``ratelimits``). So 2 requests per remote, 3 for a
limited one, whatever the load. If any of them fails, ``remotes`` is empty and ``remotesError``
says why: the rest of the overview is still given (like ``queues``/``queuesError``).

The metric of the breakers is the counter ``orders.breaker.transitions{remote,state}`` the gate
emits on every transition it wins (``shared.agent.gate``), with ``orders.breaker.held_back
{remote}`` for the calls an open breaker spared. There is deliberately no gauge of the state: an
observable gauge would read the rows at every scrape of every instance; the current state is
this status API's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from shared.core.breaker.state import BreakerRow
from shared.core.breaker.waiting import waiting_partition
from shared.core.ratelimit.bucket import RateRow
from shared.core.workflows.ratelimits import RateLimit
from shared.observability.logs import log_event
from shared.storage.breakers import read_breaker
from shared.storage.ratelimits import read_rate
from shared.storage.store import Store

WAITING_COUNT_CAP = 100


def remote_names() -> list[str]:
    """The remotes, in ``workflows/agents.json``'s order."""
    from shared.core.workflows.catalog import AGENTS

    return [agent.name for agent in AGENTS]


def remotes_overview(store: Store, names: Iterable[str], limits: Mapping[str, RateLimit] | None = None,
                     ) -> tuple[list[dict[str, Any]], str | None]:
    """(one entry per remote, None), or ([], why) if reading the breakers failed. ``limits``: the
    limited remotes' rates (``Config.rate_limits``)."""
    try:
        return [remote_entry(store, name, (limits or {}).get(name)) for name in names], None
    except Exception as exc:  # noqa: BLE001 - a store hiccup: the rest of the overview still renders
        log_event(logging.WARNING, "overview.remotes_failed", error=repr(exc))
        return [], str(exc) or type(exc).__name__


def remote_entry(store: Store, name: str, limit: RateLimit | None = None) -> dict[str, Any]:
    """One remote's breaker and the count of steps waiting on it (2 requests), and its rate limit
    if it has one (``rateLimit``, null otherwise: a third request, the limiter's row)."""
    row = read_breaker(store, name)
    waiting, capped = waiting_count(store, name)
    rate = rate_json(read_rate(store, name), limit) if limit is not None else None
    return breaker_json(row) | {"waiting": waiting, "waitingCapped": capped, "rateLimit": rate}


def rate_json(row: RateRow, limit: RateLimit) -> dict[str, Any]:
    """A limited remote's rate and limiter row: the rate told, a 429's pause every instance honours
    (``pausedUntil``, past or not: the console compares it with ``asOf``), the 429s counted, and the
    next free slot (``nextSlotAt``: the row's theoretical arrival time)."""
    return {"perSecond": limit.per_second, "burst": limit.burst, "pausedUntil": _utc(row.paused_until),
            "throttled": row.throttled, "nextSlotAt": _utc(row.tat)}


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
