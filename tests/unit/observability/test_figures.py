"""The console's per-process figures (``shared.observability.figures``): histogram, recording from
committed transactions only, flushing, forgetting, retention of the stats rows, and the store
methods behind them (``check_*`` run on Azurite too: tests/integration/test_console_stats_azurite.py)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import pytest

from shared.core.effects import Transact
from shared.core.rows import Op, SearchRow, history_row_key
from shared.observability.figures import LATENCY_BOUNDS, ConsoleStats, Figures, Histogram, bucket_middle, process_id
from shared.observability.metrics import parse_committed
from shared.runtime.executor import execute
from shared.storage.memory import MemoryStore
from shared.storage.store import MAX_BATCH_OPS, Store
from shared.supervisor import sweep
from shared.supervisor.retention import purge, purge_stats
from tests.unit.harness import T0, TEST_KEYS, AgentSim, Clock, DedupBus, drive, make_runtime, post


def recorder(store: MemoryStore, clock: Clock, proc: str = "p1") -> ConsoleStats:
    store.stats = ConsoleStats(store.put_stats, proc=proc, clock=clock, background=False)
    return store.stats


# ---- histogram -----------------------------------------------------------------------------------
def test_buckets_are_fixed_log_spaced_ten_per_decade() -> None:
    assert len(LATENCY_BOUNDS) == 71
    assert LATENCY_BOUNDS[0] == pytest.approx(0.01) and LATENCY_BOUNDS[-1] == pytest.approx(100_000)
    ratios = {round(b / a, 9) for a, b in zip(LATENCY_BOUNDS, LATENCY_BOUNDS[1:], strict=False)}
    assert ratios == {round(10 ** 0.1, 9)}


def test_percentiles_are_within_a_bucket_of_the_truth() -> None:
    h = Histogram()
    values = [0.1 * i for i in range(1, 1001)]  # 0.1 .. 100 s
    for v in values:
        h.add(v)
    assert h.total == 1000
    for q, truth in ((0.5, 50.0), (0.95, 95.0), (0.99, 99.0)):
        got = h.percentile(q)
        assert got is not None and abs(got - truth) / truth < 0.13, (q, got)
    assert Histogram().percentile(0.5) is None


def test_open_ends_and_a_single_value() -> None:
    h = Histogram()
    h.add(0.0)
    assert h.percentile(0.5) == LATENCY_BOUNDS[0]
    h = Histogram()
    h.add(10 ** 7)
    assert h.percentile(0.95) == LATENCY_BOUNDS[-1]
    h = Histogram()
    h.add(1.3)
    assert bucket_middle(min(h.counts)) == h.percentile(0.5) == pytest.approx(1.3, rel=0.13)


def test_encoding_round_trips_and_skips_garbage() -> None:
    h = Histogram()
    for v in (0.5, 0.5, 2.0, 30.0):
        h.add(v)
    text = h.encode()
    assert Histogram.decode(text).counts == h.counts
    assert len(text) < 40  # compact: index:count pairs
    assert Histogram.decode("x,3:2,:1,4:z,999:1,3:1").counts == {3: 3}
    assert Histogram.decode(None).counts == {}


def test_histograms_merge_by_adding() -> None:
    a, b, both = Histogram(), Histogram(), Histogram()
    for v in (1.0, 2.0):
        a.add(v)
        both.add(v)
    for v in (3.0, 40.0, 40.0):
        b.add(v)
        both.add(v)
    a.merge(b)
    assert a.counts == both.counts and a.percentile(0.95) == both.percentile(0.95)


def test_figures_round_trip_through_a_row() -> None:
    f = Figures(submitted=3, processed=2, failed=1, compensated=1, sweeps=4, last_sweep_at=T0, last_due_rows=7)
    f.latency.add(1.5)
    back = Figures.from_row(f.to_row("m-x-p"))
    assert back.to_row("m-x-p") == f.to_row("m-x-p")
    assert "LastSweepAt" not in Figures().to_row("k")  # absent = null


def test_process_id_is_a_safe_row_key_part() -> None:
    assert process_id("a/b#c?d\\e f", 42) == "a_b_c_d_e_f-42"
    assert process_id("host-42", 42) == "host-42"  # the local fallback holds the pid already
    assert len(process_id("x" * 300, 1)) == 80


# ---- recording -------------------------------------------------------------------------------------
def test_orders_are_counted_once_from_their_committed_events() -> None:
    clock = Clock()
    rt = make_runtime(clock=clock)
    stats = recorder(rt.store, clock)  # type: ignore[arg-type]
    first = post(rt).body["orderId"]
    second = post(rt, headers={"Idempotency-Key": "k"}).body["orderId"]
    post(rt, headers={"Idempotency-Key": "k"})  # a replay: its create lost, nothing committed, not counted
    agents = AgentSim(rt)
    drive(rt, first, agents)
    drive(rt, second, agents)
    for kind in ("m", "h"):
        assert total(stats, kind, "submitted") == 2 and total(stats, kind, "processed") == 2
        assert total(stats, kind, "failed") == 0 == total(stats, kind, "compensated")
        assert sum(f.latency.total for k, f in stats.figures().items() if k[0] == kind) == 2


def test_a_failed_and_compensated_order_is_counted_so() -> None:
    clock = Clock()
    rt = make_runtime(clock=clock)
    stats = recorder(rt.store, clock)  # type: ignore[arg-type]
    step = rt.config.workflow[1].name
    drive(rt, post(rt).body["orderId"], AgentSim(rt, reject={step: "no"}))
    assert (total(stats, "m", "submitted"), total(stats, "m", "processed")) == (1, 0)
    assert total(stats, "m", "failed") == 1 == total(stats, "m", "compensated")
    assert not any(f.latency.total for f in stats.figures().values())  # latency is of processed orders


def total(stats: ConsoleStats, kind: str, name: str) -> int:
    return sum(getattr(f, name) for k, f in stats.figures().items() if k[0] == kind)


def test_the_latency_is_submit_to_processed() -> None:
    stats = ConsoleStats(lambda rows: None, proc="p", clock=Clock(), background=False)
    ops = [Op("replace", {"RowKey": "state", "CreatedAt": T0.isoformat()}, etag="*"),
           Op("create", {"RowKey": history_row_key(9), "Event": "processed",
                         "At": (T0 + timedelta(seconds=2.9)).isoformat()})]
    stats.record(parse_committed(ops))
    (minute,) = [f for k, f in stats.figures().items() if k.startswith("m-")]
    assert minute.processed == 1 and minute.latency.percentile(0.5) == pytest.approx(2.9, rel=0.13)


def test_a_transaction_that_lost_its_race_counts_nothing() -> None:
    clock = Clock()
    store = MemoryStore()
    stats = recorder(store, clock)
    event = {"RowKey": history_row_key(1), "Event": "processed", "At": T0.isoformat()}
    store.transact("o1", [Op("create", dict(event))])
    out = execute([Transact("o1", (Op("create", dict(event)),))], store, DedupBus(), keys=TEST_KEYS)  # 409: lost race
    assert out.lost_race and stats.figures() == {}
    execute([Transact("o2", (Op("create", dict(event)),))], store, DedupBus(), keys=TEST_KEYS)
    assert total(stats, "m", "processed") == 1


def test_sweeps_are_recorded() -> None:
    clock = Clock()
    rt = make_runtime(clock=clock)
    stats = recorder(rt.store, clock)  # type: ignore[arg-type]
    sweep(rt)
    clock.advance(15)
    sweep(rt)
    (minute,) = [f for k, f in stats.figures().items() if k.startswith("m-")]
    assert minute.sweeps == 2 and minute.last_sweep_at == clock() and minute.last_due_rows == 0


def test_a_store_without_a_recorder_records_nothing() -> None:
    clock = Clock()
    rt = make_runtime(clock=clock)
    drive(rt, post(rt).body["orderId"], AgentSim(rt))
    assert not [k for k in rt.store.snapshot() if k[0] == "stats"]  # type: ignore[attr-defined]


# ---- flushing -------------------------------------------------------------------------------------
class FlakyPut:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.fail = 0
        self.calls: list[list[str]] = []

    def __call__(self, rows: Mapping[str, Figures]) -> None:
        self.calls.append(list(rows))
        if self.fail:
            self.fail -= 1
            raise OSError("injected")
        self.store.put_stats(rows)


def _sweeps(stats: ConsoleStats, n: int) -> None:
    for _ in range(n):
        stats.record_sweep(1)


def test_a_flush_sends_the_changed_rows_in_one_transaction_then_nothing() -> None:
    store, clock = MemoryStore(), Clock()
    put = FlakyPut(store)
    stats = ConsoleStats(put, proc="p", clock=clock, background=False)
    _sweeps(stats, 2)
    assert stats.flush() == 2 and len(put.calls) == 1 and store.writes == 1  # the minute and the hour row
    assert stats.flush() == 0 and len(put.calls) == 1  # nothing changed: nothing sent
    rows = store.query_stats("", "\uffff", 10)
    assert list(rows) == ["h-2026112208-p", "m-202611220800-p"]
    assert all(r.sweeps == 2 for r in rows.values())


def test_a_failed_flush_keeps_the_figures_for_the_next() -> None:
    store, clock = MemoryStore(), Clock()
    put = FlakyPut(store)
    stats = ConsoleStats(put, proc="p", clock=clock, background=False)
    _sweeps(stats, 1)
    put.fail = 1
    with pytest.raises(OSError):
        stats.flush()
    assert store.query_stats("", "\uffff", 10) == {}
    _sweeps(stats, 1)
    assert stats.flush() == 2
    assert [r.sweeps for r in store.query_stats("", "\uffff", 10).values()] == [2, 2]  # the totals, not the last delta


def test_rows_are_replaced_with_running_totals_and_old_periods_forgotten() -> None:
    store, clock = MemoryStore(), Clock()
    stats = ConsoleStats(store.put_stats, proc="p", clock=clock, background=False)
    _sweeps(stats, 1)
    stats.flush()
    clock.advance(60)
    _sweeps(stats, 1)
    stats.flush()
    rows = {k: r.sweeps for k, r in store.query_stats("", "\uffff", 10).items()}
    assert rows == {"h-2026112208-p": 2, "m-202611220800-p": 1, "m-202611220801-p": 1}
    clock.advance(3 * 3600)
    _sweeps(stats, 1)
    stats.flush()
    assert sorted(stats.figures()) == ["h-2026112211-p", "m-202611221101-p"]  # sent and over: forgotten


def test_a_flush_sends_at_most_a_transaction_of_rows() -> None:
    store, clock = MemoryStore(), Clock()
    put = FlakyPut(store)
    stats = ConsoleStats(put, proc="p", clock=clock, background=False)
    put.fail = 10 ** 6
    for _ in range(120):  # two hours of a store that refuses everything
        _sweeps(stats, 1)
        with pytest.raises(OSError):
            stats.flush()
        clock.advance(60)
    put.fail = 0
    assert stats.flush() == MAX_BATCH_OPS and stats.flush() == 122 - MAX_BATCH_OPS and stats.flush() == 0
    assert max(len(c) for c in put.calls) == MAX_BATCH_OPS


def test_the_background_thread_flushes_while_dirty() -> None:
    import time

    store = MemoryStore()
    stats = ConsoleStats(store.put_stats, proc="p", interval=0.05)
    stats.record_sweep(3)
    for _ in range(100):
        if store.query_stats("", "\uffff", 10):
            break
        time.sleep(0.02)
    assert len(store.query_stats("", "\uffff", 10)) == 2


# ---- retention -------------------------------------------------------------------------------------
def test_retention_deletes_stats_rows_older_than_48_hours_paged() -> None:
    clock = Clock(T0 - timedelta(hours=60))
    rt = make_runtime(clock=clock)
    stats = recorder(rt.store, clock)  # type: ignore[arg-type]
    for _ in range(60 * 13):  # a sweep a minute for 13 hours: from 60 h ago to 47 h ago
        stats.record_sweep(0)
        stats.flush()
        clock.advance(60)
    keys = list(rt.store.query_stats("", "\uffff", 10_000))
    assert len(keys) == 13 * 60 + 13
    rt.clock = Clock(T0)  # type: ignore[assignment]
    deleted = purge_stats(rt, T0 - timedelta(hours=48), batch=50)
    left = list(rt.store.query_stats("", "\uffff", 10_000))
    assert deleted == len(keys) - len(left)
    assert [k for k in left if k.startswith("h-")] == ["h-2026112008-p1"]  # the hours that ended before it: gone
    assert min(k for k in left if k.startswith("m-")) == "m-202611200800-p1"  # minutes from the cut-off on
    assert len([k for k in left if k.startswith("m-")]) == 60 * 13 - 12 * 60


def test_the_retention_run_purges_stats_too() -> None:
    clock = Clock(T0 - timedelta(days=3))
    rt = make_runtime(clock=clock)
    stats = recorder(rt.store, clock)  # type: ignore[arg-type]
    stats.record_sweep(0)
    stats.flush()
    rt.clock = Clock(T0)  # type: ignore[assignment]
    assert purge(rt).stats_deleted == 2 and rt.store.query_stats("", "\uffff", 10) == {}


# ---- the store methods (also on Azurite) ---------------------------------------------------------
def check_stats_rows(store: Store) -> None:
    rows = {f"m-20261122080{i}-p": Figures(submitted=i, latency=Histogram({3: 1})) for i in range(5)}
    store.put_stats(rows)
    store.put_stats({"m-202611220801-p": Figures(submitted=9)})  # replace: its latency gone
    got = store.query_stats("m-202611220801", "m-202611220804", 100)
    assert [(k, r.submitted, r.latency.encode()) for k, r in got.items()] == [
        ("m-202611220801-p", 9, ""), ("m-202611220802-p", 2, "3:1"), ("m-202611220803-p", 3, "3:1")]
    assert len(store.query_stats("m-", "m.", 2)) == 2
    store.delete_stats(["m-202611220800-p", "m-202611220801-p", "m-nothing"])  # a missing row is fine
    assert list(store.query_stats("m-", "m.", 100)) == ["m-202611220802-p", "m-202611220803-p", "m-202611220804-p"]
    assert store.query_index("", "\uffff", 100) == []  # not in the search index's partition


def check_count_index_capped(store: Store) -> None:
    keys = [f"cat-inFlight-{i:05d}-o{i}" for i in range(12)] + ["cat-inFlighx-1", "cat-attention-1-o"]
    store.write_index([SearchRow(k, "o") for k in keys], [])
    assert store.count_index("cat-inFlight-", "cat-inFlight.", 100) == (12, False)
    assert store.count_index("cat-inFlight-", "cat-inFlight.", 12) == (12, False)
    assert store.count_index("cat-inFlight-", "cat-inFlight.", 5) == (5, True)
    assert store.count_index("cat-held-", "cat-held.", 5) == (0, False)


def test_memory_store_stats_rows() -> None:
    check_stats_rows(MemoryStore())


def test_memory_store_count_index_capped() -> None:
    check_count_index_capped(MemoryStore())
