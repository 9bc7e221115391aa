"""Steps waiting on an open breaker (``shared.core.statemachine.waiting``) and their resume, on the
pure core with the in-memory store and bus: a wait is not a failure, a resume is fenced by the
lease, probes write nothing, the longest wait fails the step once, every end of a wait forgets its
row, and a crash at any point leaves nothing waiting for ever (``shared.supervisor.breakers``)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from shared.core.breaker.state import BreakerRow, BreakerState
from shared.core.breaker.waiting import WaitingStep, resume_message
from shared.core.breaker.watch import Watch, WatchVerdict, opening_watch
from shared.core.statemachine.waiting import rewake_tag
from shared.scheduler import handle_reply, handle_schedule
from shared.storage.breakers import read_breaker, write_breaker
from shared.storage.waiting import register_waiting, waiting_steps
from shared.supervisor import sweep
from shared.supervisor.breakers import handle_watch, put_watch
from tests.unit.core.statemachine.test_operator import events, kinds, membus
from tests.unit.harness import AgentSim, Crash, deliver_schedules, drive, make_runtime, post, state, steps

S = "create-shipment"


def waiting_reply(oid: str, attempt: int, *, wake: bool = False, kind: str = "step", step: str = S,
                  until: str = "2026-11-22T08:10:00+00:00", opening: int | None = None) -> bytes:
    return json.dumps({"kind": kind, "orderId": oid, "step": step, "attempt": attempt, "outcome": "waiting",
                       "breaker": "shipping", "until": until, "wake": wake, "reason": "open: cooling down",
                       **({"opening": opening} if opening is not None else {})}).encode()


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


def resume(rt: Any, oid: str, attempt: int, target: str = "step", step: str = S, *, why: str = "closed",
           tag: str = "o1") -> str:
    msg = resume_message(WaitingStep(oid, attempt, step, target), "scheduler",  # type: ignore[arg-type]
                         remote="shipping", why=why, tag=tag)  # type: ignore[arg-type]
    return handle_schedule(rt, json.dumps(msg.body).encode(), message_id=msg.message_id)


def requests_of(rt: Any, oid: str) -> list[Any]:
    return [m for m in membus(rt).peek("agent-shipping") if m.body["orderId"] == oid]


def test_a_wait_is_recorded_without_a_failure_and_moves_the_deadline_to_the_longest_wait() -> None:
    rt, _agents, oid = shipping_in_flight()
    before = state(rt, oid)
    assert handle_reply(rt, waiting_reply(oid, 1)) == "waiting"
    st, step = state(rt, oid), steps(rt, oid)[S]
    assert st["FailureCount"] == 0 and st["LeaseKey"] == f"{S}:1" and step["Attempt"] == 1
    assert step["WaitingOn"] == "shipping" and st["WaitingOn"] == "shipping"  # the state row, for the search
    assert step["WaitingSince"].startswith(rt.clock().strftime("%Y-%m-%dT%H:%M:%S"))
    assert st["CompleteBy"] > before["CompleteBy"]
    assert st["CompleteBy"].startswith((rt.clock() + timedelta(seconds=300)).strftime("%Y-%m-%dT%H:%M:%S"))
    assert kinds(rt, oid)[-1] == "stepWaiting"
    # a redelivered waiting reply changes nothing
    assert handle_reply(rt, waiting_reply(oid, 1)) == "waiting-duplicate"
    assert kinds(rt, oid).count("stepWaiting") == 1


def test_the_woken_step_gets_a_probe_resume_scheduled_at_until() -> None:
    rt, _agents, oid = shipping_in_flight()
    until = rt.clock() + timedelta(seconds=5)
    handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat()))
    [wake] = membus(rt).peek("scheduler")
    assert wake.body == {"kind": "resume", "orderId": oid, "step": S, "attempt": 1, "for": "step", "why": "probe",
                         "tag": "probe-20261122T080005000000", "remote": "shipping"}
    assert wake.scheduled_enqueue_time == until and wake.message_id.endswith(":probe-20261122T080005000000")


def test_probes_send_the_same_attempt_again_and_write_nothing_until_the_breaker_closes() -> None:
    rt, agents, oid = shipping_in_flight()
    handle_reply(rt, waiting_reply(oid, 1, wake=True))
    since, seq = steps(rt, oid)[S]["WaitingSince"], state(rt, oid)["EventSeq"]
    for n in range(3):  # three probe cycles: each one's request fails, its reply says waiting again
        rt.clock.advance(5)
        etag = state(rt, oid)["etag"] if "etag" in state(rt, oid) else None
        assert resume(rt, oid, 1, why="probe", tag=f"probe-{n}") == "probing"
        assert handle_reply(rt, waiting_reply(oid, 1, wake=True)) == "waiting-duplicate"
        assert state(rt, oid).get("etag") == etag
    st, step = state(rt, oid), steps(rt, oid)[S]
    assert (st["EventSeq"], st["FailureCount"], st["LeaseKey"], step["Attempt"]) == (seq, 0, f"{S}:1", 1)
    probes = requests_of(rt, oid)[1:]
    assert [m.body["attempt"] for m in probes] == [1, 1, 1]
    assert {m.body["idempotencyKey"] for m in requests_of(rt, oid)} == {f"{oid}:{S}"}
    assert [m.message_id for m in probes] == [f"{oid}:{S}:1:probe-{n}" for n in range(3)]
    # the breaker closes: the wait ends (one resumed event), the deadline is the step's timeout again
    rt.clock.advance(20)
    assert resume(rt, oid, 1) == "resumed"
    st, step = state(rt, oid), steps(rt, oid)[S]
    assert st["LeaseKey"] == f"{S}:1" and "WaitingOn" not in step and "WaitingOn" not in st
    assert step["WaitingSince"] == since  # a later wait of this attempt counts its longest wait from the first
    assert st["CompleteBy"].startswith((rt.clock() + rt.config.timeout(rt.config.spec(S))).strftime("%Y-%m-%dT%H:%M"))
    assert requests_of(rt, oid)[-1].message_id == f"{oid}:{S}:1:o1"
    assert kinds(rt, oid)[-2:] == ["stepWaiting", "resumed"]
    # a copy of the resume sends the same request (same id: the queue drops it); another attempt's is stale
    assert resume(rt, oid, 1) == "resent" and requests_of(rt, oid)[-1].message_id == f"{oid}:{S}:1:o1"
    assert resume(rt, oid, 7) == "stale"
    drive(rt, oid, agents)
    assert state(rt, oid)["ProcessState"] == "Processed" and state(rt, oid)["FailureCount"] == 0
    assert kinds(rt, oid).count("stepWaiting") == 1 and kinds(rt, oid).count("resumed") == 1


def test_a_probe_that_gets_an_answer_ends_the_wait_and_forgets_its_row() -> None:
    rt, agents, oid = shipping_in_flight()
    register_waiting(rt.store, "shipping", WaitingStep(oid, 1, S), rt.clock())  # as the agent did
    handle_reply(rt, waiting_reply(oid, 1, wake=True))
    assert resume(rt, oid, 1, why="probe", tag="probe-1") == "probing"
    drive(rt, oid, agents)
    assert state(rt, oid)["ProcessState"] == "Processed" and state(rt, oid)["FailureCount"] == 0
    assert kinds(rt, oid)[-4:] == ["stepWaiting", "resumed", "stepDone", "processed"]
    assert waiting_steps(rt.store, "shipping") == []
    # the closer's resume, late: stale (the order is done), and it would forget the row again
    assert resume(rt, oid, 1) == "stale"


def test_a_closed_resume_ahead_of_the_waiting_reply_sends_the_request_again() -> None:
    """The closer listed the step's row before its waiting reply was recorded: the resume finds no
    wait and sends the request again; the wait recorded after it ends with that request's reply."""
    rt, agents, oid = shipping_in_flight()
    assert resume(rt, oid, 1) == "resent"
    assert handle_reply(rt, waiting_reply(oid, 1)) == "waiting"  # late, and still the attempt in flight
    assert steps(rt, oid)[S]["WaitingOn"] == "shipping"
    drive(rt, oid, agents)  # the request sent again gets its answer
    st = state(rt, oid)
    assert st["ProcessState"] == "Processed" and st["FailureCount"] == 0 and steps(rt, oid)[S]["Attempt"] == 1
    assert kinds(rt, oid)[-4:] == ["stepWaiting", "resumed", "stepDone", "processed"]


