"""Steps waiting on an open breaker (``shared.core.statemachine.waiting``) and their resume, on the
pure core with the in-memory store and bus: a wait is not a failure, a resume is fenced by the
lease, the longest wait hands the step to the usual timeout path, and a crash at any point
leaves nothing waiting for ever (``shared.supervisor.breakers``)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from shared.core.breaker.state import BreakerRow, BreakerState
from shared.core.breaker.waiting import WaitingStep, resume_message
from shared.core.breaker.watch import Watch, WatchVerdict, opening_watch
from shared.scheduler import handle_reply, handle_schedule
from shared.storage.breakers import read_breaker, write_breaker
from shared.storage.waiting import register_waiting, waiting_steps
from shared.supervisor import sweep
from shared.supervisor.breakers import handle_watch, put_watch
from tests.unit.core.statemachine.test_operator import events, kinds, membus
from tests.unit.harness import AgentSim, Crash, deliver_schedules, drive, make_runtime, post, state, steps

S = "create-shipment"


def waiting_reply(oid: str, attempt: int, *, wake: bool = False, kind: str = "step", step: str = S,
                  until: str = "2026-11-22T08:10:00+00:00") -> bytes:
    return json.dumps({"kind": kind, "orderId": oid, "step": step, "attempt": attempt, "outcome": "waiting",
                       "breaker": "shipping", "until": until, "wake": wake, "reason": "open: cooling down"}).encode()


def shipping_in_flight() -> tuple[Any, AgentSim, str]:
    rt = make_runtime()
    agents = AgentSim(rt, hang={S})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("LeaseKey") == f"{S}:1")
    agents.hang.clear()
    return rt, agents, oid


def open_shipping(rt: Any, row: BreakerRow) -> Watch:
    """Open the shipping breaker as a gate does: the opening's watch first, then the open write."""
    watch = opening_watch(row)
    put_watch(rt.store, watch)
    write_breaker(rt.store, replace(row, etag=read_breaker(rt.store, "shipping").etag))
    return watch


def resume(rt: Any, oid: str, attempt: int, target: str = "step", step: str = S) -> str:
    msg = resume_message(WaitingStep(oid, attempt, step, target), "scheduler")  # type: ignore[arg-type]
    return handle_schedule(rt, json.dumps(msg.body).encode(), message_id=msg.message_id)


def test_a_wait_is_recorded_without_a_failure_and_moves_the_deadline_to_the_longest_wait() -> None:
    rt, _agents, oid = shipping_in_flight()
    before = state(rt, oid)
    assert handle_reply(rt, waiting_reply(oid, 1)) == "waiting"
    st, step = state(rt, oid), steps(rt, oid)[S]
    assert st["FailureCount"] == 0 and st["LeaseKey"] == f"{S}:1" and step["Attempt"] == 1
    assert step["WaitingOn"] == "shipping"
    assert step["WaitingSince"].startswith(rt.clock().strftime("%Y-%m-%dT%H:%M:%S"))
    assert st["CompleteBy"] > before["CompleteBy"]
    assert st["CompleteBy"].startswith((rt.clock() + timedelta(seconds=300)).strftime("%Y-%m-%dT%H:%M:%S"))
    assert kinds(rt, oid)[-1] == "stepWaiting"
    # a redelivered waiting reply changes nothing
    assert handle_reply(rt, waiting_reply(oid, 1)) == "waiting-duplicate"
    assert kinds(rt, oid).count("stepWaiting") == 1


def test_the_woken_step_gets_a_resume_scheduled_at_until() -> None:
    rt, _agents, oid = shipping_in_flight()
    until = rt.clock() + timedelta(seconds=5)
    handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat()))
    [wake] = membus(rt).peek("scheduler")
    assert wake.body == {"kind": "resume", "orderId": oid, "step": S, "attempt": 1, "for": "step"}
    assert wake.scheduled_enqueue_time == until and wake.message_id.endswith(":wake")


