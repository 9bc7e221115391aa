"""Reserved order ids (``shared.id_reserve``): a keyless submission whose deadline index row was
written ahead, in one transaction with other ids' rows."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from shared.effects import PutIndex
from shared.id_reserve import FAILURE_PAUSE, MIN_BATCH, RATE_WINDOW, IdReserve
from shared.statemachine import plan_submission
from shared.store import MemoryStore
from shared.supervisor import sweep
from tests.unit.harness import AgentSim, Clock, Crash, drive, make_runtime, post, state

FLOOR = timedelta(seconds=15)


class Ticks:
    """A monotonic clock the test moves together with the wall clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.start = clock()

    def __call__(self) -> float:
        return (self.clock() - self.start).total_seconds()


def reserve(store: Any = None, clock: Clock | None = None, horizon: float = 1.0) -> tuple[IdReserve, Clock]:
    clock = clock or Clock()
    ids = IdReserve(store if store is not None else MemoryStore(), FLOOR, horizon, clock,
                    start=lambda work: work(), monotonic=Ticks(clock), timer=False)  # refills inline
    return ids, clock


def takes(ids: IdReserve, clock: Clock, count: int, per_second: float) -> list[Any]:
    got = []
    for _ in range(count):
        got.append(ids.take())
        clock.advance(1 / per_second)
    return got


def test_a_steady_rate_is_served_from_rows_written_in_one_transaction_per_refill() -> None:
    store = MemoryStore()
    ids, clock = reserve(store)
    got = takes(ids, clock, 200, per_second=20)
    served = [g for g in got if g is not None]
    assert len(served) >= 190  # only the first takes, before the rate is known, go without
    assert len({g.order_id for g in served}) == len(served)
    # each refill is one write of about horizon x rate ids (20/s x 1 s), never one per order
    assert store.writes == ids.refills
    assert 200 / 25 <= ids.refills <= 200 / 8
    rows = {r["OrderId"]: r for r in store.index_rows()}
    for g in served:  # every id handed out has its row, due floor after its refill's put
        assert g.order_id in rows
        assert g.due - FLOOR <= clock()


def test_every_id_handed_out_is_due_at_least_half_the_floor_later() -> None:
    ids, clock = reserve()
    for rate in (20, 3, 0.2, 20):  # the rate falls: reserved ids go stale and are not used
        for _ in range(40):
            now = clock()
            got = ids.take()
            if got is not None:
                assert got.due - now >= FLOOR / 2
                assert got.due <= now + FLOOR
            clock.advance(1 / rate)


def test_stale_ids_are_dropped_and_their_rows_deleted() -> None:
    store = MemoryStore()
    ids, clock = reserve(store, horizon=5.0)
    served = {g.order_id for g in takes(ids, clock, 20, per_second=10) if g is not None}
    assert len(ids) > 0
    clock.advance(FLOOR.total_seconds() / 2)  # every reserved id is now too close to its due
    assert ids.take() is None
    # what is left came from a refill just now (the rate is still known), none from before
    assert all(r.due == clock() + FLOOR for r in ids._ids)
    fresh = {r.order_id for r in ids._ids}
    assert {r["OrderId"] for r in store.index_rows()} == served | fresh


def test_when_submissions_stop_the_timer_deletes_the_rows_before_they_fall_due() -> None:
    store = MemoryStore()
    ids, clock = reserve(store)
    served = {g.order_id for g in takes(ids, clock, 40, per_second=20) if g is not None}
    assert len(ids) > 0
    ids.expire()  # nothing stale yet
    assert len(ids) > 0
    clock.advance(FLOOR.total_seconds() / 2)  # no take since: only the timer sees them go stale
    ids.expire()
    assert len(ids) == 0
    assert {r["OrderId"] for r in store.index_rows()} == served
    assert all(datetime.fromisoformat(r["Due"]) > clock() for r in store.index_rows())  # none due yet


def test_the_timer_runs_from_the_first_refill() -> None:
    store = MemoryStore()
    ids = IdReserve(store, timedelta(seconds=4), 1.0, Clock(), start=lambda work: work())
    assert ids._periodic is not None and ids._periodic._thread is None
    for _ in range(MIN_BATCH * 2):
        ids.take()
    assert ids.refills >= 1 and ids._periodic._thread is not None


def test_a_slow_instance_reserves_nothing() -> None:
    store = MemoryStore()
    ids, clock = reserve(store)
    per_second = (MIN_BATCH - 1) / RATE_WINDOW  # under MIN_BATCH ids per refill
    assert all(g is None for g in takes(ids, clock, 30, per_second=per_second))
    assert store.index_rows() == [] and ids.refills == 0


def test_a_failed_refill_pauses_refills_and_submissions_go_on_without() -> None:
    class Failing(MemoryStore):
        calls = 0

        def put_indexes(self, bucket: str, rows: Any) -> None:
            self.calls += 1
            raise OSError("table down")

    store = Failing()
    ids, clock = reserve(store)
    assert all(g is None for g in takes(ids, clock, 10, per_second=20))
    assert store.calls == 1  # paused after its failure
    clock.advance(FAILURE_PAUSE)
    takes(ids, clock, 3, per_second=20)
    assert store.calls == 2