def test_a_close_ahead_of_the_waiting_reply_is_recorded_so_the_late_reply_starts_no_wait() -> None:
    """Found by the chaos run: the agent registered the step (the breaker still half-open), the
    probe closed it, the closer resumed the step before its waiting reply was recorded, and the
    request sent again expired in the agent (transient faults past the step's deadline), answering
    nothing. The late reply, read on the opening that had closed, recorded a wait no close would
    end: the step waited out the longest wait (300 s) and failed. The close is now recorded on the
    step, the late reply is stale, and the step's own deadline redrives it."""
    rt, agents, oid = shipping_in_flight()
    deadline = state(rt, oid)["CompleteBy"]
    assert resume(rt, oid, 1, tag="o1") == "resent"
    assert steps(rt, oid)[S]["WaitingOpening"] == 1 and kinds(rt, oid)[-1] == "resumed"
    [request] = [m for m in requests_of(rt, oid) if m.message_id == f"{oid}:{S}:1:o1"]
    assert handle_reply(rt, waiting_reply(oid, 1, opening=1)) == "stale"  # read on the opening that closed
    assert state(rt, oid)["CompleteBy"] == deadline and "WaitingOn" not in steps(rt, oid)[S]
    seq = state(rt, oid)["EventSeq"]
    assert resume(rt, oid, 1, tag="o1") == "resent"  # a copy of the close: the request again, nothing written
    assert state(rt, oid)["EventSeq"] == seq
    membus(rt).take("agent-shipping")  # the request sent again expires in the agent: no answer
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed" and steps(rt, oid)[S]["Attempt"] == 2, st  # redriven at its deadline
    assert "stepWaiting" not in kinds(rt, oid) and request.body["attempt"] == 1


