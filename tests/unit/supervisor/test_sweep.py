"""Supervisor decisions: expiry, redrive with backoff, threshold, races, lost sends, cost."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest

from shared.core.effects import bucket_of, due_bound
from shared.core.rows import IndexRow
from shared.core.statemachine import StateRow, View, decide_expired, index_verdict
from shared.storage.memory import MemoryStore
from shared.supervisor import sweep
from tests.unit.harness import T0, AgentSim, Clock, DedupBus, deliver_schedules, drive, make_runtime, post, state, steps


def _claimed(rt) -> str:  # type: ignore[no-untyped-def]
    oid = post(rt).body["orderId"]  # the submission claims the order and dispatches step 1
    assert state(rt, oid)["LockedBy"]
    return oid


def test_expired_step_is_redriven_with_failure_count() -> None:
    rt = make_runtime()
    oid = _claimed(rt)
    rt.clock.advance(29)
    assert sweep(rt).acted == {}
    rt.clock.advance(2)
    report = sweep(rt)
    assert report.acted == {"redriven": 1}
    st = state(rt, oid)
    assert (st["ProcessState"], st.get("LockedBy"), st["FailureCount"], st["LeaseKey"]) == ("Pending", None, 1,
                                                                                           "unclaimed")
    assert st["CompleteBy"] == (T0 + timedelta(seconds=31 + 30)).isoformat(timespec="microseconds")
    s = steps(rt, oid)["reserve-inventory"]
    assert s["State"] == "Pending" and "timed out" in s["FailureReason"]
    [msg] = rt.bus.peek("scheduler")
    assert msg.body == {"kind": "schedule", "orderId": oid, "seq": 1}
    assert msg.scheduled_enqueue_time is None  # FailureCount 1 <= BackoffThreshold 1: no delay
    assert deliver_schedules(rt) == ["claimed"]
    assert state(rt, oid)["LeaseKey"] == "reserve-inventory:2"


def test_backoff_grows_past_threshold() -> None:
    rt = make_runtime(max_failures=5)
    cfg = rt.config
    assert [cfg.backoff(n).total_seconds() for n in range(1, 6)] == [0, 5, 10, 20, 40]
    assert cfg.backoff(30).total_seconds() == cfg.backoff_cap_seconds
    oid = _claimed(rt)
    delays = []
    for _ in range(3):
        rt.clock.advance(31)
        sweep(rt)
        [msg] = rt.bus.take("scheduler")
        delays.append((msg.scheduled_enqueue_time - rt.clock()).total_seconds() if msg.scheduled_enqueue_time else 0)
        rt.clock.advance(delays[-1])
        from shared.scheduler import handle_schedule

        assert handle_schedule(rt, json.dumps(msg.body).encode()) == "claimed"
    assert delays == [0, 5, 10]
    assert state(rt, oid)["FailureCount"] == 3


def test_threshold_errors_alerts_and_compensates(caplog: pytest.LogCaptureFixture) -> None:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    agents = AgentSim(rt, hang={"charge-payment"})
    with caplog.at_level(logging.ERROR, logger="orders"):
        st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["FailureCount"], st["Outcome"]) == ("Error", 3, "failed")
    assert st["CompensationState"] == "completed"
    assert agents.calls[-1] == (oid, "reserve-inventory", "release")
    s = steps(rt, oid)
    assert s["charge-payment"]["State"] == "Failed" and s["charge-payment"]["Attempt"] == 3
    # its outcome is unknown: it is compensated first, by its key (here nothing was applied:
    # the agent hung before calling, so the refund tombstones the key)
    assert s["charge-payment"]["Compensation"] == "Done"
    assert agents.tombstones == [(oid, "charge-payment", "refund")]
    [alert] = rt.bus.peek("alerts")
    assert alert.body["failureCount"] == 3 and alert.body["step"] == "charge-payment"
    line = next(json.loads(r.getMessage()) for r in caplog.records if '"event":"alert"' in r.getMessage())
    assert (line["orderId"], line["step"], line["failureCount"]) == (oid, "charge-payment", 3)
    assert "timed out" in line["reason"]


def test_hung_compensation_is_redriven_then_given_up() -> None:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    agents = AgentSim(rt, reject={"create-shipment": "no"}, hang={"charge-payment:compensate"})
    st = drive(rt, oid, agents)
    assert st["CompensationState"] == "failed"
    s = steps(rt, oid)
    assert s["charge-payment"]["Compensation"] == "Failed" and s["charge-payment"]["CompensationAttempt"] == 3
    assert s["reserve-inventory"]["Compensation"] == "Done"
    assert [a.body["step"] for a in rt.bus.peek("alerts")] == ["create-shipment", "charge-payment"]


def test_hung_compensation_recovers_when_agent_comes_back() -> None:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    agents = AgentSim(rt, reject={"create-shipment": "no"}, hang={"charge-payment:compensate"})
    drive(rt, oid, agents, until=lambda st: st.get("CompFailureCount", 0) == 1)
    agents.hang.clear()
    st = drive(rt, oid, agents)
    assert st["CompensationState"] == "completed"
    assert steps(rt, oid)["charge-payment"]["CompensationAttempt"] == 2


def test_two_supervisors_race_count_failure_once() -> None:
    store, bus, clock = MemoryStore(), DedupBus(), Clock()
    a = make_runtime(store, bus, clock, instance="sup-a")
    b = make_runtime(store, bus, clock, instance="sup-b")
    oid = _claimed(a)
    clock.advance(31)
    # both read the same rows and decide, then both write
    da = decide_expired(View.from_entities(store.read_partition(oid)), a.ctx())
    db = decide_expired(View.from_entities(store.read_partition(oid)), b.ctx())
    oa, ob = a.run(da.effects), b.run(db.effects)
    assert sorted([oa.lost_race, ob.lost_race]) == [False, True]
    assert state(a, oid)["FailureCount"] == 1
    assert len(bus.peek("scheduler")) == 1  # the loser sent nothing
    # and a later sweep by either finds nothing left to do
    assert sweep(b).acted == {}
    assert state(a, oid)["FailureCount"] == 1


def test_lost_first_request_and_lost_redrive_notice_are_recovered() -> None:
    rt = make_runtime()
    rt.bus.fail.add("agent-inventory")
    oid = post(rt).body["orderId"]
    rt.bus.fail.clear()
    rt.clock.advance(29)
    assert sweep(rt).acted == {}  # the step's deadline has not passed
    rt.bus.fail.add("scheduler")  # ... and the redrive's schedule message is lost as well
    rt.clock.advance(2)
    assert sweep(rt).acted == {"redriven": 1}
    rt.bus.fail.clear()
    rt.clock.advance(20)
    assert sweep(rt).acted == {}  # within the grace period
    rt.clock.advance(11)
    assert sweep(rt).acted == {"rescheduled": 1}
    [msg] = rt.bus.peek("scheduler")
    assert msg.body["seq"] == 2
    assert deliver_schedules(rt) == ["claimed"]
    assert drive(rt, oid, AgentSim(rt))["ProcessState"] == "Processed"
    assert state(rt, oid)["FailureCount"] == 1
    assert rt.store.index_rows() == []


def test_sweep_never_reads_finished_or_future_orders() -> None:
    rt = make_runtime()
    done = [post(rt).body["orderId"] for _ in range(5)]
    agents = AgentSim(rt)
    for oid in done:
        drive(rt, oid, agents)
    running = _claimed(rt)  # deadline 30 s ahead
    sweep(rt)  # this process's first sweep reads every breaker once (shared.supervisor.breakers.full_pass)
    rt.store.reads.clear()
    rt.clock.advance(5)
    report = sweep(rt)
    # only the running order's row (same due minute, not yet due) is seen; no order's state is
    # read, and no breaker (none has a watch: none ever opened)
    assert (report.seen, report.kept) == (1, 1)
    assert rt.store.reads == [("deadline", due_bound(rt.clock()))]
    assert running


def test_index_row_verdicts() -> None:
    now = T0
    past, ahead = now - timedelta(seconds=1), now + timedelta(seconds=9)
    st = {"LeaseKey": "s:1", "CompleteBy": past.isoformat()}  # stored state rows, read as the sweep reads them
    row = StateRow.from_entity
    assert index_verdict(row(st), past, now) == "act"
    assert index_verdict(row(st), now - timedelta(seconds=5), now) == "act"  # any due row of an overdue order
    # the order is slower than its row: its deadline is still ahead, so the row moves there
    assert index_verdict(row({**st, "CompleteBy": ahead.isoformat()}), past, now) == "move"
    assert index_verdict(row({"LeaseKey": ""}), past, now) == "delete"  # finished or held: no deadline
    assert index_verdict(row({"LeaseKey": "s:1"}), past, now) == "delete"
    assert index_verdict(row(st), now + timedelta(seconds=1), now) == "keep"  # not due yet
    assert index_verdict(None, now - timedelta(seconds=10), now) == "keep"  # its submission may be running
    assert index_verdict(None, now - timedelta(minutes=6), now) == "delete"  # an orphan


def test_slow_order_row_is_moved_not_acted() -> None:
    rt = make_runtime()
    oid = _claimed(rt)  # step 1 due T0+30; the order's row too
    from tests.unit.core.statemachine.test_statemachine import _reply

    rt.clock.advance(20)
    assert _reply(rt, oid, "reserve-inventory", 1) == "step-done"  # step 2 due T0+50
    rt.clock.advance(11)
    report = sweep(rt)
    assert (report.acted, report.moved, report.deleted) == ({}, 1, 1)
    assert [r["Due"] for r in rt.store.index_rows()] == [state(rt, oid)["CompleteBy"]]
    rt.clock.advance(20)
    assert sweep(rt).acted == {"redriven": 1}  # on time for step 2's deadline


def test_a_later_step_with_a_shorter_timeout_is_supervised_on_time() -> None:
    from dataclasses import replace

    from tests.unit.harness import WORKFLOW

    uneven = tuple(replace(s, timeout_seconds=t) for s, t in zip(WORKFLOW, (60, 10, 60), strict=True))
    rt = make_runtime(workflow=uneven)
    assert rt.config.index_floor() == timedelta(seconds=10)
    oid = _claimed(rt)
    at = (T0 + timedelta(seconds=10)).isoformat(timespec="microseconds")
    assert [r["Due"] for r in rt.store.index_rows()] == [at]
    rt.clock.advance(11)
    assert sweep(rt).moved == 1  # step 1 (60 s) still running: re-checked within the floor
    from tests.unit.core.statemachine.test_statemachine import _reply

    rt.clock.advance(4)
    assert _reply(rt, oid, "reserve-inventory", 1) == "step-done"  # step 2 due T0+25, no index write
    dues = [r["Due"] for r in rt.store.index_rows()]
    assert dues == [(T0 + timedelta(seconds=21)).isoformat(timespec="microseconds")]
    rt.clock.advance(7)  # T0+22: step 2's deadline is still ahead
    assert sweep(rt).moved == 1
    rt.clock.advance(4)  # T0+26: one second late at most
    assert sweep(rt).acted == {"redriven": 1}


def test_orphan_index_rows_are_deleted_lazily() -> None:
    rt = make_runtime()
    rt.store.put_index(IndexRow(bucket_of(T0), f"{'f' * 32}:20261122T080000000000", "f" * 32, T0))
    rt.store.put_index(IndexRow(bucket_of(T0), "broken", None, None))
    rt.clock.advance(400)
    report = sweep(rt)
    assert report.deleted == 2 and rt.store.index_rows() == []


def test_sweep_survives_a_failing_row() -> None:
    rt = make_runtime()
    a = _claimed(rt)
    b = _claimed(rt)
    rt.clock.advance(31)
    real = rt.store.read_partition

    def flaky(order_id: str):  # type: ignore[no-untyped-def]
        if order_id == a:
            raise ConnectionError("table unavailable")
        return real(order_id)

    rt.store.read_partition = flaky  # type: ignore[method-assign]
    report = sweep(rt)
    assert report.errors == 1 and report.acted == {"redriven": 1}
    assert state(rt, b)["FailureCount"] == 1 and state(rt, a)["FailureCount"] == 0
    rt.store.read_partition = real  # type: ignore[method-assign]
    assert sweep(rt).acted == {"redriven": 1}
    assert state(rt, a)["FailureCount"] == 1


def test_late_reply_before_supervisor_acts_is_accepted_once() -> None:
    """A reply processed after CompleteBy but before the Supervisor acted still holds the
    lease; the two writers are serialised by the ETag: exactly one wins."""
    rt = make_runtime()
    oid = _claimed(rt)
    rt.clock.advance(31)
    from tests.unit.core.statemachine.test_statemachine import _reply

    assert _reply(rt, oid, "reserve-inventory", 1) == "step-done"
    report = sweep(rt)
    assert "redriven" not in report.acted
    assert state(rt, oid)["FailureCount"] == 0


def test_threshold_with_hold_policy_waits_for_operator() -> None:
    from dataclasses import replace

    from tests.unit.harness import WORKFLOW

    hold = tuple(replace(s, on_failure="hold") for s in WORKFLOW)
    rt = make_runtime(workflow=hold)
    oid = post(rt).body["orderId"]
    agents = AgentSim(rt, hang={"charge-payment"})
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Mode"], st["FailureCount"]) == ("Error", "held", 3)
    assert [c[2] for c in agents.calls] == ["reserve"]  # nothing compensated: held for the operator
    assert len(rt.bus.peek("alerts")) == 1
    assert rt.store.index_rows() == []


def test_a_burst_of_expiries_is_handled_concurrently_each_exactly_once() -> None:
    rt = make_runtime()
    oids = [_claimed(rt) for _ in range(40)]
    rt.bus.take("agent-inventory")
    rt.clock.advance(31)
    report = sweep(rt, workers=8)
    assert report.acted == {"redriven": 40} and report.errors == 0 and report.deferred == 0
    assert [state(rt, oid)["FailureCount"] for oid in oids] == [1] * 40
    assert sorted(m.body["orderId"] for m in rt.bus.take("scheduler")) == sorted(oids)
    assert sweep(rt, workers=8).acted == {}  # nothing due twice


def test_a_sweep_past_its_time_budget_leaves_the_rest_due_for_the_next_tick() -> None:
    rt = make_runtime()
    oids = [_claimed(rt) for _ in range(5)]
    rt.clock.advance(31)
    first = sweep(rt, budget_seconds=0)  # budget already spent: every due row is deferred
    assert first.acted == {} and first.deferred == 5
    assert [state(rt, oid)["FailureCount"] for oid in oids] == [0] * 5
    second = sweep(rt)
    assert second.acted == {"redriven": 5} and second.deferred == 0
    assert [state(rt, oid)["FailureCount"] for oid in oids] == [1] * 5
