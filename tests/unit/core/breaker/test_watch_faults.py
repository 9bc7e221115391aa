"""Faults of the breaker watch protocol (``shared.core.breaker.watch``) that the happy-path and random
runs in ``test_breaker_watch`` do not reach: an open write that lands late, an open breaker
that nobody uses any more."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shared.agent.gate import BreakerGate
from shared.agent.guard import hold
from shared.core.breaker.state import BreakerState
from shared.core.rows import Op
from shared.storage.breakers import read_breaker
from shared.storage.memory import MemoryStore
from shared.storage.waiting import waiting_steps
from shared.supervisor import sweep
from tests.unit.harness import make_runtime
from tests.unit.supervisor.test_breakers import POLICY, STEP, watches


class LateOpenWrite(MemoryStore):
    """The open write of the breaker is held up (SDK retries, a slow network, a paused process)
    after the watch was put: ``meanwhile`` runs before it reaches the table."""

    meanwhile: Callable[[], None] | None = None

    def transact(self, order_id: str, ops: Sequence[Op]) -> dict[str, str]:
        if order_id == "breakers" and ops[0].row.get("State") == "open" and self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            run()
        return super().transact(order_id, ops)


def test_an_open_write_that_lands_after_the_supervisor_dropped_its_watch_still_leaves_the_breaker_watched() -> None:
    """The opener puts the watch, its open write is slow; the watch falls due, the Supervisor reads
    the breaker still closed and deletes the watch as a stray; then the write wins (its ETag is
    still current). The breaker must not stay open unwatched: a closer dying before its resumes
    would leave the steps waiting on it with nobody to resume them."""
    store = LateOpenWrite()
    rt = make_runtime(store=store)
    sweep(rt)  # the first sweep's full pass is done
    died = []

    def closer(gate: BreakerGate, opening: int) -> None:
        died.append(gate.remote)
        raise RuntimeError("died")

    g = BreakerGate(rt.store, "shipping", POLICY, "a", rt.bus, "alerts", now=rt.clock, on_closed=closer)
    g.record("timeout")

    def supervisor_meanwhile() -> None:
        rt.clock.advance(11)  # the watch (cool-down 5 s + grace 5 s) is due
        sweep(rt)

    store.meanwhile = supervisor_meanwhile
    g.record("timeout")  # the opening write, late
    assert read_breaker(rt.store, "shipping").state is BreakerState.OPEN
    assert [w.opening for w in watches(rt.store)] == [1], "an open breaker without a watch"
    # what that costs: a step waits, the closer dies before its resumes, the Supervisor never knows
    rt.clock.advance(-7)  # back inside the cool-down (the open was decided at T0)
    assert hold(g, STEP).admission == "wait"
    rt.clock.advance(2)
    probe = g.admit()
    g.record(200, probe_id=probe.probe_id)
    assert died == ["shipping"]
    for _ in range(4):
        rt.clock.advance(15)
        sweep(rt)
    assert waiting_steps(rt.store, "shipping") == [], "a waiting step was never resumed"
    assert [m.body["orderId"] for m in rt.bus.take("scheduler")] == [STEP.order_id]




def test_an_open_breaker_nobody_uses_any_more_does_not_cost_every_sweep_a_read_and_a_listing() -> None:
    """The outage's orders ended (timed out, compensated) and no traffic comes: the breaker stays
    open past its cool-down with nothing waiting and nobody to probe. The watch's WAKE finds no
    step to wake; looking again at every sweep (a breaker read and a listing each, forever) breaks
    "an idle sweep is one deadline query". It may look again now and then, not every sweep."""
    rt = make_runtime()
    sweep(rt)
    g = BreakerGate(rt.store, "shipping", POLICY, "a", rt.bus, "alerts", now=rt.clock)
    g.record("timeout")
    g.record("timeout")
    assert read_breaker(rt.store, "shipping").state is BreakerState.OPEN
    costly = 0
    for _ in range(40):  # 10 minutes of sweeps every 15 s
        rt.clock.advance(15)
        rt.store.reads.clear()
        sweep(rt)
        costly += len(rt.store.reads) > 1
    assert costly <= 12, f"{costly} of 40 idle sweeps read the breaker"
    assert {w.opening for w in watches(rt.store)} == {1}, "the open breaker stays watched"
    assert rt.bus.take("scheduler") == []