def test_a_waiting_reply_read_before_the_close_that_ended_the_wait_starts_no_new_wait() -> None:
    """A copy of the waiting reply (or one the close's resume overtook) after the close of its
    opening ended the wait: stale, nothing written, no probe. A reply of the next opening is a
    new wait, and only that opening's close ends it."""
    rt, agents, oid = shipping_in_flight()
    assert handle_reply(rt, waiting_reply(oid, 1, wake=True, opening=1)) == "waiting"
    assert resume(rt, oid, 1, tag="o1") == "resumed"
    assert steps(rt, oid)[S]["WaitingOpening"] == 1
    seq, wakes = state(rt, oid)["EventSeq"], len(membus(rt).peek("scheduler"))
    assert handle_reply(rt, waiting_reply(oid, 1, wake=True, opening=1)) == "stale"
    assert state(rt, oid)["EventSeq"] == seq and "WaitingOn" not in steps(rt, oid)[S]
    assert len(membus(rt).peek("scheduler")) == wakes  # no probe for a closed opening
    # the breaker opened again: the request the close sent again meets opening 2, a new wait
    assert handle_reply(rt, waiting_reply(oid, 1, opening=2)) == "waiting"
    assert steps(rt, oid)[S]["WaitingOpening"] == 2
    # a late copy of opening 1's resume does not end it: the request goes again, nothing written
    seq = state(rt, oid)["EventSeq"]
    assert resume(rt, oid, 1, tag="o1") == "resent"
    assert state(rt, oid)["EventSeq"] == seq and steps(rt, oid)[S]["WaitingOn"] == "shipping"
    assert requests_of(rt, oid)[-1].message_id == f"{oid}:{S}:1:o1"
    assert resume(rt, oid, 1, tag="o2") == "resumed"
    drive(rt, oid, agents)
    assert state(rt, oid)["ProcessState"] == "Processed" and state(rt, oid)["FailureCount"] == 0
    assert kinds(rt, oid).count("stepWaiting") == 2 and kinds(rt, oid).count("resumed") == 2


def test_a_waiting_reply_without_an_opening_still_starts_a_wait_after_a_close() -> None:
    """An older agent's reply says no opening: it is taken as a new wait, as before."""
    rt, _agents, oid = shipping_in_flight()
    assert handle_reply(rt, waiting_reply(oid, 1, opening=1)) == "waiting"
    assert resume(rt, oid, 1, tag="o1") == "resumed"
    assert handle_reply(rt, waiting_reply(oid, 1)) == "waiting"


