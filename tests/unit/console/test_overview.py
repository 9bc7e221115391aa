"""``GET /api/overview`` (``shared.console.overview.get_overview``): issue 12's contract, from the stats
rows of several processes, the capped live counts and the queues (injected here)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from shared.console.overview import LIVE_COUNT_CAP, QUEUE_CAP, SERIES_MINUTES, get_overview
from shared.core.rows import SearchRow
from shared.observability.figures import ConsoleStats, Figures, hour_stamp, minute_stamp
from shared.runtime import Runtime
from shared.storage.memory import MemoryStore
from shared.storage.store import index_partitions
from tests.unit.harness import T0, AgentSim, Clock, drive, make_runtime, post

NOW = T0 + timedelta(minutes=30, seconds=20)  # 08:30:20
QUEUES = [{"setting": "SchedulerQueue", "name": "scheduler", "active": 0, "deadLetter": 1,
           "activeCapped": False, "deadLetterCapped": False}]


def no_queues(rt: Runtime, cap: int) -> list[dict[str, Any]]:
    assert cap == QUEUE_CAP
    return QUEUES


def runtime() -> Any:
    return make_runtime(clock=Clock(NOW))


def put(store: MemoryStore, key: str, *, latencies: tuple[float, ...] = (), **figures: Any) -> None:
    f = Figures(**figures)
    for seconds in latencies:
        f.latency.add(seconds)
    store.put_stats({key: f})


def overview(rt: Any, queues: Any = no_queues) -> dict[str, Any]:
    result = get_overview(rt, queue_depths=queues)
    assert result.status == 200
    return result.body  # type: ignore[no-any-return]


def test_an_empty_store_gives_the_contracts_shape_with_zeros() -> None:
    body = overview(runtime())
    assert list(body) == ["asOf", "live", "finished", "series", "queues", "queuesError", "supervisor", "remotes",
                          "remotesError"]
    assert body["asOf"] == "2026-11-22T08:30:20.000000Z"
    assert body["live"] == {"inFlight": {"count": 0, "capped": False}, "attention": {"count": 0, "capped": False}}
    zeros = {"submitted": 0, "processed": 0, "failed": 0, "compensated": 0}
    assert body["finished"] == {"lastHour": zeros, "last24h": zeros}
    assert body["supervisor"] == {"lastSweepAt": None, "lastDueRows": None, "sweepsLastHour": 0}
    assert body["queues"] == QUEUES and body["queuesError"] is None
    assert [remote["state"] for remote in body["remotes"]] == ["closed"] * 4 and body["remotesError"] is None


def test_the_series_is_60_minutes_oldest_first_zero_filled() -> None:
    rt = runtime()
    put(rt.store, f"m-{minute_stamp(NOW)}-a", submitted=2, processed=1, latencies=(1.3,))
    put(rt.store, f"m-{minute_stamp(NOW - timedelta(minutes=59))}-a", failed=1)
    put(rt.store, f"m-{minute_stamp(NOW - timedelta(minutes=60))}-a", submitted=50)  # outside the hour
    put(rt.store, f"m-{minute_stamp(NOW + timedelta(minutes=1))}-a", submitted=70)  # a clock ahead: not yet
    series = overview(rt)["series"]
    assert len(series) == SERIES_MINUTES
    assert series[0]["minute"] == "2026-11-22T07:31:00Z" and series[-1]["minute"] == "2026-11-22T08:30:00Z"
    assert series[0] == {"minute": "2026-11-22T07:31:00Z", "submitted": 0, "processed": 0, "failed": 1,
                         "p50Seconds": None, "p95Seconds": None}
    assert series[-1]["submitted"] == 2 and series[-1]["p50Seconds"] == pytest.approx(1.3, rel=0.13)
    assert all(m["submitted"] == 0 and m["p50Seconds"] is None for m in series[1:-1])


def test_processes_are_merged_per_minute_and_percentiles_from_the_merged_histograms() -> None:
    rt = runtime()
    minute = minute_stamp(NOW - timedelta(minutes=1))
    put(rt.store, f"m-{minute}-a", processed=9, latencies=(1.0,) * 9)
    put(rt.store, f"m-{minute}-b", processed=1, submitted=3, latencies=(30.0,))
    point = overview(rt)["series"][-2]
    assert point["processed"] == 10 and point["submitted"] == 3
    assert point["p50Seconds"] == pytest.approx(1.0, rel=0.13)
    assert point["p95Seconds"] == pytest.approx(30.0, rel=0.13)  # the one slow order of ten is the 95th percentile


def test_finished_last_hour_from_minutes_and_last_24h_from_hours() -> None:
    rt = runtime()
    put(rt.store, f"m-{minute_stamp(NOW)}-a", submitted=1, processed=1)
    put(rt.store, f"m-{minute_stamp(NOW - timedelta(minutes=40))}-b", submitted=2, failed=1, compensated=1)
    put(rt.store, f"m-{minute_stamp(NOW - timedelta(minutes=90))}-b", submitted=100)
    put(rt.store, f"h-{hour_stamp(NOW)}-a", submitted=1, processed=1)
    put(rt.store, f"h-{hour_stamp(NOW - timedelta(hours=1))}-b", submitted=102, failed=1, compensated=1)
    put(rt.store, f"h-{hour_stamp(NOW - timedelta(hours=23))}-c", processed=7)
    put(rt.store, f"h-{hour_stamp(NOW - timedelta(hours=24))}-c", processed=1000)  # over a day ago
    finished = overview(rt)["finished"]
    assert finished["lastHour"] == {"submitted": 3, "processed": 1, "failed": 1, "compensated": 1}
    assert finished["last24h"] == {"submitted": 103, "processed": 8, "failed": 1, "compensated": 1}


def test_the_supervisor_figures() -> None:
    rt = runtime()
    last = NOW - timedelta(seconds=35)
    put(rt.store, f"m-{minute_stamp(last)}-a", sweeps=3, last_sweep_at=last, last_due_rows=4)
    put(rt.store, f"m-{minute_stamp(last)}-b", sweeps=2, last_sweep_at=last - timedelta(seconds=5), last_due_rows=9)
    earlier = NOW - timedelta(minutes=10)
    put(rt.store, f"m-{minute_stamp(earlier)}-b", sweeps=5, last_sweep_at=earlier, last_due_rows=1)
    assert overview(rt)["supervisor"] == {"lastSweepAt": "2026-11-22T08:29:45Z", "lastDueRows": 4, "sweepsLastHour": 10}


def test_the_last_sweep_of_the_day_when_none_in_the_hour() -> None:
    rt = runtime()
    at = NOW - timedelta(hours=5)
    put(rt.store, f"h-{hour_stamp(at)}-a", sweeps=40, last_sweep_at=at, last_due_rows=2)
    assert overview(rt)["supervisor"] == {"lastSweepAt": "2026-11-22T03:30:20Z", "lastDueRows": 2, "sweepsLastHour": 0}


@pytest.mark.parametrize(("rows", "expected"), [(999, (999, False)), (1000, (1000, False)), (1001, (1000, True))])
def test_live_counts_are_capped(rows: int, expected: tuple[int, bool]) -> None:
    rt = runtime()
    rt.store.write_index([SearchRow(f"cat-inFlight-{i:017d}-o{i}", f"o{i}") for i in range(rows)]
                         + [SearchRow("cat-attention-1-o", "o"), SearchRow("cat-processed-1-o", "o")], [])
    live = overview(rt)["live"]
    assert LIVE_COUNT_CAP == 1000
    assert (live["inFlight"]["count"], live["inFlight"]["capped"]) == expected
    assert live["attention"] == {"count": 1, "capped": False}


def test_a_service_bus_failure_empties_the_queues_only() -> None:
    def down(rt: Runtime, cap: int) -> list[dict[str, Any]]:
        raise ConnectionError("Service Bus unreachable")

    rt = runtime()
    put(rt.store, f"m-{minute_stamp(NOW)}-a", submitted=1)
    body = overview(rt, down)
    assert body["queues"] == [] and body["queuesError"] == "Service Bus unreachable"
    assert body["finished"]["lastHour"]["submitted"] == 1


def test_the_overview_reads_four_ranges_two_rows_per_remote_and_no_order() -> None:
    rt = runtime()
    orders = [post(rt).body["orderId"] for _ in range(30)]
    for order_id in orders:
        drive(rt, order_id, AgentSim(rt))
    rt.store.reads.clear()
    overview(rt)
    # two capped counts of the search index (a request per partition: ``SEARCH_SHARDS`` and the legacy one)
    searched = ["search"] * 2 * len(index_partitions(rt.store.shards))
    assert sorted(table for table, _ in rt.store.reads if table != "state") == [*searched, "stats", "stats"]
    state_partitions = [partition for table, partition in rt.store.reads if table == "state"]
    assert len(state_partitions) == 2 * 4  # a point read and a capped count per remote (four agents)
    assert not set(state_partitions) & set(orders)


def test_what_a_process_records_shows_in_the_overview() -> None:
    clock = Clock(NOW)
    rt = make_runtime(clock=clock)
    rt.store.stats = ConsoleStats(rt.store.put_stats, proc="p", clock=clock, background=False)
    other = ConsoleStats(rt.store.put_stats, proc="q", clock=clock, background=False)
    oid = post(rt).body["orderId"]
    drive(rt, oid, AgentSim(rt))
    other.record_sweep(5)
    rt.store.stats.flush()
    other.flush()
    body = overview(rt)
    assert body["finished"]["lastHour"] == {"submitted": 1, "processed": 1, "failed": 0, "compensated": 0}
    assert body["finished"]["last24h"] == body["finished"]["lastHour"]
    assert sum(m["processed"] for m in body["series"]) == 1
    assert body["supervisor"]["lastDueRows"] == 5 and body["supervisor"]["sweepsLastHour"] >= 1
    assert body["live"]["inFlight"]["count"] == 0