def test_a_resume_re_dispatches_the_next_attempt_with_the_same_key_and_the_first_wait_kept() -> None:
    rt, agents, oid = shipping_in_flight()
    handle_reply(rt, waiting_reply(oid, 1))
    since = steps(rt, oid)[S]["WaitingSince"]
    rt.clock.advance(20)
    assert resume(rt, oid, 1) == "resumed"
    st, step = state(rt, oid), steps(rt, oid)[S]
    assert st["LeaseKey"] == f"{S}:2" and st["FailureCount"] == 0
    assert step["WaitingSince"] == since and "WaitingOn" not in step  # the max wait counts from the first wait
    [first, second] = [m for m in membus(rt).peek("agent-shipping") if m.body["orderId"] == oid]
    assert (first.body["attempt"], second.body["attempt"]) == (1, 2)
    assert first.body["idempotencyKey"] == second.body["idempotencyKey"]
    assert kinds(rt, oid)[-2:] == ["resumed", "dispatched"]
    # the same resume again, or one for another attempt, is stale
    assert resume(rt, oid, 1) == "stale" and resume(rt, oid, 7) == "stale"
    assert state(rt, oid)["LeaseKey"] == f"{S}:2"
    drive(rt, oid, agents)
    assert state(rt, oid)["ProcessState"] == "Processed" and state(rt, oid)["FailureCount"] == 0


def test_a_resume_that_loses_its_race_to_the_waiting_reply_decides_again() -> None:
    """Found by the chaos run: the closer's resume read the order, the waiting reply wrote first,
    the resume's write lost (412) and the resume was dropped: the step waited its longest wait."""
    rt, agents, oid = shipping_in_flight()
    stale = rt.store.read_partition(oid)
    assert handle_reply(rt, waiting_reply(oid, 1)) == "waiting"  # wins the race
    fresh, reads = rt.store.read_partition, []

    def first_read_stale(partition: str) -> Any:
        reads.append(partition)
        return stale if len(reads) == 1 else fresh(partition)

    rt.store.read_partition = first_read_stale  # type: ignore[method-assign]
    assert resume(rt, oid, 1) == "resumed" and len(reads) == 2
    rt.store.read_partition = fresh  # type: ignore[method-assign]
    assert state(rt, oid)["LeaseKey"] == f"{S}:2"
    drive(rt, oid, agents)
    assert state(rt, oid)["ProcessState"] == "Processed" and state(rt, oid)["FailureCount"] == 0


def test_a_resume_that_overtakes_the_waiting_reply_makes_the_reply_stale() -> None:
    rt, _agents, oid = shipping_in_flight()
    assert resume(rt, oid, 1) == "resumed"
    assert handle_reply(rt, waiting_reply(oid, 1)) == "stale"
    assert "WaitingOn" not in steps(rt, oid)[S] and state(rt, oid)["LeaseKey"] == f"{S}:2"


def test_past_the_longest_wait_the_usual_timeout_path_applies() -> None:
    rt, _agents, oid = shipping_in_flight()
    handle_reply(rt, waiting_reply(oid, 1))
    for _ in range(29):  # 290 s: still waiting
        rt.clock.advance(10)
        sweep(rt)
    assert state(rt, oid)["FailureCount"] == 0 and state(rt, oid)["LeaseKey"] == f"{S}:1"
    rt.clock.advance(15)
    sweep(rt)
    assert state(rt, oid)["FailureCount"] == 1  # timed out like any step
    # its next wait starts a new longest wait (the redrive is not a resume)
    deliver_schedules(rt)
    assert "WaitingSince" not in steps(rt, oid)[S]


