"""One query refreshes every breaker an agent instance holds (``shared.agent.board``): a healthy
instance reads the partition ``breakers`` once per ``BreakerCacheSeconds``, not once per remote;
a breaker that is anything but closed and clean still gets its own read and decision; the cache's
ticket rule still refuses a row read before this instance's own events; a failed query changes
nothing but the cost; threads that find their copies stale at once send one query."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from shared.agent import board as board_module
from shared.agent.board import BreakerBoard
from shared.agent.gate import CACHED_CALL, BreakerDecision, BreakerGate
from shared.agent.guard import breaker_for
from shared.core.breaker.state import BreakerPolicy, BreakerRow, BreakerState
from shared.messaging import MemoryBus
from shared.storage.breakers import read_breaker, write_breaker
from shared.storage.memory import MemoryStore
from tests.unit.agent.test_gate import Clock
from tests.unit.agent.test_guard import SETTINGS

TTL = timedelta(seconds=1)
POLICY = BreakerPolicy(threshold=3, window=timedelta(seconds=10), cool_down=timedelta(seconds=5),
                       probe_lease=timedelta(seconds=10), cache=TTL)
REMOTES = ("inventory", "payment", "shipping")


class BreakerReads(MemoryStore):
    """Counts the breakers' queries and point reads; can run something during the next query, or fail."""

    def __init__(self) -> None:
        super().__init__()
        self.queries = 0
        self.point_reads = 0
        self.during_next_query: Callable[[], object] | None = None
        self.queries_down = False

    def read_rows(self, partition: str, limit: int) -> dict[str, dict[str, Any]]:
        if self.queries_down:
            raise ConnectionError("table storage unreachable")
        self.queries += 1
        rows = super().read_rows(partition, limit)
        hook, self.during_next_query = self.during_next_query, None
        if hook is not None:
            hook()  # another thread of the instance, while the query's answer is on its way
        return rows

    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None:
        self.point_reads += 1
        return super().read_row(order_id, row_key)

    def cost(self) -> tuple[int, int]:
        return self.queries, self.point_reads


def instance(store: Any, clock: Clock, policy: BreakerPolicy = POLICY) -> dict[str, BreakerGate]:
    """The gates of one agent instance, one per remote, on one board."""
    board = BreakerBoard(store)
    return {r: BreakerGate(store, r, policy, "a", MemoryBus(), "alerts", now=clock, board=board) for r in REMOTES}


def open_it(store: MemoryStore, remote: str, clock: Clock) -> None:
    """Another instance opened ``remote``'s breaker now."""
    row = read_breaker(store, remote)
    write_breaker(store, BreakerRow(remote, state=BreakerState.OPEN, failures=3, opened_at=clock.now,
                                    retry_at=clock.now + POLICY.cool_down, opens=row.opens + 1, etag=row.etag))


def admit_all(gates: dict[str, BreakerGate]) -> dict[str, BreakerDecision]:
    return {r: g.admit() for r, g in gates.items()}


def test_one_query_refreshes_all_three_and_nothing_is_read_again_within_the_lifetime() -> None:
    store, clock = BreakerReads(), Clock()
    gates = instance(store, clock)
    # payment's row exists, clean and closed; the other two were never written (closed by default)
    write_breaker(store, BreakerRow("payment", state=BreakerState.CLOSED, opens=2))
    assert admit_all(gates) == dict.fromkeys(REMOTES, CACHED_CALL)
    assert store.cost() == (1, 0)  # one query, no point read
    clock.advance(0.9)
    assert admit_all(gates) == dict.fromkeys(REMOTES, CACHED_CALL) and store.cost() == (1, 0)
    for _ in range(40):  # 4 s more of calls to every remote
        clock.advance(0.1)
        assert admit_all(gates) == dict.fromkeys(REMOTES, CACHED_CALL)
    assert store.cost() == (5, 0)  # one query per second for the three remotes (was 3 point reads)


def test_a_gate_whose_row_is_open_still_reads_and_decides_on_its_own_row() -> None:
    store, clock = BreakerReads(), Clock()
    gates = instance(store, clock)
    open_it(store, "shipping", clock)
    store.point_reads = 0
    decisions = admit_all(gates)
    assert decisions["inventory"] == decisions["payment"] == CACHED_CALL
    assert decisions["shipping"].admission == "wait" and decisions["shipping"].until == clock.now + POLICY.cool_down
    assert store.cost() == (1, 1)  # the query, then shipping's own point read
    clock.advance(0.5)  # within the lifetime: shipping reads its row at every call, no query per call
    decisions = admit_all(gates)
    assert decisions["shipping"].admission == "wait" and decisions["inventory"] == CACHED_CALL
    assert store.cost() == (1, 2)
    clock.advance(5)  # cool-down over: the query shows it open, shipping's own path takes the probe
    decisions = admit_all(gates)
    assert decisions["shipping"].admission == "probe" and decisions["payment"] == CACHED_CALL
    assert store.cost() == (2, 3) and read_breaker(store, "shipping").state is BreakerState.HALF_OPEN


