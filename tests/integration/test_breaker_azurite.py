"""The circuit breaker's row on real Table Storage (Azurite): its ETag-conditioned writes settle
races between instances (threads here, each deciding on the row it read) as in the unit tests."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.agent.board import BreakerBoard
from shared.agent.gate import CACHED_CALL, BreakerGate
from shared.core.breaker.state import BreakerPolicy, BreakerState, Effect, decide_admit, decide_failure, decide_success
from shared.core.breaker.waiting import WaitingStep
from shared.messaging import MemoryBus
from shared.storage.breakers import apply, read_breaker, read_breakers, write_breaker
from shared.storage.store import Conflict
from shared.storage.table_store import TableStore
from shared.storage.waiting import forget_waiting, register_waiting, waiting_steps

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
POLICY = BreakerPolicy(threshold=3, cool_down=timedelta(seconds=5), probe_lease=timedelta(seconds=10))
RACERS = 5  # each racer writes at most once, so it loses at most RACERS-1 rounds (< MAX_ROUNDS)


class FirstReadTogether:
    """Wraps a store: each thread's first ``read_row`` waits until every racer has read, so that
    they all decide on the same row before any of them writes."""

    def __init__(self, inner: TableStore, parties: int) -> None:
        self.inner = inner
        self.barrier = threading.Barrier(parties, timeout=30)
        self.local = threading.local()

    def read_row(self, partition: str, row_key: str) -> Any:
        row = self.inner.read_row(partition, row_key)
        if not getattr(self.local, "read", False):
            self.local.read = True
            self.barrier.wait()
        return row

    def transact(self, partition: str, ops: Any) -> None:
        self.inner.transact(partition, ops)


def race(store: TableStore, decide: Any) -> list[Any]:
    shared = FirstReadTogether(store, RACERS)
    with ThreadPoolExecutor(RACERS) as pool:
        return list(pool.map(lambda i: apply(shared, "shipping", lambda row: decide(row, i)),  # type: ignore[arg-type]
                             range(RACERS)))


def test_the_row_is_created_then_replaced_on_its_etag(path_store: TableStore) -> None:
    fresh = read_breaker(path_store, "shipping")
    assert fresh.state is BreakerState.CLOSED and fresh.etag is None
    first = decide_failure(fresh, T0, POLICY, "HTTP 503")
    second = decide_failure(fresh, T0, POLICY, "timeout")
    assert first.row is not None and second.row is not None
    write_breaker(path_store, first.row)
    with pytest.raises(Conflict):  # created by another instance first: 409
        write_breaker(path_store, second.row)
    stored = read_breaker(path_store, "shipping")
    assert stored.failures == 1 and stored.window_start == T0 and stored.etag
    counted = decide_failure(stored, T0, POLICY, "timeout")
    assert counted.row is not None
    write_breaker(path_store, counted.row)
    with pytest.raises(Conflict):  # decided on the row before that write: 412
        write_breaker(path_store, counted.row)
    assert read_breaker(path_store, "shipping").failures == 2


def test_racing_failures_open_it_once(path_store: TableStore) -> None:
    decisions = race(path_store, lambda row, i: decide_failure(row, T0, POLICY, f"fault {i}"))
    assert sum(Effect.OPENED in d.effects for d in decisions) == 1
    row = read_breaker(path_store, "shipping")
    assert row.state is BreakerState.OPEN and row.opens == 1 and row.failures == POLICY.threshold


def test_racing_instances_send_one_probe_and_its_success_closes_it(path_store: TableStore) -> None:
    for _ in range(POLICY.threshold):
        apply(path_store, "shipping", lambda row: decide_failure(row, T0, POLICY, "HTTP 503"))
    after = T0 + POLICY.cool_down
    decisions = race(path_store, lambda row, i: decide_admit(row, after, POLICY, f"instance-{i}"))
    probes = [d for d in decisions if d.admission == "probe"]
    assert len(probes) == 1 and all(d.admission == "wait" for d in decisions if d not in probes)
    row = read_breaker(path_store, "shipping")
    assert row.state is BreakerState.HALF_OPEN and row.probe_id == probes[0].probe_id
    closed = apply(path_store, "shipping", lambda r: decide_success(r, after, probes[0].probe_id))
    assert closed.effects == (Effect.CLOSED,)
    assert read_breaker(path_store, "shipping").state is BreakerState.CLOSED


def test_the_waiting_index_registers_lists_and_forgets_on_table_storage(path_store: TableStore) -> None:
    steps = [WaitingStep(f"{i:032x}", 1, "ship") for i in range(120)]
    for step in steps:
        register_waiting(path_store, "shipping", step, T0)
    register_waiting(path_store, "shipping", steps[0], T0)  # again: a 409 taken as done
    assert waiting_steps(path_store, "shipping") == steps
    assert waiting_steps(path_store, "payment") == []
    # more than one transaction holds, one row never registered: chunks, then one by one
    forget_waiting(path_store, "shipping", steps[:110] + [WaitingStep("f" * 32, 9, "gone")])
    assert waiting_steps(path_store, "shipping") == steps[110:]


def test_one_query_reads_every_breaker_with_the_etag_its_writes_are_conditioned_on(path_store: TableStore) -> None:
    """``read_breakers`` on Table Storage: one query of the partition, each row as a point read
    shows it (a row never written: closed, no ETag), and an instance's gates refreshed by it
    (``shared.agent.board``): the clean ones served from their copies, the open one decided on
    its own read."""

    for i in range(3):
        apply(path_store, "shipping", lambda row, i=i: decide_failure(row, T0 + timedelta(seconds=i), POLICY, "503"))
    apply(path_store, "payment", lambda row: decide_failure(row, T0, POLICY, "503"))
    rows = read_breakers(path_store, ["inventory", "payment", "shipping"])
    assert rows["inventory"].etag is None and rows["inventory"].state is BreakerState.CLOSED
    for remote in ("payment", "shipping"):
        assert rows[remote] == read_breaker(path_store, remote) and rows[remote].etag
    assert rows["shipping"].state is BreakerState.OPEN and rows["payment"].failures == 1
    write_breaker(path_store, replace(rows["payment"], failures=0))  # conditioned on the query's ETag: it wins
    with pytest.raises(Conflict):
        write_breaker(path_store, replace(rows["payment"], failures=0))

    board = BreakerBoard(path_store)
    gates = {r: BreakerGate(path_store, r, replace(POLICY, cache=timedelta(seconds=60)), "a", MemoryBus(), "alerts",
                            now=lambda: T0 + timedelta(seconds=3), board=board) for r in rows}
    decisions = {r: g.admit() for r, g in gates.items()}
    assert decisions["inventory"] == decisions["payment"] == CACHED_CALL
    assert decisions["shipping"].admission == "wait" and board.queries == 1
