"""The breaker as an agent instance uses it (``shared.agent.gate``): what counts as a failure,
the alerts on open and close (once), and a breaker that never stops the agent on its own faults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.agent.gate import BreakerGate, failure_of
from shared.core.breaker.state import BreakerPolicy, BreakerState
from shared.messaging import MemoryBus
from shared.storage.breakers import read_breaker
from shared.storage.memory import MemoryStore

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
POLICY = BreakerPolicy(threshold=3, window=timedelta(seconds=10), cool_down=timedelta(seconds=5),
                       probe_lease=timedelta(seconds=10))


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def gates(store: Any, bus: MemoryBus, clock: Clock, *instances: str) -> list[BreakerGate]:
    return [BreakerGate(store, "shipping", POLICY, name, bus, "alerts", now=clock) for name in instances]


@pytest.mark.parametrize(("status", "final", "counts"), [
    ("timeout", True, True), ("connection-error", True, True), ("protocol-error", True, True),
    (408, True, True), (500, True, True), (503, True, True), (200, False, True),
    (200, True, False), (201, True, False), (400, True, False), (404, True, False), (409, True, False),
    (422, True, False), (425, True, False), (429, True, False),
])
def test_what_counts_as_the_remote_failing(status: int | str, final: bool, counts: bool) -> None:
    assert (failure_of(status, final=final) is not None) is counts


def test_an_outage_opens_it_once_holds_calls_back_and_one_probe_closes_it() -> None:
    store, bus, clock = MemoryStore(), MemoryBus(), Clock()
    a, b = gates(store, bus, clock, "a", "b")
    assert a.admit().admission == "call"
    a.record("timeout")
    b.record(503)
    a.record(500)
    b.record(502)  # a call from before the open: no second alert
    opened = bus.take("alerts")
    assert len(opened) == 1 and opened[0].message_id == "breaker:shipping:1:open"
    assert opened[0].body["state"] == "open" and opened[0].body["failures"] == 3
    assert opened[0].body["reason"] == "HTTP 500"
    assert a.admit().admission == b.admit().admission == "wait"
    clock.advance(5)
    probe = b.admit()
    assert probe.admission == "probe" and a.admit().admission == "wait"
    clock.advance(1)
    b.record(200, probe_id=probe.probe_id)
    closed = bus.take("alerts")
    assert [m.message_id for m in closed] == ["breaker:shipping:1:closed"]
    assert closed[0].body["openSeconds"] == 6.0
    assert a.admit().admission == "call"


def test_a_throttled_or_rejected_probe_closes_it_and_a_failed_probe_reopens_it() -> None:
    store, bus, clock = MemoryStore(), MemoryBus(), Clock()
    (a,) = gates(store, bus, clock, "a")
    for _ in range(3):
        a.record(503)
    clock.advance(5)
    a.record("timeout", probe_id=a.admit().probe_id)
    assert read_breaker(store, "shipping").state is BreakerState.OPEN
    assert [m.body["state"] for m in bus.take("alerts")] == ["open"]  # reopening is logged, not alerted
    clock.advance(5)
    a.record(422, probe_id=a.admit().probe_id)  # an answer: the remote is up
    assert read_breaker(store, "shipping").state is BreakerState.CLOSED
    assert [m.body["state"] for m in bus.take("alerts")] == ["closed"]


def test_answers_outside_a_probe_cost_no_store_request() -> None:
    store, bus, clock = MemoryStore(), MemoryBus(), Clock()
    (a,) = gates(store, bus, clock, "a")
    reads, writes = len(store.reads), store.writes
    for status in (200, 201, 404, 409, 429):
        assert a.record(status) is None
    assert len(store.reads) == reads and store.writes == writes


class BrokenStore:
    def read_row(self, partition: str, row_key: str) -> Any:
        raise ConnectionError("table storage unreachable")

    def transact(self, partition: str, ops: Any) -> None:
        raise ConnectionError("table storage unreachable")


def test_a_breaker_it_cannot_read_admits_the_call() -> None:
    (a,) = gates(BrokenStore(), MemoryBus(), Clock(), "a")
    assert a.admit().admission == "call"
    assert a.record("timeout") is None


def test_an_alert_that_cannot_be_sent_does_not_stop_the_agent() -> None:
    store, bus, clock = MemoryStore(), MemoryBus(), Clock()
    bus.fail.add("alerts")
    (a,) = gates(store, bus, clock, "a")
    for _ in range(3):
        a.record(503)
    assert read_breaker(store, "shipping").state is BreakerState.OPEN


def test_an_answer_between_failures_starts_the_count_again() -> None:
    """Only a run of ``threshold`` failures with no answer between them opens it: a remote that
    answers most calls (the chaos run's 20% transient 503s) is not down. An answer costs a write
    only while failures are being counted."""
    store, bus, clock = MemoryStore(), MemoryBus(), Clock()
    [a] = gates(store, bus, clock, "a")
    a.record(503)
    a.record(503)
    admitted = a.admit()
    assert admitted.admission == "call" and admitted.failures == 2
    reset = a.record(200, counted=admitted.failures)
    assert reset is not None and reset.row is not None and reset.row.failures == 0
    a.record(503)
    a.record("timeout")
    assert read_breaker(store, "shipping").state is BreakerState.CLOSED and bus.take("alerts") == []
    writes = store.writes
    assert a.record(200, counted=0) is None and store.writes == writes  # nothing counted: no I/O
    a.record(500)
    assert read_breaker(store, "shipping").state is BreakerState.OPEN  # three in a row
