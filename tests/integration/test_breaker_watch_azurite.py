"""The Supervisor's idle cost and a breaker's watch on Table Storage (Azurite), counted at the
HTTP transport as the benchmark counts (``bench.opcount``): an idle sweep is one deadline index
query; an outage's watch makes the sweep resume the steps a dead closer left, then idle again; an
agent instance's healthy admissions are one query of every breaker per cache lifetime."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from bench import opcount
from shared.agent.board import BreakerBoard
from shared.agent.gate import CACHED_CALL, BreakerGate
from shared.agent.guard import hold
from shared.core.breaker.state import BreakerPolicy, BreakerState
from shared.core.breaker.waiting import WaitingStep
from shared.observability.figures import ConsoleStats
from shared.storage.breakers import read_breaker
from shared.storage.waiting import waiting_steps
from shared.supervisor import sweep

pytestmark = pytest.mark.integration

POLICY = BreakerPolicy(threshold=2, window=timedelta(seconds=10), cool_down=timedelta(seconds=5),
                       probe_lease=timedelta(seconds=10), cache=timedelta(0))
STEP = WaitingStep("0" * 32, 1, "create-shipment")


@pytest.fixture
def counted() -> Iterator[opcount.Counter]:
    """Every table request this process sends, by ``table|kind`` (``bench.opcount``'s classification),
    counted at the send of the store's table transport (``Urllib3Transport``, which the fixtures'
    stores use)."""
    from shared.storage.transport import Urllib3Transport

    transport = Urllib3Transport
    counter = opcount.Counter(None)
    original = transport.__dict__["send"]

    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        response = original(self, request, **kwargs)
        opcount.count_request(counter, request, response, 0.0)
        return response

    transport.send = send
    try:
        yield counter
    finally:
        transport.send = original

def requests_of(counter: opcount.Counter, run: Callable[[], Any]) -> dict[str, int]:
    """The requests ``run`` sends, by table (without the random suffix of the test's tables) and kind."""
    before = counter.snapshot()
    run()
    after = counter.snapshot()
    out: dict[str, int] = {}
    for key, t in after.items():
        n = int(t["requests"] - before.get(key, {}).get("requests", 0))
        if n:
            table, _, kind = key.partition("|")
            name = table.rstrip("0123456789abcdef")
            out[f"{name}|{kind}"] = out.get(f"{name}|{kind}", 0) + n
    return out


def quiet_runtime(table_runtime: Callable[..., Any]) -> Any:
    rt = table_runtime()
    rt.store.stats = ConsoleStats(rt.store.put_stats, proc="p", clock=rt.clock, background=False)
    return rt


def sweep_and_flush(rt: Any) -> None:
    sweep(rt, workers=1)
    rt.store.stats.flush()


def test_an_idle_sweep_is_one_deadline_query(table_runtime: Callable[..., Any], counted: opcount.Counter) -> None:
    rt = quiet_runtime(table_runtime)
    first = requests_of(counted, lambda: sweep_and_flush(rt))  # every breaker once (never written: 404)
    assert first == {"deadlines|query": 1, "orders|get|breakers": 4, "orderindex|batch|stats": 1}
    for _ in range(3):
        rt.clock.advance(15)
        assert requests_of(counted, lambda: sweep_and_flush(rt)) == {"deadlines|query": 1}
    rt.clock.advance(15)  # 60 s after the last stats write: the heartbeat
    assert requests_of(counted, lambda: sweep_and_flush(rt)) == {"deadlines|query": 1, "orderindex|batch|stats": 1}


def test_a_dead_closer_is_covered_by_its_watch_then_the_sweep_is_idle_again(
        table_runtime: Callable[..., Any], counted: opcount.Counter) -> None:
    rt = quiet_runtime(table_runtime)
    sweep_and_flush(rt)

    def died(gate: BreakerGate, opening: int) -> None:
        raise RuntimeError("the closer died before its resumes")

    gate = BreakerGate(rt.store, "shipping", POLICY, "a", rt.bus, "alerts", now=rt.clock, on_closed=died)
    gate.record("timeout")
    gate.record("timeout")
    assert read_breaker(rt.store, "shipping").state is BreakerState.OPEN
    assert hold(gate, STEP).admission == "wait"
    rt.clock.advance(5)
    probe = gate.admit()
    gate.record(200, probe_id=probe.probe_id)
    assert read_breaker(rt.store, "shipping").state is BreakerState.CLOSED
    rt.clock.advance(15)
    report: list[Any] = []
    cost = requests_of(counted, lambda: report.append(sweep(rt, workers=1)))
    assert report[0].breakers == {"resume-all": 2}  # the opening's two watches (before and after its write)
    # the deadline query; per watch the breaker and its waiting steps; the resumes' delete; each watch's
    # delete, made by the sweep that handled it
    assert cost == {"deadlines|query": 1, "orders|get|breakers": 2, "orders|query|waiting": 2,
                    "orders|batch|waiting": 1, "deadlines|delete": 2}
    assert [m.body["orderId"] for m in rt.bus.take("scheduler")] == [STEP.order_id]
    assert waiting_steps(rt.store, "shipping") == []
    rt.clock.advance(15)
    assert requests_of(counted, lambda: sweep(rt, workers=1)) == {"deadlines|query": 1}


def test_an_instances_healthy_admissions_are_one_query_of_every_breaker_per_cache_lifetime(
        table_runtime: Callable[..., Any], counted: opcount.Counter) -> None:
    """``shared.agent.board`` on Table Storage, counted as the benchmark counts: the query is
    ``orders|query|breakers`` (a breaker read, bench.cost), one for the three remotes."""
    rt = quiet_runtime(table_runtime)
    board = BreakerBoard(rt.store)
    policy = replace(POLICY, cache=timedelta(seconds=1))
    gates = [BreakerGate(rt.store, r, policy, "a", rt.bus, "alerts", now=rt.clock, board=board)
             for r in ("inventory", "payment", "shipping")]
    decisions: list[Any] = []
    assert requests_of(counted, lambda: decisions.extend(g.admit() for g in gates)) == {"orders|query|breakers": 1}
    assert decisions == [CACHED_CALL] * 3
    assert requests_of(counted, lambda: [g.admit() for g in gates]) == {}  # within the lifetime: nothing
    rt.clock.advance(1)
    assert requests_of(counted, lambda: [g.admit() for g in gates]) == {"orders|query|breakers": 1}
