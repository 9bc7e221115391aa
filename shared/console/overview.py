"""``GET /api/overview``: the console's first page, without scanning any table.

Reads (Table Storage requests):

* ``live``: the search index's ``cat-inFlight-`` and ``cat-attention-`` ranges, RowKeys only,
  counted up to ``LIVE_COUNT_CAP`` (one request each; over the cap it says ``capped``);
* ``finished`` (last hour), ``series`` and ``supervisor``: the per-process minute rows of the
  last 60 minutes (``shared.observability.figures``), one key-range query (60 rows per process);
* ``finished`` (last 24 h): the hour rows of the last 24 hours (the current one included), one
  key-range query (24 rows per process).

So the cost grows with the processes that ran in the last day, never with the orders. The
queues' depths come from Service Bus (``shared.console.deadletters.queue_depths``, peeks); if it fails,
``queues`` is empty and ``queuesError`` says why, and the rest is still shown. ``remotes``: each
remote's circuit breaker and the steps waiting on it, 2 requests per remote
(``shared.console.remotes``); if that fails, ``remotes`` is empty and ``remotesError`` says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.api.http import HttpResult
from shared.console.remotes import remote_names, remotes_overview
from shared.core.statemachine import Category
from shared.observability.figures import Figures, hour_stamp, minute_stamp, stamp_of
from shared.observability.logs import log_event
from shared.runtime import Runtime
from shared.storage.store import Store

LIVE_COUNT_CAP = 1000
QUEUE_CAP = 100
SERIES_MINUTES = 60
DAY_HOURS = 24
MAX_STATS_ROWS = 10_000  # rows of one range read at most: 60 minutes x 166 processes
QueueDepths = Callable[..., list[dict[str, Any]]]


def _default_queue_depths(rt: Runtime, cap: int) -> list[dict[str, Any]]:
    from shared.console.deadletters import queue_depths

    return queue_depths(rt, cap=cap)


def get_overview(rt: Runtime, *, queue_depths: QueueDepths = _default_queue_depths,
                 remotes: Iterable[str] | None = None) -> HttpResult:
    """The overview's JSON (issue 12's contract; issue 14's ``remotes``: by default every agent of
    ``workflows/agents.json``). A store failure raises, except the breakers' (shown, like the queues')."""
    now = rt.clock().astimezone(UTC)
    minutes = merged_by_stamp(rt.store, "m", minute_stamp(now - timedelta(minutes=SERIES_MINUTES - 1)),
                              minute_stamp(now + timedelta(minutes=1)))
    hours = merged_by_stamp(rt.store, "h", hour_stamp(now - timedelta(hours=DAY_HOURS - 1)),
                            hour_stamp(now + timedelta(hours=1)))
    queues, queues_error = _queues(rt, queue_depths)
    breakers, breakers_error = remotes_overview(rt.store, remote_names() if remotes is None else remotes,
                                                rt.config.rate_limits)
    body = {
        "asOf": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "live": {"inFlight": _live(rt.store, Category.IN_FLIGHT), "attention": _live(rt.store, Category.ATTENTION)},
        "finished": {"lastHour": _totals(minutes.values()), "last24h": _totals(hours.values())},
        "series": series(minutes, now),
        "queues": queues,
        "queuesError": queues_error,
        "supervisor": _supervisor(minutes, hours),
        "remotes": breakers,
        "remotesError": breakers_error,
    }
    return HttpResult(200, body)


def merged_by_stamp(store: Store, kind: str, first: str, end: str) -> dict[str, Figures]:
    """Every process's ``kind`` rows (``m``/``h``) of stamps ``first`` <= stamp < ``end``,
    merged per stamp."""
    merged: dict[str, Figures] = {}
    for key, figures in store.query_stats(f"{kind}-{first}", f"{kind}-{end}", MAX_STATS_ROWS).items():
        merged.setdefault(stamp_of(key), Figures()).merge(figures)
    return merged


def series(minutes: dict[str, Figures], now: datetime) -> list[dict[str, Any]]:
    """One entry per minute of the last ``SERIES_MINUTES``, oldest first, zeros where no process
    counted anything (percentiles null)."""
    out = []
    for back in range(SERIES_MINUTES - 1, -1, -1):
        minute = now - timedelta(minutes=back)
        figures = minutes.get(minute_stamp(minute), Figures())
        out.append({"minute": minute.strftime("%Y-%m-%dT%H:%M:00Z"), "submitted": figures.submitted,
                    "processed": figures.processed, "failed": figures.failed,
                    "p50Seconds": _rounded(figures.latency.percentile(0.5)),
                    "p95Seconds": _rounded(figures.latency.percentile(0.95))})
    return out


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else float(f"{seconds:.3g}")


def _totals(periods: Any) -> dict[str, int]:
    total = Figures()
    for figures in periods:
        total.merge(figures)
    return {"submitted": total.submitted, "processed": total.processed, "failed": total.failed,
            "compensated": total.compensated}


def _live(store: Store, category: Category) -> dict[str, Any]:
    count, capped = store.count_index(f"cat-{category}-", f"cat-{category}.", LIVE_COUNT_CAP)
    return {"count": count, "capped": capped}


def _supervisor(minutes: dict[str, Figures], hours: dict[str, Figures]) -> dict[str, Any]:
    """The last sweep (from the last hour's minutes, else the day's hours) and the last hour's sweeps."""
    hour = Figures()
    for figures in minutes.values():
        hour.merge(figures)
    last = hour
    if last.last_sweep_at is None:
        last = Figures()
        for figures in hours.values():
            last.merge(figures)
    at = last.last_sweep_at
    return {"lastSweepAt": at.strftime("%Y-%m-%dT%H:%M:%SZ") if at is not None else None,
            "lastDueRows": last.last_due_rows, "sweepsLastHour": hour.sweeps}


def _queues(rt: Runtime, queue_depths: QueueDepths) -> tuple[list[dict[str, Any]], str | None]:
    try:
        return queue_depths(rt, cap=QUEUE_CAP), None
    except Exception as exc:  # noqa: BLE001 - Service Bus down: the rest of the overview still renders
        log_event(logging.WARNING, "overview.queues_failed", error=repr(exc))
        return [], str(exc) or type(exc).__name__