def test_release_deletes_the_rows_of_ids_never_handed_out() -> None:
    store = MemoryStore()
    ids, clock = reserve(store)
    got = [g for g in takes(ids, clock, 30, per_second=20) if g is not None]
    assert len(ids) > 0
    ids.release()
    assert len(ids) == 0
    assert sorted(r["OrderId"] for r in store.index_rows()) == sorted(g.order_id for g in got)


def test_concurrent_takes_never_share_an_id() -> None:
    store = MemoryStore()
    ids = IdReserve(store, FLOOR, 1.0, Clock())  # real refill threads, real monotonic clock
    got: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(300):
            r = ids.take()
            if r is not None:
                with lock:
                    got.append(r.order_id)
            time.sleep(0.0005)  # let the refill threads run between takes

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got, "no take was served from the reserve"
    assert len(got) == len(set(got))


# the submission ---------------------------------------------------------------------------------
def with_reserve(rt: Any) -> IdReserve:
    rt.ids = IdReserve(rt.store, rt.config.index_floor(), 1.0, rt.clock, start=lambda work: work(),
                       monotonic=Ticks(rt.clock), timer=False)
    for _ in range(MIN_BATCH * 2):  # a rate worth a reserve
        rt.ids.take()
    assert len(rt.ids) > 0
    return rt.ids


def test_a_keyless_submission_with_a_reserved_id_is_one_transaction_and_no_index_write() -> None:
    rt = make_runtime()
    ids = with_reserve(rt)
    expected = ids._ids[0]  # the next id handed out

    def own_row(*args: Any) -> None:
        raise AssertionError(f"the submission put a row of its own: {args}")

    rt.store.put_index = own_row  # type: ignore[method-assign]
    r = post(rt)
    assert r.status == 202 and r.body["orderId"] == expected.order_id
    del rt.store.put_index
    st = state(rt, expected.order_id)
    assert st["IndexDue"] == expected.due.isoformat(timespec="microseconds")
    keys = [row["RowKey"] for row in rt.store.index_rows() if row["OrderId"] == expected.order_id]
    assert keys == [PutIndex(expected.order_id, expected.due).row_key]
    # it runs to the end, and its row is deleted then like any order's
    assert drive(rt, expected.order_id, AgentSim(rt))["ProcessState"] == "Processed"
    assert not [row for row in rt.store.index_rows() if row["OrderId"] == expected.order_id]


def test_a_submission_with_an_idempotency_key_never_takes_a_reserved_id() -> None:
    rt = make_runtime()
    ids = with_reserve(rt)
    left = len(ids)
    r = post(rt, headers={"Idempotency-Key": "k-1"})
    assert r.status == 202 and len(ids) == left


def test_a_reserved_row_due_after_the_first_deadline_is_not_used_as_its_cover() -> None:
    rt = make_runtime()
    ctx = rt.ctx()
    canonical = {"customerId": "c", "currency": "EUR", "items": [], "priority": "normal", "statusQueue": None}
    late = ctx.now + timedelta(days=1)
    effects = plan_submission("a" * 32, canonical, total="1", body_hash="h", idempotency_key=None, traceparent="",
                              ctx=ctx, covered=late)
    [put] = [e for e in effects if isinstance(e, PutIndex)]
    assert put.due < late
    on_time = ctx.now + rt.config.index_floor()
    effects = plan_submission("a" * 32, canonical, total="1", body_hash="h", idempotency_key=None, traceparent="",
                              ctx=ctx, covered=on_time)
    assert not [e for e in effects if isinstance(e, PutIndex)]


@pytest.mark.parametrize("k", range(0, 4))
def test_reserved_submission_crash_points(k: int) -> None:
    """A keyless submission on a reserved id dies after k effects: the order runs to the end if its
    transaction ran, and otherwise its reserved row is an orphan the sweep deletes."""
    rt = make_runtime()
    ids = with_reserve(rt)
    oid = ids._ids[0].order_id
    rt.crash_at = k
    with pytest.raises(Crash):
        post(rt)
    exists = rt.store.read_row(oid, "state") is not None
    assert exists == (k >= 1)  # the transaction is its first effect
    if exists:
        st = drive(rt, oid, AgentSim(rt))
        assert st["ProcessState"] == "Processed"
        assert st["FailureCount"] == (1 if k == 1 else 0)  # the request was not sent: one redrive
        assert not [row for row in rt.store.index_rows() if row["OrderId"] == oid]
    else:
        rt.clock.advance(600)
        ids.release()  # the other reserved ids' rows
        sweep(rt)
        assert rt.store.index_rows() == []  # the orphan row is cleaned up


def test_a_refill_that_cannot_start_is_tried_again_by_the_next_take() -> None:
    started: list[int] = []

    def no_thread(work: Any) -> None:
        started.append(1)
        if len(started) == 1:
            raise RuntimeError("can't start new thread")
        work()

    clock = Clock()
    ids = IdReserve(MemoryStore(), FLOOR, 1.0, clock, start=no_thread, monotonic=Ticks(clock), timer=False)
    got = takes(ids, clock, 10, per_second=20)
    assert len(started) >= 2 and ids.refills >= 1
    assert any(g is not None for g in got)