def test_a_probe_for_a_step_that_no_longer_waits_is_ignored() -> None:
    rt, _agents, oid = shipping_in_flight()
    handle_reply(rt, waiting_reply(oid, 1))
    assert resume(rt, oid, 1) == "resumed"
    sent = len(requests_of(rt, oid))
    assert resume(rt, oid, 1, why="probe", tag="probe-9") == "ignored"
    assert len(requests_of(rt, oid)) == sent


def test_a_stale_resume_forgets_the_row_that_named_it() -> None:
    """A row left behind by a crash (its order moved on) would be resumed at every close and picked
    for every probe the Supervisor sends: the first resume that finds it stale forgets it."""
    rt, _agents, oid = shipping_in_flight()
    register_waiting(rt.store, "shipping", WaitingStep(oid, 7, S), rt.clock())
    assert resume(rt, oid, 7, why="probe", tag="probe-1") == "stale"
    assert waiting_steps(rt.store, "shipping") == []


@pytest.mark.parametrize("crash_after", [None, 1])
def test_past_the_longest_wait_the_step_fails_for_good_once(crash_after: int | None) -> None:
    """The pivot (no compensation, its outcome unknown): held, BreakerMaxWaitSeconds after its
    wait began, FailureCount unchanged, its waiting row forgotten (crash_after=1: the process died
    after the write, before the forget; the closer's resume, stale, forgets it)."""
    rt, _agents, oid = shipping_in_flight()
    register_waiting(rt.store, "shipping", WaitingStep(oid, 1, S), rt.clock())
    handle_reply(rt, waiting_reply(oid, 1))
    for _ in range(29):  # 290 s: still waiting
        rt.clock.advance(10)
        sweep(rt)
    assert state(rt, oid)["FailureCount"] == 0 and state(rt, oid)["LeaseKey"] == f"{S}:1"
    rt.clock.advance(15)
    if crash_after is None:
        sweep(rt)
    else:
        crash_one_sweep(rt, crash_after)
    st, step = state(rt, oid), steps(rt, oid)[S]
    assert (st["Mode"], st["Outcome"], st["FailureCount"]) == ("held", "held", 0), st
    assert "waited 300 s on the open breaker of shipping" in st["Reason"] and "WaitingOn" not in step
    assert kinds(rt, oid)[-4:] == ["stepWaiting", "stepFailed", "alert", "held"]
    if crash_after is not None:
        assert waiting_steps(rt.store, "shipping") == [WaitingStep(oid, 1, S)]
        assert resume(rt, oid, 1) == "stale"
    assert waiting_steps(rt.store, "shipping") == []


def crash_one_sweep(rt: Any, k: int) -> None:
    """The Supervisor's decision on the overdue order runs only its first ``k`` effects."""
    from shared.runtime.executor import execute

    real = rt.run

    def run(effects: Any, limit: Any = None) -> Any:
        if any(type(e).__name__ == "ForgetWaiting" for e in effects):
            rt.run = real
            execute(effects, rt.store, rt.bus, keys=rt.keys, limit=len(effects) - 1)  # all but the forget (last)
            raise Crash("died before forgetting the waiting row")
        return real(effects, limit)

    rt.run = run
    with pytest.raises(Crash):
        sweep(rt)
    rt.run = real


def test_a_terminate_stops_the_wait_and_forgets_the_row() -> None:
    from shared.api.operator import terminate_order

    rt, _agents, oid = shipping_in_flight()
    register_waiting(rt.store, "shipping", WaitingStep(oid, 1, S), rt.clock())
    handle_reply(rt, waiting_reply(oid, 1))
    assert terminate_order(rt, oid).status == 202  # terminating: its done steps are compensated
    assert "WaitingOn" not in steps(rt, oid)[S] and "WaitingOn" not in state(rt, oid)
    assert waiting_steps(rt.store, "shipping") == []
    assert resume(rt, oid, 1) == "stale"


