"""The circuit breaker's state machine (``shared.core.breaker.state``) and its read-decide-write loop
over one store (``shared.storage.breakers``), including races between instances."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.core.breaker.state import (
    BreakerPolicy,
    BreakerRow,
    BreakerState,
    Effect,
    decide_admit,
    decide_failure,
    decide_success,
)
from shared.settings import Settings
from shared.storage.breakers import BREAKER_PARTITION, BreakerBusy, apply, read_breaker, write_breaker
from shared.storage.memory import MemoryStore
from shared.storage.store import Conflict
from tests.unit.harness import REQUIRED_VALUES

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
POLICY = BreakerPolicy(threshold=3, window=timedelta(seconds=10), cool_down=timedelta(seconds=5),
                       probe_lease=timedelta(seconds=10))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def fail(store: MemoryStore, now: datetime, probe_id: str = "") -> Any:
    return apply(store, "shipping", lambda row: decide_failure(row, now, POLICY, "HTTP 503", probe_id))


def admit(store: MemoryStore, now: datetime, instance: str) -> Any:
    return apply(store, "shipping", lambda row: decide_admit(row, now, POLICY, instance))


def open_breaker(store: MemoryStore, now: datetime = T0) -> None:
    for _ in range(POLICY.threshold):
        fail(store, now)
    assert read_breaker(store, "shipping").state is BreakerState.OPEN


# --- the state machine ------------------------------------------------------------------------


def test_a_breaker_never_written_is_closed_and_admits_calls_without_a_write() -> None:
    store = MemoryStore()
    decision = admit(store, T0, "a")
    assert decision.admission == "call" and decision.row is None
    assert store.writes == 0 and store.read_row(BREAKER_PARTITION, "shipping") is None


def test_threshold_failures_within_the_window_open_it_once_with_one_alert() -> None:
    store = MemoryStore()
    first, second, third = (fail(store, at(i)) for i in range(3))
    assert [d.effects for d in (first, second, third)] == [(), (), (Effect.OPENED,)]
    row = read_breaker(store, "shipping")
    assert row.state is BreakerState.OPEN and row.opens == 1 and row.failures == 3
    assert row.opened_at == at(2) and row.retry_at == at(2) + POLICY.cool_down and row.last_fault == "HTTP 503"
    late = fail(store, at(3))  # a call that started before the open
    assert late.row is None and late.effects == ()


def test_failures_spread_over_more_than_the_window_do_not_open_it() -> None:
    store = MemoryStore()
    fail(store, at(0))
    fail(store, at(5))
    fail(store, at(11))  # the window that started at 0 is over: a new one starts
    row = read_breaker(store, "shipping")
    assert row.state is BreakerState.CLOSED and row.failures == 1 and row.window_start == at(11)


def test_a_success_while_closed_writes_nothing() -> None:
    store = MemoryStore()
    fail(store, T0)
    writes = store.writes
    decision = apply(store, "shipping", lambda row: decide_success(row, at(1)))
    assert decision.row is None and store.writes == writes


def test_open_makes_callers_wait_until_the_cool_down_ends() -> None:
    store = MemoryStore()
    open_breaker(store)
    decision = admit(store, at(4.9), "a")
    assert decision.admission == "wait" and decision.until == at(5) and decision.row is None


def test_after_the_cool_down_one_probe_whose_success_closes_it() -> None:
    store = MemoryStore()
    open_breaker(store)
    probe = admit(store, at(5), "a")
    assert probe.admission == "probe" and probe.probe_id
    row = read_breaker(store, "shipping")
    assert row.state is BreakerState.HALF_OPEN and row.probe_by == "a" and row.probe_until == at(15)
    other = admit(store, at(6), "b")
    assert other.admission == "wait" and other.until == at(15)
    closed = apply(store, "shipping", lambda r: decide_success(r, at(7), probe.probe_id))
    assert closed.effects == (Effect.CLOSED,)
    row = read_breaker(store, "shipping")
    assert row.state is BreakerState.CLOSED and row.failures == 0 and row.probe_id == "" and row.opens == 1
    assert admit(store, at(8), "b").admission == "call"


def test_a_failed_probe_opens_it_again_for_another_cool_down() -> None:
    store = MemoryStore()
    open_breaker(store)
    probe = admit(store, at(5), "a")
    reopened = fail(store, at(6), probe.probe_id)
    assert reopened.effects == (Effect.REOPENED,)
    row = read_breaker(store, "shipping")
    assert row.state is BreakerState.OPEN and row.retry_at == at(11) and row.opens == 1 and row.opened_at == T0
    assert admit(store, at(10), "b").admission == "wait"
    assert admit(store, at(11), "b").admission == "probe"


def test_a_non_probe_outcome_while_half_open_changes_nothing() -> None:
    store = MemoryStore()
    open_breaker(store)
    admit(store, at(5), "a")
    assert fail(store, at(6)).row is None  # a call from before the open, or a stale probe's failure
    assert apply(store, "shipping", lambda r: decide_success(r, at(6))).row is None
    assert read_breaker(store, "shipping").state is BreakerState.HALF_OPEN


def test_the_policy_comes_from_the_settings_declared_once() -> None:
    settings = Settings.from_env({**REQUIRED_VALUES, "BreakerFailureThreshold": "7", "BreakerMaxWaitSeconds": "60"})
    policy = BreakerPolicy.from_settings(settings)
    assert policy.threshold == 7 and policy.max_wait == timedelta(seconds=60)
    assert BreakerPolicy.from_settings(Settings.from_env(REQUIRED_VALUES)) == BreakerPolicy()
    with pytest.raises(ValueError):
        BreakerPolicy(threshold=0)


def test_the_row_round_trips_through_its_stored_properties() -> None:
    row = BreakerRow("shipping", BreakerState.HALF_OPEN, failures=3, window_start=T0, opened_at=at(1),
                     retry_at=at(2), probe_id="p", probe_by="a", probe_until=at(3), opens=2, last_fault="timeout",
                     changed_at=at(4))
    assert BreakerRow.from_props("shipping", row.to_props()) == row


# --- races between instances -------------------------------------------------------------------


def test_two_instances_opening_at_once_open_it_once() -> None:
    store = MemoryStore()
    fail(store, at(0))
    fail(store, at(1))
    seen = read_breaker(store, "shipping")  # both instances decide on this row
    a = decide_failure(seen, at(2), POLICY, "HTTP 503")
    b = decide_failure(seen, at(2), POLICY, "timeout")
    assert a.effects == b.effects == (Effect.OPENED,)
    assert a.row is not None and b.row is not None
    write_breaker(store, a.row)
    with pytest.raises(Conflict):
        write_breaker(store, b.row)
    # the loser reads again and decides again: the open row ignores its failure, no second alert
    again = fail(store, at(2))
    assert again.effects == () and again.row is None
    row = read_breaker(store, "shipping")
    assert row.opens == 1 and row.last_fault == "HTTP 503"


def test_two_first_failures_creating_the_row_at_once_count_twice() -> None:
    store = MemoryStore()
    fresh = read_breaker(store, "shipping")
    a, b = decide_failure(fresh, T0, POLICY, "x"), decide_failure(fresh, T0, POLICY, "y")
    assert a.row is not None and b.row is not None
    write_breaker(store, a.row)
    with pytest.raises(Conflict):  # a create of a row that exists: 409
        write_breaker(store, b.row)
    fail(store, T0)  # the loser's retry
    assert read_breaker(store, "shipping").failures == 2


def test_two_instances_probing_at_once_send_one_probe() -> None:
    store = MemoryStore()
    open_breaker(store)
    seen = read_breaker(store, "shipping")
    a = decide_admit(seen, at(5), POLICY, "a")
    b = decide_admit(seen, at(5), POLICY, "b")
    assert a.admission == b.admission == "probe" and a.probe_id != b.probe_id
    assert a.row is not None and b.row is not None
    write_breaker(store, a.row)
    with pytest.raises(Conflict):
        write_breaker(store, b.row)  # b may not call
    again = admit(store, at(5), "b")
    assert again.admission == "wait"
    assert read_breaker(store, "shipping").probe_by == "a"


def test_a_probe_that_dies_is_replaced_once_its_lease_expires() -> None:
    store = MemoryStore()
    open_breaker(store)
    dead = admit(store, at(5), "a")  # "a" crashes: it never reports
    assert admit(store, at(14.9), "b").admission == "wait"
    second = admit(store, at(15), "b")
    assert second.admission == "probe" and second.probe_id != dead.probe_id
    assert read_breaker(store, "shipping").probe_by == "b"
    # "a" was only slow: its failure is not the current probe's and changes nothing
    assert fail(store, at(16), dead.probe_id).row is None
    assert read_breaker(store, "shipping").state is BreakerState.HALF_OPEN
    # and the current probe's success closes it
    assert apply(store, "shipping", lambda r: decide_success(r, at(17), second.probe_id)).effects == (Effect.CLOSED,)


def test_a_slow_probes_success_closes_it_and_the_current_probes_finds_it_closed() -> None:
    store = MemoryStore()
    open_breaker(store)
    slow = admit(store, at(5), "a")
    current = admit(store, at(15), "b")
    assert apply(store, "shipping", lambda r: decide_success(r, at(16), slow.probe_id)).effects == (Effect.CLOSED,)
    assert apply(store, "shipping", lambda r: decide_success(r, at(17), current.probe_id)).effects == ()
    assert read_breaker(store, "shipping").state is BreakerState.CLOSED


def test_a_close_racing_a_new_failure_is_settled_by_the_etag() -> None:
    store = MemoryStore()
    open_breaker(store)
    probe = admit(store, at(5), "a")
    half_open = read_breaker(store, "shipping")
    failure = decide_failure(half_open, at(6), POLICY, "timeout")  # not the probe: ignored, writes nothing
    assert failure.row is None
    close = decide_success(half_open, at(6), probe.probe_id)
    assert close.row is not None
    write_breaker(store, close.row)
    # a failure decided on the row after the close counts in a fresh window
    counted = fail(store, at(7))
    assert counted.row is not None and counted.effects == ()
    row = read_breaker(store, "shipping")
    assert row.state is BreakerState.CLOSED and row.failures == 1 and row.window_start == at(7)


def test_a_close_losing_to_a_probe_failure_decides_again_on_the_reopened_row() -> None:
    store = MemoryStore()
    open_breaker(store)
    dead = admit(store, at(5), "a")
    current = admit(store, at(15), "b")
    half_open = read_breaker(store, "shipping")
    close = decide_success(half_open, at(16), dead.probe_id)  # "a"'s late success...
    fail(store, at(16), current.probe_id)  # ...loses to "b"'s failure, written first
    assert close.row is not None
    with pytest.raises(Conflict):
        write_breaker(store, close.row)
    retried = apply(store, "shipping", lambda r: decide_success(r, at(16), dead.probe_id))
    assert retried.row is None  # open again: a stale probe's success does not close it
    assert read_breaker(store, "shipping").state is BreakerState.OPEN


class AlwaysMoved(MemoryStore):
    """Every conditional write loses (another instance always wrote first)."""

    def transact(self, order_id: str, ops: Any) -> None:
        raise Conflict("moved")


def test_losing_every_round_gives_up_instead_of_spinning() -> None:
    with pytest.raises(BreakerBusy):
        fail(AlwaysMoved(), T0)
