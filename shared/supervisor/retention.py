"""Retention: finished orders are purged, with their history, after ``RetentionDays``.

The purge reads only what it deletes. It pages through the search index's ``fin-{day}-{id}``
rows of the days before the cut-off (one key range: the finish-day index), and for each order:

1. reads its state row; an order that is not final (a row left from before a retry) or not
   old enough is skipped (its stale ``fin`` row deleted);
2. deletes the state row (ETag-conditioned, with as many of the order's other rows as fit in
   the same transaction): from here on, the order is gone for everyone (404). A retry or any
   other write that won the race makes this fail, and the order is skipped;
3. deletes the order's other rows (history, steps) in transactions of up to 100;
4. deletes its ``fin`` row.

Its listing rows (``all``, ``cust``, ``cat``) go just before step 2, so search never lists an
order that is gone (they are put back if step 2 loses its race).

A crash anywhere leaves the ``fin`` row, so the next run finds the order again and finishes
the job (a missing state row then means "already purged: go on from step 3"). Held and
attention orders have no ``fin`` row, so they are never purged.

Before the purge, the same run moves the search index's legacy partition (``orders``, the one
partition before the shards: ``shared.storage.store``) to the shards: each order found there is
re-indexed from its state (``reindex_from_state``: the rows its state implies, in its shard), then
its legacy rows are deleted; a gone order's rows are just deleted. Until it is empty, searches read
it as one more shard and check its rows against their state row. Empty, it costs one query a run.

The same run deletes the console's stats rows (``shared.observability.figures``) older than
``STATS_KEEP`` (48 h): minute and hour rows, by key range, in pages of up to 100 (one
transaction each).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared.core.rows import ETAG, STATE_ROW, Op, SearchRow
from shared.core.statemachine import StateRow, category_of
from shared.core.statemachine.search_index import listing_keys
from shared.observability.figures import hour_stamp, minute_stamp
from shared.observability.logs import log_event
from shared.runtime import Runtime
from shared.runtime.reindex import reindex_from_state
from shared.storage.store import MAX_BATCH_OPS, Conflict

PURGE_BATCH = 100
PURGE_BUDGET_SECONDS = 60.0
STATS_KEEP = timedelta(hours=48)


@dataclass
class PurgeReport:
    purged: int = 0
    skipped: int = 0
    lost_races: int = 0
    errors: int = 0
    rows_deleted: int = 0
    stats_deleted: int = 0  # console stats rows (minute and hour) older than STATS_KEEP
    legacy_moved: int = 0  # rows of the search index's legacy partition moved to the shards
    cutoff: str = ""
    orders: list[str] = field(default_factory=list)


def purge(rt: Runtime, *, batch: int = PURGE_BATCH, budget_seconds: float = PURGE_BUDGET_SECONDS) -> PurgeReport:
    """Purge the orders that finished before the cut-off (now - RetentionDays), in batches."""
    now = rt.ctx().now
    cutoff = now - timedelta(days=rt.config.retention_days)
    report = PurgeReport(cutoff=cutoff.strftime("%Y-%m-%d"))
    deadline = time.monotonic() + budget_seconds
    try:
        report.legacy_moved = move_legacy_index(rt, batch=batch, deadline=deadline)
    except Exception as exc:  # noqa: BLE001 - searches still read the legacy rows; the next run goes on
        log_event(logging.ERROR, "retention.legacy_failed", error=repr(exc))
    try:
        report.stats_deleted = purge_stats(rt, now - STATS_KEEP, batch=batch, deadline=deadline)
    except Exception as exc:  # noqa: BLE001 - the orders' purge goes on; the next run deletes them
        log_event(logging.ERROR, "retention.stats_failed", error=repr(exc))
    while time.monotonic() < deadline:
        # the finish days strictly before the cut-off's day: an order is kept at least RetentionDays
        rows = rt.store.query_index("fin-", f"fin-{cutoff.strftime('%Y%m%d')}", batch)
        purged_before = report.purged
        for row in rows:
            _purge_one(rt, row, cutoff, report)
        if len(rows) < batch or report.purged == purged_before:  # done, or only rows to retry next time
            break
    if report.purged or report.errors or report.lost_races or report.stats_deleted or report.legacy_moved:
        log_event(logging.INFO, "retention.purge", purged=report.purged, skipped=report.skipped,
                  statsDeleted=report.stats_deleted, legacyMoved=report.legacy_moved,
                  lostRaces=report.lost_races, errors=report.errors, rowsDeleted=report.rows_deleted,
                  cutoff=report.cutoff)
    return report


def move_legacy_index(rt: Runtime, *, batch: int = PURGE_BATCH, deadline: float | None = None) -> int:
    """Move the legacy partition's rows to the shards, ``batch`` rows a page, until none is left or
    ``deadline`` (monotonic) passes: each order re-indexed from its state, then its rows there
    deleted (an order whose re-index failed keeps them: the next run tries again). The rows moved."""
    moved = 0
    while deadline is None or time.monotonic() < deadline:
        rows = rt.store.legacy_index(batch)
        done = {oid for oid in dict.fromkeys(r.order_id for r in rows) if reindex_from_state(rt, oid)}
        keys = [r.row_key for r in rows if r.order_id in done]
        if keys:
            rt.store.drop_legacy_index(keys)
            moved += len(keys)
        if len(rows) < batch or not keys:
            break
    return moved


def purge_stats(rt: Runtime, cutoff: datetime, *, batch: int = PURGE_BATCH, deadline: float | None = None) -> int:
    """Delete the stats rows of minutes and hours that ended before ``cutoff``, ``batch`` per
    transaction (at most 100), until none is left or ``deadline`` (monotonic) passes."""
    deleted = 0
    for kind, stamp in (("m", minute_stamp(cutoff)), ("h", hour_stamp(cutoff))):
        while deadline is None or time.monotonic() < deadline:
            keys = list(rt.store.query_stats(f"{kind}-", f"{kind}-{stamp}", min(batch, 100)))
            if keys:
                rt.store.delete_stats(keys)
                deleted += len(keys)
            if len(keys) < min(batch, 100):
                break
    return deleted


def _purge_one(rt: Runtime, fin: SearchRow, cutoff: datetime, report: PurgeReport) -> None:
    order_id = fin.order_id
    try:
        entity = rt.store.read_row(order_id, STATE_ROW)
        if entity is not None:
            state = StateRow.from_entity(entity)
            if not category_of(state).final or state.finished_at is None or state.finished_at >= cutoff:
                report.skipped += 1
                if not category_of(state).final:  # retried since: its next final transition indexes it again
                    rt.store.write_index([], [fin.row_key])
                return
            _delete_listing_rows(rt, fin)  # first: search never lists an order that is gone
            try:
                _delete_rows(rt, order_id, state_etag=entity[ETAG], report=report)
            except Conflict:
                reindex_from_state(rt, order_id)  # it is still here: list it again
                raise
        else:
            _delete_listing_rows(rt, fin)  # gone already: a run that crashed went this far
        _delete_rows(rt, order_id, state_etag=None, report=report)
        rt.store.write_index([], [fin.row_key])  # last: while it exists, the purge is not done
        report.purged += 1
        report.orders.append(order_id)
    except Conflict:
        report.lost_races += 1  # the order changed (or a row went) meanwhile: the next run sees it again
    except Exception as exc:  # one order must not stop the purge; its fin row stays for next time
        report.errors += 1
        log_event(logging.ERROR, "retention.order_failed", order_id=order_id, error=repr(exc))


def _delete_rows(rt: Runtime, order_id: str, *, state_etag: str | None, report: PurgeReport) -> None:
    """Delete the order's rows: with ``state_etag``, only the first transaction (the state row,
    conditioned on it, and what fits beside it); without, every row left."""
    while True:
        keys = rt.store.partition_keys(order_id, MAX_BATCH_OPS)
        if not keys:
            return
        if state_etag is not None:
            others = [k for k, _e in keys if k != STATE_ROW][:MAX_BATCH_OPS - 1]
            ops = [Op("delete", {"RowKey": STATE_ROW}, etag=state_etag)]
            ops += [Op("delete", {"RowKey": k}, etag="*") for k in others]
            rt.store.transact(order_id, ops)
            report.rows_deleted += len(ops)
            return
        rt.store.transact(order_id, [Op("delete", {"RowKey": k}, etag="*") for k, _e in keys])
        report.rows_deleted += len(keys)


def _delete_listing_rows(rt: Runtime, fin: SearchRow) -> None:
    rt.store.write_index([], list(listing_keys(fin.order_id, fin.rev or "", fin.customer_key or "", fin.category)))