def refund_in_flight() -> tuple[Any, AgentSim, str]:
    """Shipping rejected: the refund (charge-payment's compensation, attempt 1) is in flight."""
    rt = make_runtime()
    agents = AgentSim(rt, reject={S: "no address"}, hang={"charge-payment:compensate"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("LeaseKey") == "charge-payment:compensate:1")
    return rt, agents, oid


def test_a_compensation_waits_and_is_resumed_as_a_compensation() -> None:
    rt, agents, oid = refund_in_flight()
    assert handle_reply(rt, waiting_reply(oid, 1, kind="compensation", step="charge-payment")) == "waiting"
    assert steps(rt, oid)["charge-payment"]["WaitingOn"] == "shipping"
    assert resume(rt, oid, 1, target="step", step="charge-payment") == "stale"  # not the lease's kind
    assert resume(rt, oid, 1, target="compensation", step="charge-payment") == "resumed"
    assert state(rt, oid)["LeaseKey"] == "charge-payment:compensate:1"  # the attempt did not move
    agents.hang.clear()
    drive(rt, oid, agents)
    assert state(rt, oid)["CompensationState"] == "completed"
    assert kinds(rt, oid).count("stepWaiting") == 1 and kinds(rt, oid).count("resumed") == 1


def test_a_compensation_past_the_longest_wait_fails_for_good_and_the_next_one_goes_on() -> None:
    rt, agents, oid = refund_in_flight()
    handle_reply(rt, waiting_reply(oid, 1, kind="compensation", step="charge-payment"))
    agents.hang.clear()
    rt.clock.advance(301)
    sweep(rt)
    step = steps(rt, oid)["charge-payment"]
    assert step["Compensation"] == "Failed" and "waited 300 s" in step["CompensationReason"]
    drive(rt, oid, agents)
    st = state(rt, oid)
    assert (st["Mode"], st["CompensationState"]) == ("finished", "failed")
    assert steps(rt, oid)["reserve-inventory"]["Compensation"] == "Done"


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
    membus(rt).send(resume_message(WaitingStep(oid, 1, S), "scheduler", remote="shipping", why="closed",
                                   tag="o1"))
    assert deliver_schedules(rt) == ["resumed"]
    assert resume(rt, oid, 1) == "resent"  # the wait ended: the same request again, under the same id
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


def test_a_step_that_waits_again_while_the_last_closer_is_at_work_keeps_its_row() -> None:
    """Found by the chaos run: the closer of opening 1 listed the waiting rows and was sending
    their resumes; one step, resumed already, found opening 2 and registered again (the same row:
    its attempt does not move). The closer then deleted every row it had listed, that one too,
    so opening 2's closer never resumed the step. It now deletes on the ETags it listed."""
    from shared.runtime.resume import resume_waiting

    rt, _agents, oid = shipping_in_flight()
    step = WaitingStep(oid, 1, S)
    register_waiting(rt.store, "shipping", step, rt.clock())
    real_send = rt.bus.send

    def send(message: Any) -> None:  # the step's next wait lands while the closer is sending
        real_send(message)
        register_waiting(rt.store, "shipping", step, rt.clock())

    rt.bus.send = send
    assert resume_waiting(rt.store, rt.bus, "scheduler", "shipping", 1) == 1
    rt.bus.send = real_send
    assert waiting_steps(rt.store, "shipping") == [step]  # left for opening 2's closer
    assert resume_waiting(rt.store, rt.bus, "scheduler", "shipping", 2) == 1
    assert waiting_steps(rt.store, "shipping") == []


# ---- a rate limit's wait: no breaker watches it, the order's deadline does ------------------------
def test_a_rate_wait_owes_its_wake_up_and_the_order_is_due_then_while_a_breaker_wait_is_not() -> None:
    from shared.core.times import parse_iso

    rt, _agents, oid = shipping_in_flight()
    until = rt.clock() + timedelta(seconds=40)
    assert handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat())) == "waiting"
    st, step = state(rt, oid), steps(rt, oid)[S]
    assert parse_iso(step["WakeAt"]) == until
    assert parse_iso(st["CompleteBy"]) == until + timedelta(seconds=5)  # the wake-up's deadline
    assert parse_iso(step["CompleteBy"]) == rt.clock() + timedelta(seconds=300)  # the longest wait's
    # a copy of the reply: nothing written; a later slot (the woken call retried): its wake-up recorded
    assert handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat())) == "waiting-duplicate"
    later = until + timedelta(seconds=30)
    assert handle_reply(rt, waiting_reply(oid, 1, wake=True, until=later.isoformat())) == "waiting-duplicate"
    assert parse_iso(steps(rt, oid)[S]["WakeAt"]) == later
    assert parse_iso(state(rt, oid)["CompleteBy"]) == later + timedelta(seconds=5)
    seq = state(rt, oid)["EventSeq"]
    assert handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat())) == "waiting-duplicate"
    assert state(rt, oid)["EventSeq"] == seq and parse_iso(steps(rt, oid)[S]["WakeAt"]) == later  # older: no write
    # a breaker's wait (an opening): no wake-up owed, the order's deadline is the longest wait's
    rt, _agents, oid = shipping_in_flight()
    handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat(), opening=1))
    assert not steps(rt, oid)[S].get("WakeAt")
    assert parse_iso(state(rt, oid)["CompleteBy"]) == rt.clock() + timedelta(seconds=300)


