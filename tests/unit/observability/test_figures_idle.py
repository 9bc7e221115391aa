"""Idle sweeps in the console's figures (``shared.observability.figures``): an idle app writes its stats
rows once per heartbeat, not after every sweep, and no sweep is ever lost from the counts."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from shared.observability.figures import IDLE_SWEEP_HEARTBEAT, ConsoleStats, Figures
from shared.storage.memory import MemoryStore
from shared.supervisor import sweep
from tests.unit.harness import Clock, make_runtime


class Put:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.calls: list[list[str]] = []
        self.fail = False

    def __call__(self, rows: Mapping[str, Figures]) -> None:
        self.calls.append(list(rows))
        if self.fail:
            raise OSError("injected")
        self.store.put_stats(rows)


def setup() -> tuple[MemoryStore, Clock, Put, ConsoleStats]:
    store, clock = MemoryStore(), Clock()
    put = Put(store)
    return store, clock, put, ConsoleStats(put, proc="p", clock=clock, background=False)


def stored(store: MemoryStore) -> dict[str, int]:
    return {k: r.sweeps for k, r in store.query_stats("", "\uffff", 100).items()}


def test_idle_sweeps_are_written_once_per_heartbeat() -> None:
    store, clock, put, stats = setup()
    stats.record_sweep(0)
    assert stats.flush() == 2  # the first: the console sees the Supervisor at once
    for _ in range(8):  # 2 minutes of idle sweeps at the default 15 s schedule, a flush every 5 s
        for _ in range(3):
            clock.advance(5)
            stats.flush()
        stats.record_sweep(0)
    assert len(put.calls) == 1 + int(2 * 60 / IDLE_SWEEP_HEARTBEAT.total_seconds())  # not 1 + 8
    stats.flush(force=True)
    assert stored(store)["h-2026112208-p"] == 9  # every sweep counted in the end


def test_the_heartbeat_sends_the_exact_counts_of_every_minute_it_held() -> None:
    store, clock, _put, stats = setup()
    stats.record_sweep(0)
    stats.flush()
    for _ in range(4):  # 08:00:15 .. 08:01:00: two minutes' rows changed by idle sweeps only
        clock.advance(15)
        stats.record_sweep(0)
        stats.flush()
    assert stored(store) == {"h-2026112208-p": 5, "m-202611220800-p": 4, "m-202611220801-p": 1}


def test_idle_sweeps_go_with_the_next_change_and_a_busy_sweep_is_not_held() -> None:
    store, clock, _put, stats = setup()
    stats.record_sweep(0)
    stats.flush()
    clock.advance(15)
    stats.record_sweep(0)
    assert stats.flush() == 0  # held: only the sweep count changed
    clock.advance(15)
    stats.record_sweep(3)  # a sweep with due rows is news
    assert stats.flush() == 2
    assert stored(store)["m-202611220800-p"] == 3
    (minute,) = [f for k, f in stats.figures().items() if k.startswith("m-")]
    assert minute.last_due_rows == 3 and minute.last_sweep_at == clock()


def test_a_failed_heartbeat_keeps_the_idle_sweeps_for_the_next_flush() -> None:
    store, clock, put, stats = setup()
    put.fail = True
    stats.record_sweep(0)
    with pytest.raises(OSError):
        stats.flush()
    put.fail = False
    clock.advance(15)
    stats.record_sweep(0)
    assert stats.flush() == 2  # nothing was ever sent: still due
    assert stored(store)["m-202611220800-p"] == 2


def test_the_last_flush_sends_the_held_idle_sweeps() -> None:
    store, clock, _put, stats = setup()
    stats.record_sweep(0)
    stats.flush()
    clock.advance(15)
    stats.record_sweep(0)
    assert stats.flush() == 0
    assert stats.flush(force=True) == 2  # forced: the idle rows go too
    assert stored(store)["m-202611220800-p"] == 2


def test_held_idle_figures_are_not_forgotten_before_they_are_sent() -> None:
    store, clock, _put, stats = setup()
    stats.record_sweep(0)
    stats.flush()
    clock.advance(15)
    stats.record_sweep(0)  # held
    clock.advance(10 * 60)  # the minute is long over (kept 5 min once sent)
    stats.record(_committed_nothing())  # counts nothing: no change
    assert stats.flush() == 2  # the heartbeat, long after: the held minute is still there
    assert stored(store)["m-202611220800-p"] == 2


def _committed_nothing() -> Any:
    from shared.observability.metrics import Committed
    return Committed(events=(), steps={}, state=None)


def test_an_idle_supervisor_writes_no_stats_row_between_heartbeats() -> None:
    clock = Clock()
    rt = make_runtime(clock=clock)
    store: MemoryStore = rt.store  # type: ignore[assignment]
    store.stats = ConsoleStats(store.put_stats, proc="p", clock=clock, background=False)
    sweep(rt)
    store.stats.flush()
    writes = store.writes
    for _ in range(3):
        clock.advance(15)
        sweep(rt)
        store.stats.flush()
    assert store.writes == writes
    clock.advance(15)
    sweep(rt)
    store.stats.flush()  # 60 s after the last send
    assert store.writes == writes + 1
    assert stored(store)["m-202611220801-p"] == 1 and stored(store)["h-2026112208-p"] == 5
    assert timedelta(seconds=60) == IDLE_SWEEP_HEARTBEAT
