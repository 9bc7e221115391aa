"""A breaker's watch row in the deadline index (``shared.core.breaker.watch``, ``shared.supervisor.breakers``):
an idle sweep reads the deadline index and nothing else, and no waiting step is left unwatched
whatever dies, repeats or races."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest

from shared.agent.gate import BreakerGate
from shared.agent.guard import hold
from shared.core.breaker.state import BreakerPolicy, BreakerRow, BreakerState
from shared.core.breaker.waiting import WaitingStep, waiting_partition
from shared.core.breaker.watch import WAKE_GRACE, Watch, WatchVerdict, confirming_watch, decide_watch, opening_watch
from shared.core.effects import due_bound
from shared.core.rows import IndexRow
from shared.storage.breakers import read_breaker, write_breaker
from shared.storage.memory import MemoryStore
from shared.storage.waiting import register_waiting, waiting_steps
from shared.supervisor import sweep
from shared.supervisor.breakers import handle_watch, put_watch
from tests.unit.harness import T0, make_runtime

POLICY = BreakerPolicy(threshold=2, window=timedelta(seconds=10), cool_down=timedelta(seconds=5),
                       probe_lease=timedelta(seconds=10), cache=timedelta(0))
ALL = "299912312359"  # every deadline bucket
STEP = WaitingStep("0" * 32, 1, "create-shipment")


def watches(store: MemoryStore) -> list[Watch]:
    rows = [Watch.from_row(r.row_key, r.due) for r in store.due_index(ALL, 1000)]
    return [w for w in rows if w is not None]


def requests(store: MemoryStore, run: Any) -> tuple[list[tuple[str, str]], int]:
    """The reads (table, partition) and the writes ``run`` makes."""
    store.reads.clear()
    writes = store.writes
    run()
    return list(store.reads), store.writes - writes


def gate(rt: Any, on_closed: Any = None) -> BreakerGate:
    return BreakerGate(rt.store, "shipping", POLICY, "a", rt.bus, "alerts", now=rt.clock, on_closed=on_closed)


def open_by_failures(g: BreakerGate) -> None:
    g.record("timeout")
    g.record("timeout")
    assert read_breaker(g.store, "shipping").state is BreakerState.OPEN


# ---- the pure decision ---------------------------------------------------------------------------
OPEN = BreakerRow("shipping", BreakerState.OPEN, retry_at=T0 + timedelta(seconds=5), opens=3)
W = Watch("shipping", 3, T0 + timedelta(seconds=10))


@pytest.mark.parametrize(("row", "now", "verdict"), [
    (OPEN, T0, WatchVerdict.KEEP),  # not due yet
    (replace(OPEN, state=BreakerState.CLOSED), T0 + timedelta(seconds=10), WatchVerdict.RESUME_ALL),
    (BreakerRow("shipping"), T0 + timedelta(seconds=10), WatchVerdict.RESUME_ALL),  # never written: list once
    (replace(OPEN, opens=4), T0 + timedelta(seconds=10), WatchVerdict.DELETE),  # a newer opening's watch covers it
    (OPEN, T0 + timedelta(seconds=10), WatchVerdict.WAKE),  # cool-down over 5 s ago, nobody woke it
    (replace(OPEN, wake_at=T0 + timedelta(seconds=8)), T0 + timedelta(seconds=10), WatchVerdict.MOVE),
    (replace(OPEN, state=BreakerState.HALF_OPEN, probe_until=T0 + timedelta(seconds=20)), T0 + timedelta(seconds=10),
     WatchVerdict.MOVE),
])
def test_what_a_due_watch_means(row: BreakerRow, now: Any, verdict: WatchVerdict) -> None:
    assert decide_watch(row, W, now).verdict is verdict


def test_a_moved_watch_is_due_when_the_probe_would_be_overdue_and_not_before() -> None:
    half = replace(OPEN, state=BreakerState.HALF_OPEN, probe_until=T0 + timedelta(seconds=20))
    at = decide_watch(half, W, T0 + timedelta(seconds=10)).at
    assert at is not None and at > half.probe_until + WAKE_GRACE  # type: ignore[operator]
    assert decide_watch(half, replace(W, due=at), at).verdict is WatchVerdict.WAKE
    woken = replace(OPEN, wake_at=T0 + timedelta(seconds=8))
    at = decide_watch(woken, W, T0 + timedelta(seconds=10)).at
    assert at is not None and decide_watch(woken, replace(W, due=at), at).verdict is WatchVerdict.WAKE


def test_the_row_key_names_remote_opening_and_due_and_order_rows_are_not_watches() -> None:
    assert Watch.from_row(W.row_key, W.due) == W
    assert W.bucket == "202611220800"
    assert Watch.from_row(f"{'a' * 32}:20261122T080010000000", W.due) is None
    assert Watch.from_row("breaker:shipping:x:1", W.due) is None


# ---- the opener ----------------------------------------------------------------------------------
def test_the_opening_puts_its_watch_before_the_open_write_and_a_second_one_after() -> None:
    rt = make_runtime()
    g = gate(rt)
    open_by_failures(g)
    row = read_breaker(rt.store, "shipping")
    assert watches(rt.store) == [opening_watch(row), confirming_watch(row)]
    assert opening_watch(row).due == row.retry_at + WAKE_GRACE  # type: ignore[operator]


class NoIndex(MemoryStore):
    def put_index(self, row: IndexRow) -> None:
        raise OSError("deadline table down")


def test_no_watch_no_open_and_the_call_is_admitted() -> None:
    rt = make_runtime(store=NoIndex())
    g = gate(rt)
    g.record("timeout")
    assert g.record("timeout") is None  # the breaker is unavailable: logged, nothing decided
    assert read_breaker(rt.store, "shipping").state is BreakerState.CLOSED
    assert g.admit().admission == "call"


def test_a_crash_between_the_watch_and_the_open_write_leaves_a_stray_the_sweep_drops() -> None:
    rt = make_runtime()
    sweep(rt)  # the first sweep's full pass
    stray = Watch("shipping", 1, rt.clock() + timedelta(seconds=10))
    put_watch(rt.store, stray)  # the open write never happened
    rt.clock.advance(11)
    assert sweep(rt).breakers == {"resume-all": 1}
    assert watches(rt.store) == []


# ---- the Supervisor's cost -----------------------------------------------------------------------
def test_an_idle_sweep_reads_the_deadline_index_and_nothing_else() -> None:
    rt = make_runtime()
    reads, writes = requests(rt.store, lambda: sweep(rt))  # the process's first sweep: every breaker once
    assert sorted(reads) == [("deadline", "202611220800~")] + [("state", "breakers")] * 4 and writes == 0
    for _ in range(3):
        rt.clock.advance(15)
        reads, writes = requests(rt.store, lambda: sweep(rt))
        assert reads == [("deadline", due_bound(rt.clock()))] and writes == 0


def test_an_outage_costs_the_sweep_a_few_requests_then_it_is_idle_again() -> None:
    rt = make_runtime()
    sweep(rt)
    resumed: list[str] = []
    g = gate(rt, on_closed=lambda gate, opening: resumed.append(gate.remote))
    open_by_failures(g)
    rt.clock.advance(5)
    probe = g.admit()
    assert probe.admission == "probe"
    g.record(200, probe_id=probe.probe_id)  # closed
    assert resumed == ["shipping"]
    rt.clock.advance(10)  # the watches fall due after the close: per watch one read, one listing, the delete
    reads, writes = requests(rt.store, lambda: sweep(rt))
    assert sorted(reads) == sorted([("deadline", due_bound(rt.clock()))]
                                   + [("state", "breakers"), ("state", waiting_partition("shipping"))] * 2)
    assert writes == 2 and watches(rt.store) == []
    rt.clock.advance(15)
    reads, writes = requests(rt.store, lambda: sweep(rt))
    assert len(reads) == 1 and writes == 0


# ---- crash, duplicate, race ----------------------------------------------------------------------
def test_a_closer_that_dies_before_its_resumes_is_covered_by_the_watch() -> None:
    rt = make_runtime()
    sweep(rt)
    g = gate(rt, on_closed=lambda gate, opening: (_ for _ in ()).throw(RuntimeError("died")))
    open_by_failures(g)
    assert hold(g, STEP).admission == "wait"
    rt.clock.advance(5)
    probe = g.admit()
    g.record(200, probe_id=probe.probe_id)  # closed; the resumes are never sent
    assert waiting_steps(rt.store, "shipping") == [STEP]
    rt.clock.advance(15)
    assert sweep(rt).breakers == {"resume-all": 2}  # the opening's two watches; the second lists nothing
    assert [m.body["orderId"] for m in rt.bus.take("scheduler")] == [STEP.order_id]
    assert waiting_steps(rt.store, "shipping") == [] and watches(rt.store) == []


class ForgetFails(MemoryStore):
    fail = True

    def transact(self, order_id: str, ops: Any) -> dict[str, str]:
        if order_id.startswith("waiting-") and ops[0].kind == "delete" and self.fail:
            raise OSError("store down")
        return super().transact(order_id, ops)


def test_a_supervisor_that_dies_after_the_resumes_keeps_the_watch_and_sends_them_again() -> None:
    rt = make_runtime(store=ForgetFails())
    sweep(rt)
    watch = Watch("shipping", 1, rt.clock())
    put_watch(rt.store, watch)
    write_breaker(rt.store, BreakerRow("shipping", opens=1))  # closed, the closer died
    register_waiting(rt.store, "shipping", STEP, rt.clock())
    with pytest.raises(OSError):
        handle_watch(rt.store, rt.bus, "scheduler", watch, rt.clock())
    assert watches(rt.store) == [watch]
    rt.store.fail = False  # type: ignore[attr-defined]
    assert handle_watch(rt.store, rt.bus, "scheduler", watch, rt.clock()) == (WatchVerdict.RESUME_ALL, 1)
    assert len(rt.bus.take("scheduler")) == 1  # the same message id twice: the queue keeps one
    assert watches(rt.store) == [] and waiting_steps(rt.store, "shipping") == []


def test_two_supervisors_on_one_watch_resume_once_and_both_finish() -> None:
    rt = make_runtime()
    watch = Watch("shipping", 1, rt.clock())
    put_watch(rt.store, watch)
    write_breaker(rt.store, BreakerRow("shipping", opens=1))
    register_waiting(rt.store, "shipping", STEP, rt.clock())
    assert handle_watch(rt.store, rt.bus, "scheduler", watch, rt.clock()) == (WatchVerdict.RESUME_ALL, 1)
    assert handle_watch(rt.store, rt.bus, "scheduler", watch, rt.clock()) == (WatchVerdict.RESUME_ALL, 0)
    assert len(rt.bus.take("scheduler")) == 1 and watches(rt.store) == []


def test_a_step_that_waits_on_the_next_opening_is_watched_by_that_opening() -> None:
    """The Supervisor drops opening 1's watch after the breaker reopened: a step now waiting
    read opening 2, whose watch was put before its open write."""
    rt = make_runtime()
    sweep(rt)
    g = gate(rt)
    open_by_failures(g)
    first, _confirming = watches(rt.store)
    rt.clock.advance(5)
    probe = g.admit()
    g.record(200, probe_id=probe.probe_id)  # closed (opening 1)
    open_by_failures(g)  # opening 2
    assert hold(g, STEP).admission == "wait"
    assert handle_watch(rt.store, rt.bus, "scheduler", first, first.due) == (WatchVerdict.DELETE, 0)
    assert {w.opening for w in watches(rt.store)} == {1, 2}  # opening 1's second watch is not due yet
    assert waiting_steps(rt.store, "shipping") == [STEP]


def test_a_breaker_opened_without_a_watch_gets_one_at_the_first_sweep() -> None:
    """Opened by an older version (no watch): the process's first sweep watches it."""
    rt = make_runtime()
    write_breaker(rt.store, replace(OPEN, opens=1, retry_at=rt.clock()))
    register_waiting(rt.store, "shipping", STEP, rt.clock())
    sweep(rt)
    [watch] = watches(rt.store)
    assert watch.opening == 1
    rt.clock.advance(10)
    assert sweep(rt).breakers == {"wake": 1}
    assert [m.body["orderId"] for m in rt.bus.take("scheduler")] == [STEP.order_id]