def _never_sent(rt: Any) -> list[Any]:
    """The scheduler's wake-up, as if it died before sending it (unsent: no id for the queue's
    duplicate detection to remember either)."""
    taken = membus(rt).take("scheduler")
    for m in taken:
        rt.bus.seen.discard((m.queue, m.message_id))
    return taken


def test_the_supervisor_resends_an_overdue_wake_up_until_the_longest_wait_then_fails_the_step() -> None:
    rt, _agents, oid = shipping_in_flight()
    until = rt.clock() + timedelta(seconds=10)
    handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat()))
    [wake] = _never_sent(rt)
    ids = {wake.message_id}
    for _ in range(3):  # each overdue deadline: a wake-up of its own (a copy of a lost one would be dropped)
        rt.clock.advance(30)
        sweep(rt)
        [resent] = [m for m in membus(rt).take("scheduler") if m.body["kind"] == "resume"]
        assert (resent.body["why"], resent.body["tag"]) == ("probe", rewake_tag(rt.clock()))
        assert resent.message_id not in ids and resent.scheduled_enqueue_time is None  # now, not at the slot
        ids.add(resent.message_id)
        assert state(rt, oid)["FailureCount"] == 0 and steps(rt, oid)[S]["WaitingOn"] == "shipping"
    assert kinds(rt, oid).count("rescheduled") == 3 and kinds(rt, oid).count("stepWaiting") == 1
    rt.clock.advance(300)  # past the longest wait: it fails for good, as a breaker's wait does
    sweep(rt)
    assert steps(rt, oid)[S]["State"] == "Failed" and not membus(rt).take("scheduler")


@pytest.mark.parametrize("lost", ["wake-up", "request"])
def test_a_rate_waits_wake_up_or_its_request_lost_after_it_was_sent_is_sent_anew(lost: str) -> None:
    """Found by the chaos run: the request sent again at the slot expired on the bus while the
    emulator restarted and its host instance was killed. Sent again under the same id (the slot's),
    each copy was dropped by duplicate detection, and the refund waited out the longest wait. The
    Supervisor's wake-up now has ids of its own, and its request names no slot: the agent takes a
    new one and the step goes on, with no failure."""
    rt, agents, oid = shipping_in_flight()
    [original] = membus(rt).take("agent-shipping")  # the request the agent answers with this wait
    until = rt.clock() + timedelta(seconds=10)
    assert original.message_id == f"{oid}:{S}:1"
    handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat()))
    rt.clock.advance(10)
    if lost == "wake-up":
        assert membus(rt).take("scheduler")  # sent, then lost: its id stays seen
    else:
        assert deliver_schedules(rt)  # the wake-up: the request sent again at the slot ...
        requests = {q: [m for m in ms if ":probe-" in m.message_id] for q, ms in membus(rt).sent.items()}
        [(queue, [request])] = [(q, ms) for q, ms in requests.items() if ms]
        membus(rt).sent[queue].remove(request)  # ... expired on the bus: its id stays seen
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed" and st["FailureCount"] == 0, st
    assert steps(rt, oid)[S]["Attempt"] == 1 and kinds(rt, oid).count("rescheduled") >= 1, kinds(rt, oid)