def test_a_compensation_waits_and_is_resumed_as_a_compensation() -> None:
    rt = make_runtime()
    agents = AgentSim(rt, reject={S: "no address"}, hang={"charge-payment:compensate"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("LeaseKey") == "charge-payment:compensate:1")
    assert handle_reply(rt, waiting_reply(oid, 1, kind="compensation", step="charge-payment")) == "waiting"
    assert steps(rt, oid)["charge-payment"]["WaitingOn"] == "shipping"
    assert resume(rt, oid, 1, target="step", step="charge-payment") == "stale"  # not the lease's kind
    assert resume(rt, oid, 1, target="compensation", step="charge-payment") == "resumed"
    assert state(rt, oid)["LeaseKey"] == "charge-payment:compensate:2"
    agents.hang.clear()
    drive(rt, oid, agents)
    assert state(rt, oid)["CompensationState"] == "completed"
    assert "stepWaiting" in kinds(rt, oid) and "resumed" in kinds(rt, oid)


@pytest.mark.parametrize("crash_after", [0, 1])
def test_a_crash_around_the_wait_loses_no_step(crash_after: int) -> None:
    """Crash before the wait is written (0: the reply is redelivered) or after it, before the
    wake-up is sent (1): either way the step is resumed and the order completes, FailureCount 0."""
    rt, agents, oid = shipping_in_flight()
    open_shipping(rt, BreakerRow("shipping", BreakerState.OPEN, retry_at=rt.clock() + timedelta(seconds=5), opens=1))
    register_waiting(rt.store, "shipping", WaitingStep(oid, 1, S), rt.clock())  # as the agent did
    rt.crash_at = crash_after
    with pytest.raises(Crash):
        handle_reply(rt, waiting_reply(oid, 1, wake=True, until=(rt.clock() + timedelta(seconds=5)).isoformat()))
    assert membus(rt).peek("scheduler") == []  # no wake-up was sent
    if crash_after == 0:
        assert handle_reply(rt, waiting_reply(oid, 1, wake=True)) == "waiting"  # the redelivery
        membus(rt).take("scheduler")  # ... and its wake-up is lost too
    rt.clock.advance(11)  # cool-down over and the wake overdue: the Supervisor resumes the oldest waiting step
    sweep(rt)
    [probe] = membus(rt).peek("scheduler")
    assert probe.body["orderId"] == oid and "probe-" in probe.message_id
    drive(rt, oid, agents)
    st = state(rt, oid)
    assert st["ProcessState"] == "Processed" and st["FailureCount"] == 0


def test_a_closer_that_dies_before_its_resumes_leaves_them_to_the_supervisor() -> None:
    rt, agents, oid = shipping_in_flight()
    opened = BreakerRow("shipping", BreakerState.OPEN, retry_at=rt.clock() + timedelta(seconds=5), opens=1)
    watch = open_shipping(rt, opened)
    handle_reply(rt, waiting_reply(oid, 1))
    register_waiting(rt.store, "shipping", WaitingStep(oid, 1, S), rt.clock())
    closed = BreakerRow("shipping", BreakerState.CLOSED, opens=1)  # closed, resumes never sent
    write_breaker(rt.store, replace(closed, etag=read_breaker(rt.store, "shipping").etag))
    rt.clock.advance(10)  # the watch falls due: the next sweep resends the resumes and drops the watch
    assert sweep(rt).breakers == {"resume-all": 1}
    assert waiting_steps(rt.store, "shipping") == []
    assert watch.row_key not in {r.row_key for r in rt.store.due_index("299912312359", 100)}
    # sent twice (a second Supervisor run, or the closer's own resume after all): the queue drops
    # the copy; one delivered after the duplicate-detection window is stale
    membus(rt).send(resume_message(WaitingStep(oid, 1, S), "scheduler"))
    assert deliver_schedules(rt) == ["resumed"]
    assert resume(rt, oid, 1) == "stale"
    drive(rt, oid, agents)
    assert state(rt, oid)["ProcessState"] == "Processed" and state(rt, oid)["FailureCount"] == 0
    assert kinds(rt, oid).count("resumed") == 1


def test_a_watch_leaves_a_cooling_breaker_and_an_awake_one_alone() -> None:
    rt, _agents, oid = shipping_in_flight()
    now = rt.clock()
    watch = open_shipping(rt, BreakerRow("shipping", BreakerState.OPEN, retry_at=now + timedelta(seconds=3), opens=1))
    register_waiting(rt.store, "shipping", WaitingStep(oid, 1, S), rt.clock())
    assert handle_watch(rt.store, rt.bus, "scheduler", watch, now) == (WatchVerdict.KEEP, 0)  # not due
    awake = BreakerRow("shipping", BreakerState.HALF_OPEN, probe_id="p", probe_until=now + timedelta(seconds=10),
                       opens=1)
    write_breaker(rt.store, replace(awake, etag=read_breaker(rt.store, "shipping").etag))
    # due, but a probe is out: the watch moves to the end of its lease + grace
    assert handle_watch(rt.store, rt.bus, "scheduler", watch, now + timedelta(seconds=12)) == (WatchVerdict.MOVE, 0)
    [moved] = [Watch.from_row(r.row_key, r.due)
               for r in rt.store.due_index("299912312359", 100) if r.row_key.startswith("breaker:")]
    assert moved is not None and moved.due > now + timedelta(seconds=15) and moved.opening == 1
    assert handle_watch(rt.store, rt.bus, "scheduler", moved, now + timedelta(seconds=16)) == (WatchVerdict.WAKE, 1)
    assert events(rt, oid)[-1]["event"] == "dispatched"  # nothing happened to the order itself