def test_another_instances_opening_is_seen_by_the_next_query_within_the_lifetime() -> None:
    store, clock = BreakerReads(), Clock()
    gates = instance(store, clock)
    admit_all(gates)
    open_it(store, "payment", clock)
    clock.advance(0.5)
    assert gates["payment"].admit() == CACHED_CALL  # the trade: up to BreakerCacheSeconds later
    clock.advance(0.5)
    assert gates["inventory"].admit() == CACHED_CALL  # its query drops payment's copy too
    assert not gates["payment"].cache.fresh(clock.now)
    assert gates["payment"].admit().admission == "wait"
    assert store.cost()[0] == 2


def test_a_failure_recorded_while_the_query_is_in_flight_keeps_that_row_out_of_the_cache() -> None:
    store, clock = BreakerReads(), Clock()
    gates = instance(store, clock)
    # while the query's (clean) rows are on their way, another thread's call to payment fails
    store.during_next_query = lambda: gates["payment"].record(503)
    assert gates["inventory"].admit() == CACHED_CALL
    assert gates["shipping"].cache.fresh(clock.now) and not gates["payment"].cache.fresh(clock.now)
    assert read_breaker(store, "payment").failures == 1
    queries = store.queries
    decision = gates["payment"].admit()  # its own read, which shows the failure counted
    assert decision != CACHED_CALL and decision.admission == "call" and decision.failures == 1
    assert store.queries == queries  # the query just left payment's copy stale: no second one


def test_a_query_that_fails_falls_back_to_each_gates_own_read(caplog: pytest.LogCaptureFixture) -> None:
    store, clock = BreakerReads(), Clock()
    gates = instance(store, clock)
    store.queries_down = True
    decisions = admit_all(gates)
    assert all(d.admission == "call" and d != CACHED_CALL for d in decisions.values())
    assert store.point_reads == 3  # each gate read its own row, as without the board
    assert any("breaker.query_failed" in r.getMessage() for r in caplog.records)
    assert all(g.cache.fresh(clock.now) for g in gates.values())  # their own clean reads are kept
    clock.advance(1.0)
    store.queries_down = False
    assert admit_all(gates) == dict.fromkeys(REMOTES, CACHED_CALL) and store.cost() == (1, 3)


def test_while_the_table_is_down_every_call_still_goes_ahead() -> None:
    store, clock = BreakerReads(), Clock()
    gates = instance(store, clock)
    store.queries_down = True
    store.read_row = lambda *_: (_ for _ in ()).throw(ConnectionError("down"))  # type: ignore[method-assign]
    decisions = admit_all(gates)
    assert [d.verdict for d in decisions.values()] == ["breaker unknown: call"] * 3


def test_with_the_cache_off_there_is_no_query() -> None:
    store, clock = BreakerReads(), Clock()
    gates = instance(store, clock, BreakerPolicy(threshold=3, cache=timedelta(0)))
    assert all(d.admission == "call" for d in admit_all(gates).values())
    assert store.cost() == (0, 3)


class EnteredEvent(threading.Event):
    """An Event that tells the test each time a thread starts waiting on it."""

    entered = threading.Semaphore(0)

    def wait(self, timeout: float | None = None) -> bool:
        EnteredEvent.entered.release()
        return super().wait(timeout)


def test_threads_finding_their_copies_stale_at_once_send_one_query(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(board_module, "threading", SimpleNamespace(Lock=threading.Lock, Event=EnteredEvent))
    monkeypatch.setattr(EnteredEvent, "entered", threading.Semaphore(0))
    store, clock = BreakerReads(), Clock()
    gates = instance(store, clock)
    open_it(store, "shipping", clock)
    store.point_reads = 0
    decisions: dict[str, BreakerDecision] = {}
    followers = [threading.Thread(target=lambda r=r: decisions.__setitem__(r, gates[r].admit()))
                 for r in ("payment", "shipping")]

    def while_querying() -> None:  # both other threads arrive while the query is in flight
        for t in followers:
            t.start()
        assert all(EnteredEvent.entered.acquire(timeout=30) for _ in followers)

    store.during_next_query = while_querying
    decisions["inventory"] = gates["inventory"].admit()
    for t in followers:
        t.join()
    assert decisions["inventory"] == decisions["payment"] == CACHED_CALL
    assert decisions["shipping"].admission == "wait"  # its copy still stale after the query: its own read
    assert store.cost() == (1, 1)


def test_an_instance_holds_one_gate_per_remote_on_its_board() -> None:
    store, bus, board = MemoryStore(), MemoryBus(), BreakerBoard(MemoryStore())
    gate = breaker_for("inventory", store, bus, SETTINGS, "a", board=board)
    assert gate.board is board
    with pytest.raises(ValueError, match="inventory"):
        breaker_for("inventory", store, bus, SETTINGS, "a", board=board)
