"""Retention (``shared.supervisor.retention.purge``): finished orders older than RetentionDays go with their
history and index rows; held and attention orders never; a crash or a failure part way is
finished by the next run; the purge reads only what it deletes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shared.api.orders import get_order
from shared.core.rows import STATE_ROW, Op, SearchRow, history_row_key
from shared.core.states import Category
from shared.supervisor.retention import purge
from tests.unit.api.test_search import (
    Agents,
    LossyRuntime,
    Probe,
    clone,
    make,
    new_order,
    ok,
    probe,
    template,
)
from tests.unit.harness import T0, Crash, state

DAY = timedelta(days=1)


def _gone(rt: LossyRuntime, oid: str) -> None:
    store = probe(rt)
    assert store.partition(oid) == set()  # state, order, steps and history
    assert store.rows_of(oid) == {}
    assert not any(oid in key for key in store.search_rows())
    assert get_order(rt, oid).status == 404


def _whole(rt: LossyRuntime, oid: str) -> None:
    store = probe(rt)
    keys = store.partition(oid)
    assert {"order", "state"} <= keys and any(k.startswith("history-") for k in keys)
    assert any(k.startswith("all-") for k in store.rows_of(oid))
    assert get_order(rt, oid).status == 200


def test_finished_orders_older_than_retention_are_purged_with_history_and_index_rows() -> None:
    rt = make(retention_days=30)
    agents = Agents(rt)
    fates = ("processed", "dismissed", "terminated")
    old = [new_order(rt, agents, fate) for fate in fates]
    rt.clock.advance(29 * 86400)
    recent = [new_order(rt, agents, fate) for fate in fates]
    rt.clock.advance(2 * 86400)  # T0 + 31 days: the first ones finished 31 days ago, the others 2
    report = purge(rt)
    assert sorted(report.orders) == sorted(old) and report.purged == 3
    assert (report.errors, report.lost_races) == (0, 0)
    for oid in old:
        _gone(rt, oid)
    for oid in recent:
        _whole(rt, oid)
    assert {o["orderId"] for o in ok(rt, limit=200)["orders"]} == set(recent)
    assert purge(rt).purged == 0  # nothing left to do


def test_held_and_attention_orders_are_never_purged() -> None:
    rt = make(retention_days=1)
    agents = Agents(rt)
    keep = {fate: new_order(rt, agents, fate) for fate in ("held", "failed", "compFailed", "inFlight")}
    done = new_order(rt, agents, "processed")
    rt.clock.advance(365 * 86400)
    report = purge(rt)
    assert report.orders == [done]
    for oid in keep.values():
        _whole(rt, oid)
    assert {o["orderId"] for o in ok(rt, state="attention")["orders"]} == {
        keep["held"], keep["failed"], keep["compFailed"]}
    # and their index has no finish-day row a purge could find
    assert not any(k.startswith("fin-") for k in probe(rt).search_rows())


def test_an_order_is_kept_at_least_retention_days() -> None:
    rt = make(retention_days=30)
    oid = new_order(rt, Agents(rt), "processed")  # finished at T0 (08:00)
    finished = T0
    for at in (finished + 30 * DAY - timedelta(seconds=1), finished + 30 * DAY + timedelta(hours=1),
               finished.replace(hour=0) + 31 * DAY - timedelta(microseconds=1)):
        rt.clock.now = at
        assert purge(rt).purged == 0, at
        _whole(rt, oid)
    rt.clock.now = finished.replace(hour=0) + 31 * DAY  # the cut-off is past its finish day
    assert purge(rt).orders == [oid]
    _gone(rt, oid)


def test_retention_days_setting_is_used() -> None:
    rt = make(retention_days=7)
    oid = new_order(rt, Agents(rt), "processed")
    rt.clock.advance(8 * 86400)
    report = purge(rt)
    assert report.orders == [oid] and report.cutoff == (T0 + 8 * DAY - 7 * DAY).strftime("%Y-%m-%d")


def _big(rt: LossyRuntime, agents: Agents, extra_events: int = 150) -> str:
    """A processed order with more rows than one transaction takes (a long history)."""
    oid = new_order(rt, agents, "processed")
    st = state(rt, oid)
    last = rt.store.read_history(oid, st["EventSeq"] - 1, 1)[0].to_entity()
    rows = [{**{k: v for k, v in last.items() if not k.startswith("_") and k != "PartitionKey"},
             "RowKey": history_row_key(st["EventSeq"] + n), "Seq": st["EventSeq"] + n}
            for n in range(1, extra_events + 1)]
    for i in range(0, len(rows), 100):
        rt.store.transact(oid, [Op("create", r) for r in rows[i:i + 100]])
    assert len(probe(rt).partition(oid)) > 150
    return oid


def test_a_crash_between_transactions_is_finished_by_the_next_run() -> None:
    rt = make(retention_days=30)
    agents = Agents(rt)
    oid = _big(rt, agents)
    rt.clock.advance(40 * 86400)
    store = probe(rt)
    store.transactions_left, store.crash = 1, Crash("killed after the first transaction")
    try:
        purge(rt)
        raise AssertionError("the purge should have crashed")
    except Crash:
        pass
    store.transactions_left = None
    # the state row went first: the order is gone for everyone; the rest and the fin row are left
    assert get_order(rt, oid).status == 404
    assert STATE_ROW not in store.partition(oid) and len(store.partition(oid)) > 50
    assert any(k.startswith("fin-") for k in store.rows_of(oid))
    report = purge(rt)
    assert report.orders == [oid] and report.errors == 0
    _gone(rt, oid)


def test_a_failed_transaction_is_counted_and_retried_by_the_next_run() -> None:
    rt = make(retention_days=30)
    agents = Agents(rt)
    oid = _big(rt, agents)
    rt.clock.advance(40 * 86400)
    store = probe(rt)
    store.transactions_left = 1  # then OSError: the order's second transaction fails
    report = purge(rt)
    assert (report.errors, report.purged) == (1, 0)
    assert get_order(rt, oid).status == 404  # its first transaction took the state row
    store.transactions_left = None
    assert purge(rt).orders == [oid]
    _gone(rt, oid)


def test_a_crash_after_the_first_transaction_of_a_run_is_finished_by_the_next_run() -> None:
    rt = make(retention_days=30)
    agents = Agents(rt)
    first, second = new_order(rt, agents, "processed"), new_order(rt, agents, "dismissed")
    rt.clock.advance(40 * 86400)
    store = probe(rt)
    store.transactions_left, store.crash = 1, Crash("killed")
    try:
        purge(rt)
        raise AssertionError("the purge should have crashed")
    except Crash:
        pass
    store.transactions_left = None
    assert purge(rt).purged == 1  # the other one was purged before the crash
    _gone(rt, first)
    _gone(rt, second)


def test_a_crash_before_the_index_rows_are_deleted_is_finished_by_the_next_run() -> None:
    rt = make(retention_days=30)
    oid = new_order(rt, Agents(rt), "processed")
    rt.clock.advance(40 * 86400)
    store = probe(rt)
    # the listing rows' delete fails; it comes before the order's rows go (so that search never
    # lists an order that is gone), so the order is still whole, and its fin row still there
    store.fail_index_writes = 1
    report = purge(rt)
    assert report.errors == 1 and report.purged == 0
    assert STATE_ROW in store.partition(oid) and any(k.startswith("fin-") for k in store.rows_of(oid))
    report = purge(rt)
    assert report.orders == [oid]
    _gone(rt, oid)


def test_a_purge_that_loses_the_race_for_the_state_row_leaves_the_order_whole() -> None:
    rt = make(retention_days=30)
    oid = new_order(rt, Agents(rt), "processed")
    rt.clock.advance(40 * 86400)
    store = probe(rt)

    def touch(order_id: str) -> None:  # someone writes the state row right after the purge read it
        store.after_state_read = None
        row = store.read_row(order_id, STATE_ROW)
        assert row is not None
        store.transact(order_id, [Op("replace", {k: v for k, v in row.items() if k != "PartitionKey"},
                                     etag=row["_etag"])])

    store.after_state_read = touch
    report = purge(rt)
    assert (report.lost_races, report.purged) == (1, 0)
    _whole(rt, oid)
    assert any(k.startswith("fin-") for k in store.rows_of(oid))
    assert purge(rt).orders == [oid]


def test_a_finish_day_row_of_an_order_no_longer_final_is_dropped_not_purged() -> None:
    rt = make(retention_days=30)
    oid = new_order(rt, Agents(rt), "held")
    store = probe(rt)
    store.write_index([SearchRow(f"fin-{T0:%Y%m%d}-{oid}", oid, Category.PROCESSED, rev="x", customer_key="y")], [])
    rt.clock.advance(40 * 86400)
    report = purge(rt)
    assert (report.purged, report.skipped) == (0, 1)
    _whole(rt, oid)
    assert not any(k.startswith("fin-") for k in store.search_rows())


def test_a_fin_row_whose_order_is_gone_finishes_its_index_rows() -> None:
    rt = make(retention_days=30)
    oid = new_order(rt, Agents(rt), "processed")
    store = probe(rt)
    keys = sorted(store.partition(oid))
    store.transact(oid, [Op("delete", {"RowKey": k}, etag="*") for k in keys])
    rt.clock.advance(40 * 86400)
    assert purge(rt).orders == [oid]
    _gone(rt, oid)


def test_the_purge_reads_only_what_it_deletes() -> None:
    rt = make(retention_days=30)
    agents = Agents(rt)
    processed, held = template(rt, new_order(rt, agents, "processed")), template(rt, new_order(rt, agents, "held"))
    now = T0 + 90 * DAY
    old, kept = [], []
    for i in range(120):
        created = T0 + DAY + timedelta(minutes=i)
        old.append(clone(rt, processed, created, finished=created + timedelta(seconds=5)))  # 89 days ago
    for i in range(300):
        created = now - 10 * DAY + timedelta(minutes=i)
        kept.append(clone(rt, processed, created, finished=created + timedelta(seconds=5)))
        if i % 10 == 0:
            kept.append(clone(rt, held, created - 80 * DAY))
    rt.clock.now = now
    store = probe(rt)
    store.reset_counts()
    report = purge(rt, batch=50, budget_seconds=3600)  # the in-memory store is slow; the budget is not tested here
    assert report.purged == 121 and set(report.orders) >= set(old)  # and the processed order made at T0
    # the index: only finish-day rows of the days before the cut-off, each read once
    assert [q[:3] for q in store.index_queries] == [("fin-", f"fin-{(now - 30 * DAY):%Y%m%d}", 50)] * 3
    assert store.index_rows_read == 121
    # the state table: only the partitions of the orders it deleted
    assert set(store.state_reads()) == set(report.orders)
    assert len(store.state_reads()) <= 3 * report.purged  # state row, keys, keys again (empty)
    left = {k[1] for k in store.snapshot() if k[0] == "state"}
    assert left >= set(kept) and not left & set(report.orders)


def _state_rows(rt: Any) -> int:
    return sum(1 for k in rt.store.snapshot() if k[0] == "state")


def test_purge_stops_when_every_order_fails() -> None:
    rt = make(retention_days=30)
    agents = Agents(rt)
    for _ in range(3):
        new_order(rt, agents, "processed")
    rt.clock.advance(40 * 86400)
    store: Probe = probe(rt)
    store.transactions_left = 0  # every transaction fails
    before = _state_rows(rt)
    report = purge(rt, batch=2)
    assert (report.purged, report.errors) == (0, 2)
    assert _state_rows(rt) == before