def test_a_supervisor_crashing_while_it_resends_a_wake_up_resends_it_at_the_next_sweep() -> None:
    k = 0
    while True:
        rt, agents, oid = shipping_in_flight()
        until = rt.clock() + timedelta(seconds=10)
        handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat()))
        _never_sent(rt)
        rt.clock.advance(30)
        rt.crash_at = k
        try:
            sweep(rt)
        except Crash:
            pass
        rt.crash_at = None
        sent = [m for m in membus(rt).take("scheduler") if m.body["kind"] == "resume"]
        if not sent:
            rt.clock.advance(30)
            sweep(rt)
        st = drive(rt, oid, agents)
        assert st["ProcessState"] == "Processed" and st["FailureCount"] == 0, st
        assert steps(rt, oid)[S]["Attempt"] == 1
        if rt.crash_exhausted:
            break
        k += 1
    assert k >= 2


def test_a_compensation_whose_rate_wake_up_was_never_sent_is_woken_by_the_supervisor() -> None:
    rt, agents, oid = refund_in_flight()
    until = rt.clock() + timedelta(seconds=10)
    assert handle_reply(rt, waiting_reply(oid, 1, kind="compensation", step="charge-payment", wake=True,
                                          until=until.isoformat())) == "waiting"
    assert steps(rt, oid)["charge-payment"]["WakeAt"]
    _never_sent(rt)
    agents.hang.clear()
    rt.clock.advance(30)
    sweep(rt)
    [wake] = [m for m in membus(rt).peek("scheduler") if m.body["kind"] == "resume"]
    assert (wake.body["for"], wake.body["why"]) == ("compensation", "probe")
    drive(rt, oid, agents)
    st = state(rt, oid)
    assert (st["Mode"], st["CompensationState"]) == ("finished", "completed"), st
    assert st["CompFailureCount"] == 0 and steps(rt, oid)["charge-payment"]["CompensationAttempt"] == 1


def test_a_rate_wait_that_finds_the_breaker_open_becomes_the_breakers_wait_and_owes_no_wake_up() -> None:
    """The woken call of a rate wait found its remote's breaker opened meanwhile: the step now waits
    on the breaker (its closer or its probe wakes it). It kept the rate's WakeAt, and so the order's
    deadline that of a wake-up owed: the Supervisor sent one every index floor (a resume, a request
    and a waiting reply each: 6 bus operations, 3 executions) until the breaker closed."""
    from shared.core.times import parse_iso

    rt, _agents, oid = shipping_in_flight()
    until = rt.clock() + timedelta(seconds=10)
    handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat()))
    longest = parse_iso(steps(rt, oid)[S]["CompleteBy"])
    rt.clock.advance(10)
    membus(rt).take("scheduler")  # the wake-up, delivered: its request sent again finds the breaker open
    assert handle_reply(rt, waiting_reply(oid, 1, until=(rt.clock() + timedelta(seconds=30)).isoformat(),
                                          opening=1)) == "waiting"
    step, st = steps(rt, oid)[S], state(rt, oid)
    assert not step.get("WakeAt") and step["WaitingOn"] == "shipping" and step["WaitingOpening"] == 1
    assert parse_iso(st["CompleteBy"]) == longest == parse_iso(step["CompleteBy"])  # the longest wait's
    for _ in range(3):  # past the rate's wake-up deadline: nothing sent again, nothing failed
        rt.clock.advance(30)
        sweep(rt)
    assert not [m for m in membus(rt).take("scheduler") if m.body["kind"] == "resume"]
    assert "rescheduled" not in kinds(rt, oid) and state(rt, oid)["FailureCount"] == 0
    # a copy of the rate's reply, late: its slot is past, and the breaker's wait stays
    assert handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until.isoformat())) == "waiting-duplicate"
    assert not steps(rt, oid)[S].get("WakeAt")
    # a copy of a waiting reply from that opening: nothing more
    seq = state(rt, oid)["EventSeq"]
    assert handle_reply(rt, waiting_reply(oid, 1, opening=1)) == "waiting-duplicate"
    assert state(rt, oid)["EventSeq"] == seq
