"""The gate's cached closed row (``shared.agent.cache``): a closed breaker costs one point read
per ``BreakerCacheSeconds`` instead of one per call, failures are still counted and still open it,
and a cached row never admits a call once this instance has seen or made the breaker anything
else. The cost: another instance's opening is seen up to the cache's lifetime later."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.agent.cache import ClosedRowCache
from shared.agent.gate import BreakerGate
from shared.agent.guard import hold
from shared.core.breaker.state import BreakerPolicy, BreakerRow, BreakerState
from shared.core.breaker.waiting import WaitingStep
from shared.messaging import MemoryBus
from shared.settings import Settings
from shared.storage.breakers import read_breaker, write_breaker
from shared.storage.memory import MemoryStore
from shared.storage.waiting import waiting_steps
from tests.unit.agent.test_gate import Clock
from tests.unit.core.breaker.test_state import REQUIRED_VALUES

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
TTL = timedelta(seconds=1)
POLICY = BreakerPolicy(threshold=3, window=timedelta(seconds=10), cool_down=timedelta(seconds=5),
                       probe_lease=timedelta(seconds=10), cache=TTL)


class CountingStore(MemoryStore):
    """A MemoryStore that counts the breaker's point reads and can run something during one."""

    def __init__(self) -> None:
        super().__init__()
        self.point_reads = 0
        self.during_next_read: Callable[[], None] | None = None
        self.down = False

    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None:
        if self.down:
            raise ConnectionError("table storage unreachable")
        self.point_reads += 1
        row = super().read_row(order_id, row_key)
        hook, self.during_next_read = self.during_next_read, None
        if hook is not None:
            hook()  # another thread of the instance, between this read and its return
        return row


def gate(store: Any, clock: Clock, name: str = "a", policy: BreakerPolicy = POLICY,
         bus: MemoryBus | None = None) -> BreakerGate:
    return BreakerGate(store, "shipping", policy, name, bus or MemoryBus(), "alerts", now=clock)


def calls(g: BreakerGate, clock: Clock, n: int, every: float) -> list[str]:
    """``n`` calls ``every`` seconds apart, each answered 200 (a success outside a probe)."""
    admissions = []
    for _ in range(n):
        decision = g.admit()
        admissions.append(str(decision.admission))
        g.record(200, probe_id=decision.probe_id, counted=decision.failures)
        clock.advance(every)
    return admissions


def open_it(store: MemoryStore, at: datetime) -> None:
    """Another instance opened the breaker at ``at``."""
    row = read_breaker(store, "shipping")
    write_breaker(store, BreakerRow("shipping", state=BreakerState.OPEN, failures=3, opened_at=at,
                                    retry_at=at + POLICY.cool_down, opens=row.opens + 1, etag=row.etag))


def test_a_closed_breaker_is_read_once_per_cache_lifetime_not_once_per_call() -> None:
    store, clock = CountingStore(), Clock()
    assert calls(gate(store, clock), clock, 100, every=0.05) == ["call"] * 100  # 5 s of calls
    assert store.point_reads == 5  # one per second
    uncached, clock = CountingStore(), Clock()
    calls(gate(uncached, clock, policy=BreakerPolicy(threshold=3, cache=timedelta(0))), clock, 100, every=0.05)
    assert uncached.point_reads == 100


def test_failures_are_still_counted_and_still_open_it_at_once() -> None:
    store, bus, clock = CountingStore(), MemoryBus(), Clock()
    a = gate(store, clock, bus=bus)
    calls(a, clock, 3, every=0.1)  # cached: one read
    for _ in range(3):
        assert a.admit().admission == "call"
        a.record(503)  # each failure reads and writes the row; the cache is gone
    row = read_breaker(store, "shipping")
    assert row.state is BreakerState.OPEN and row.failures == 3
    assert [m.body["state"] for m in bus.take("alerts")] == ["open"]
    assert a.admit().admission == "wait"  # within the cache's lifetime of its last clean read


def test_a_failure_drops_the_cache_so_the_next_call_sees_the_count() -> None:
    store, clock = CountingStore(), Clock()
    a = gate(store, clock)
    assert a.admit().admission == "call"
    a.record("timeout")
    reads = store.point_reads
    admitted = a.admit()
    assert store.point_reads == reads + 1 and admitted.failures == 1  # read again: its answer resets the count
    a.record(200, counted=admitted.failures)
    assert read_breaker(store, "shipping").failures == 0


def test_calls_admitted_while_a_failure_is_being_recorded_read_the_row() -> None:
    """From the moment a call fails, the instance's other threads stop trusting the copy (and
    once the count is written they see it)."""
    store, clock = CountingStore(), Clock()
    a = gate(store, clock)
    assert a.admit().admission == "call"
    meanwhile: list[int] = []

    def other_thread() -> None:
        before = store.point_reads
        a.admit()
        meanwhile.append(store.point_reads - before)

    store.during_next_read = other_thread
    a.record(503)
    assert meanwhile == [1]
    assert a.admit().failures == 1  # the copy the other thread read before the write is not kept


def test_a_failure_it_could_not_record_still_drops_the_cache() -> None:
    """The store was down when the failure came back: the next call reads the row (and so sees
    another instance's count or opening) instead of trusting the copy."""
    store, clock = CountingStore(), Clock()
    a = gate(store, clock)
    assert a.admit().admission == "call"
    store.down = True
    assert a.record("timeout") is None  # not recorded: the breaker never stops the agent
    store.down = False
    open_it(store, clock.now)
    assert a.admit().admission == "wait"