@dataclass(eq=True)
class Unhashable(MemoryStore):
    """Like the TableStore (a dataclass with ``eq``): no ``__hash__``."""

    def __post_init__(self) -> None:
        MemoryStore.__init__(self)


def test_the_first_sweep_pass_works_on_an_unhashable_store_and_runs_once() -> None:
    rt = make_runtime(store=Unhashable())
    assert type(rt.store).__hash__ is None
    reads, _ = requests(rt.store, lambda: sweep(rt))
    assert reads.count(("state", "breakers")) == 4
    reads, _ = requests(rt.store, lambda: sweep(rt))
    assert reads == [("deadline", "202611220800~")]


class FailingBreakerRead(MemoryStore):
    fail = True

    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None:
        if order_id == "breakers" and self.fail:
            raise OSError("store down")
        return super().read_row(order_id, row_key)


def test_a_first_pass_that_fails_is_tried_again_at_the_next_sweep() -> None:
    rt = make_runtime(store=FailingBreakerRead())
    write_breaker(rt.store, replace(OPEN, opens=1, retry_at=rt.clock()))
    sweep(rt)  # logged; the sweep itself goes on
    assert watches(rt.store) == []
    rt.store.fail = False  # type: ignore[attr-defined]
    sweep(rt)
    assert [w.opening for w in watches(rt.store)] == [1]


# ---- random runs of the whole protocol -----------------------------------------------------------
@pytest.mark.parametrize("seed", range(30))
def test_random_outages_leave_no_waiting_step_behind_and_no_watch(seed: int) -> None:
    """Gates fail, probe and close (their closers dying at random), steps wait, the Supervisor
    sweeps: once the remote is back and time passes, every step that waited got its resume, and
    nothing is left (no waiting row, no watch), so the sweep is idle again."""
    import random

    from shared.runtime.resume import resume_waiting

    rng = random.Random(seed)
    rt = make_runtime()
    sweep(rt)

    def closer(g: BreakerGate, opening: int) -> None:
        if rng.random() < 0.5:
            raise RuntimeError("the closer died")
        resume_waiting(rt.store, rt.bus, "scheduler", g.remote, opening)

    gates = [BreakerGate(rt.store, "shipping", POLICY, f"i{n}", rt.bus, "alerts", now=rt.clock, on_closed=closer)
             for n in range(3)]
    waited: set[str] = set()
    down = True
    for i in range(120):
        g = rng.choice(gates)
        roll = rng.random()
        if roll < 0.4:
            step = WaitingStep(f"{i:032x}", 1, "create-shipment")
            decision = hold(g, step)
            if decision.admission == "wait":
                waited.add(step.row_key)
            else:
                g.record("timeout" if down and rng.random() < 0.8 else 200, probe_id=decision.probe_id)
        elif roll < 0.5:
            down = not down
        elif roll < 0.7:
            sweep(rt)
        rt.clock.advance(rng.choice([0.5, 1, 2, 4]))
    for _ in range(40):  # the remote is back: probes succeed, the Supervisor sweeps every 15 s
        g = rng.choice(gates)
        decision = g.admit()
        if decision.admission != "wait":
            g.record(200, probe_id=decision.probe_id)
        rt.clock.advance(15)
        sweep(rt)
    resumed = {m.message_id.removeprefix("resume:") for m in rt.bus.take("scheduler")}
    assert read_breaker(rt.store, "shipping").state is BreakerState.CLOSED
    assert waited <= {key.rsplit(":", 1)[0] for key in resumed}, "a step waited and was never resumed"
    assert waiting_steps(rt.store, "shipping") == [] and watches(rt.store) == []
    reads, writes = requests(rt.store, lambda: sweep(rt))
    assert len(reads) == 1 and writes == 0


def test_a_watch_not_due_yet_in_the_current_minute_costs_no_read() -> None:
    rt = make_runtime()
    sweep(rt)
    put_watch(rt.store, Watch("shipping", 1, rt.clock() + timedelta(seconds=30)))  # same minute, later
    reads, writes = requests(rt.store, lambda: sweep(rt))
    assert reads == [("deadline", "202611220800~")] and writes == 0