def test_another_instances_opening_is_seen_within_the_cache_lifetime() -> None:
    """The trade: up to TTL of calls still reach a remote another instance found dead."""
    store, clock = CountingStore(), Clock()
    a = gate(store, clock)
    assert a.admit().admission == "call"
    open_it(store, clock.now)
    clock.advance(0.5)
    assert a.admit().admission == "call"  # served from the copy read before the opening
    clock.advance(0.5)
    assert a.admit().admission == "wait"  # the copy expired: read, open


def test_once_it_read_the_breaker_open_no_cached_row_admits_a_call() -> None:
    store, clock = CountingStore(), Clock()
    a = gate(store, clock)
    open_it(store, clock.now)
    before = store.point_reads
    assert a.admit().admission == "wait"
    for _ in range(3):
        clock.advance(0.2)
        assert a.admit().admission == "wait"
    assert store.point_reads == before + 4  # an open breaker is never served from the cache


def test_a_read_overtaken_by_a_newer_open_read_is_not_cached() -> None:
    """Two threads of one instance: the first reads closed, the second then reads open, and the
    first's older row comes back last. It must not be kept: the instance saw the breaker open."""
    store, clock = CountingStore(), Clock()
    a = gate(store, clock)
    second: list[str] = []

    def other_thread() -> None:
        open_it(store, clock.now)
        second.append(str(a.admit().admission))

    store.during_next_read = other_thread
    assert a.admit().admission == "call"  # its read happened before the opening
    assert second == ["wait"]
    assert a.admit().admission == "wait"  # not served from the first read's (older) row


def test_a_clean_read_racing_this_instances_opening_is_not_cached() -> None:
    """A thread reads the row closed and clean; before its read returns, another thread of the
    instance records the failures that open it. The older clean row must not admit later calls."""
    store, clock = CountingStore(), Clock()
    a = gate(store, clock)

    def other_thread() -> None:
        for _ in range(POLICY.threshold):
            a.record(503)

    store.during_next_read = other_thread
    assert a.admit().admission == "call"  # read before the opening
    assert read_breaker(store, "shipping").state is BreakerState.OPEN
    assert a.admit().admission == "wait"


def test_a_probe_is_never_served_from_the_cache() -> None:
    store, clock = CountingStore(), Clock()
    a, b = gate(store, clock, "a"), gate(store, clock, "b")
    assert a.admit().admission == "call"
    open_it(store, clock.now)
    clock.advance(POLICY.cool_down.total_seconds())
    probe = b.admit()
    assert probe.admission == "probe"
    assert a.admit().admission == "wait"  # its copy expired long ago; b holds the lease
    b.record(200, probe_id=probe.probe_id)
    assert a.admit().admission == "call"
    probe_writes = store.point_reads
    assert b.admit().admission == "call" and store.point_reads == probe_writes + 1  # b wrote: it reads again


def test_hold_registers_a_waiting_step_from_a_fresh_read_not_the_cache() -> None:
    store, clock = CountingStore(), Clock()
    a = gate(store, clock)
    open_it(store, clock.now)
    step = WaitingStep("0" * 32, 1, "ship")
    assert hold(a, step).admission == "wait"
    assert waiting_steps(store, "shipping") == [step]


def test_a_drop_refuses_the_rows_of_reads_begun_before_it() -> None:
    cache = ClosedRowCache(TTL)
    ticket = cache.ticket()
    assert cache.offer(ticket, BreakerRow("shipping"), T0) and cache.fresh(T0)
    cache.drop()
    assert not cache.fresh(T0)
    assert not cache.offer(ticket, BreakerRow("shipping"), T0)  # a read begun before the drop


@pytest.mark.parametrize("row", [
    BreakerRow("shipping", failures=1),
    BreakerRow("shipping", state=BreakerState.OPEN),
    BreakerRow("shipping", state=BreakerState.HALF_OPEN),
])
def test_only_a_closed_row_with_nothing_counted_is_kept(row: BreakerRow) -> None:
    cache = ClosedRowCache(TTL)
    assert not cache.offer(cache.ticket(), row, T0) and not cache.fresh(T0)


def test_the_copy_expires_and_a_clock_gone_back_does_not_extend_it() -> None:
    cache = ClosedRowCache(TTL)
    cache.offer(cache.ticket(), BreakerRow("shipping"), T0)
    assert cache.fresh(T0 + TTL / 2) and not cache.fresh(T0 + TTL) and not cache.fresh(T0 - TTL / 2)
    off = ClosedRowCache(timedelta(0))
    assert not off.offer(off.ticket(), BreakerRow("shipping"), T0) and not off.fresh(T0)


def test_the_cache_lifetime_is_a_setting_and_zero_turns_it_off() -> None:
    assert BreakerPolicy.from_settings(Settings.from_env(REQUIRED_VALUES)).cache == timedelta(seconds=1)
    tuned = Settings.from_env({**REQUIRED_VALUES, "BreakerCacheSeconds": "1.5"})
    assert BreakerPolicy.from_settings(tuned).cache == timedelta(seconds=1.5)
    off = BreakerPolicy.from_settings(Settings.from_env({**REQUIRED_VALUES, "BreakerCacheSeconds": "0"}))
    store, clock = CountingStore(), Clock()
    calls(gate(store, clock, policy=off), clock, 10, every=0.01)
    assert store.point_reads == 10
    with pytest.raises(ValueError):
        BreakerPolicy(cache=timedelta(seconds=-1))
