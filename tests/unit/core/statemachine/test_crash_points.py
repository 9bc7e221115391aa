"""A crash between any two writes converges.

For every handler that writes, and for every k, the handler runs only its first k effects and
"dies" (``Crash`` is a BaseException nothing in the app catches). Then either the message is
redelivered (at-least-once delivery: the handler runs again on the same message), or it is
lost for good (only the Supervisor and the messages already sent remain). Either way the
order must settle in the expected end state, with every remote effect applied once, the
compensations in reverse order, no claim left behind and, eventually, no index row left.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from shared.api.operator import cancel_order, retry_order
from shared.core.messages import OutMessage
from shared.scheduler import handle_reply, handle_schedule
from shared.supervisor import sweep
from tests.unit.harness import (
    WORKFLOW,
    AgentSim,
    Crash,
    CrashRuntime,
    deliver_schedules,
    drive,
    make_runtime,
    post,
    state,
    steps,
)

HOLD = tuple(replace(s, on_failure="hold") if s.name == "charge-payment" else s for s in WORKFLOW)


def _schedule_trigger(rt: CrashRuntime) -> Callable[[], Any]:
    [msg] = rt.bus.take("scheduler")
    return lambda: handle_schedule(rt, json.dumps(msg.body).encode(), message_id=msg.message_id)


def _reply_trigger(rt: CrashRuntime, agents: AgentSim, step: str) -> Callable[[], Any]:
    """Let the agents answer until the reply for ``step`` is next; return its delivery."""
    for _ in range(20):
        deliver_schedules(rt)
        agents.work(rt.clock())
        for i, m in enumerate(agents.pending_replies):
            if m.body["step"] == step:
                msg: OutMessage = agents.pending_replies.pop(i)
                for other in agents.pending_replies:
                    handle_reply(rt, json.dumps(other.body).encode())
                agents.pending_replies.clear()
                return lambda: handle_reply(rt, json.dumps(msg.body).encode(), message_id=msg.message_id)
        agents.reply_all()
    raise AssertionError(f"no reply for {step}")


def _expire_and_sweep(rt: CrashRuntime) -> Callable[[], Any]:
    rt.clock.advance(31)
    return lambda: sweep(rt)


@dataclass
class Scenario:
    name: str
    setup: Callable[[CrashRuntime, AgentSim], tuple[str, Callable[[], Any]]]
    expect: dict[str, Any]
    workflow: tuple = WORKFLOW
    reject: dict[str, str] | None = None
    hang: set[str] | None = None
    heal: bool = True  # clear hang before recovery
    lost: set[str] | None = None  # effect applied, reply lost: the step times out, outcome unknown


def s_claim(rt, agents):  # type: ignore[no-untyped-def]
    """A claim on a schedule message: the redrive of a step that timed out (hung agent)."""
    oid = post(rt).body["orderId"]
    agents.work(rt.clock())  # hung: no reply
    _expire_and_sweep(rt)()
    assert state(rt, oid)["ProcessState"] == "Pending"
    return oid, _schedule_trigger(rt)


def s_reply_first(rt, agents):  # type: ignore[no-untyped-def]
    oid = post(rt).body["orderId"]
    return oid, _reply_trigger(rt, agents, "reserve-inventory")


def s_reply_last(rt, agents):  # type: ignore[no-untyped-def]
    oid = post(rt).body["orderId"]
    return oid, _reply_trigger(rt, agents, "create-shipment")


def s_error_reply(rt, agents):  # type: ignore[no-untyped-def]
    oid = post(rt).body["orderId"]
    return oid, _reply_trigger(rt, agents, "create-shipment")


def s_compensation_reply(rt, agents):  # type: ignore[no-untyped-def]
    oid = post(rt).body["orderId"]
    _reply_trigger(rt, agents, "create-shipment")()  # the error reply: compensation starts
    return oid, _reply_trigger(rt, agents, "charge-payment")


def s_redrive(rt, agents):  # type: ignore[no-untyped-def]
    oid = post(rt).body["orderId"]
    deliver_schedules(rt)
    agents.work(rt.clock())  # hung: no reply
    return oid, _expire_and_sweep(rt)


def s_threshold(rt, agents):  # type: ignore[no-untyped-def]
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("FailureCount") == 2 and st.get("LockedBy") is not None)
    agents.work(rt.clock())
    return oid, _expire_and_sweep(rt)


def s_compensation_claim(rt, agents):  # type: ignore[no-untyped-def]
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("FailureCount") == 2 and st.get("LockedBy") is not None)
    agents.work(rt.clock())
    _expire_and_sweep(rt)()  # threshold: Error, compensation scheduled
    assert state(rt, oid)["Mode"] == "compensate"
    return oid, _schedule_trigger(rt)


def s_unknown_compensation_reply(rt, agents):  # type: ignore[no-untyped-def]
    """The reply to the compensation of a step that timed out with its outcome unknown."""
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("FailureCount") == 2 and st.get("LockedBy") is not None)
    agents.work(rt.clock())
    _expire_and_sweep(rt)()  # threshold: Error, the timed-out step's compensation scheduled first
    assert state(rt, oid)["CompIndex"] == 1
    return oid, _reply_trigger(rt, agents, "charge-payment")


def s_lost_submission_send(rt, agents):  # type: ignore[no-untyped-def]
    """The submission's first request is lost: the Supervisor redrives the step."""
    rt.bus.fail.add("agent-inventory")
    oid = post(rt).body["orderId"]
    rt.bus.fail.clear()
    return oid, _expire_and_sweep(rt)


def s_retry(rt, agents):  # type: ignore[no-untyped-def]
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents)
    assert state(rt, oid)["Mode"] == "held"
    agents.reject.clear()
    return oid, lambda: retry_order(rt, oid)


def s_cancel(rt, agents):  # type: ignore[no-untyped-def]
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents)
    return oid, lambda: cancel_order(rt, oid)


PROCESSED = {"ProcessState": "Processed", "Outcome": "processed"}
COMPENSATED = {"ProcessState": "Error", "Outcome": "failed", "CompensationState": "completed"}

SCENARIOS = [
    Scenario("claim", s_claim, PROCESSED, hang={"reserve-inventory"}),
    Scenario("reply-first-step", s_reply_first, PROCESSED),
    Scenario("reply-last-step", s_reply_last, PROCESSED),
    Scenario("error-reply-compensates", s_error_reply, COMPENSATED, reject={"create-shipment": "no"}),
    Scenario("compensation-reply", s_compensation_reply, COMPENSATED, reject={"create-shipment": "no"}),
    Scenario("supervisor-redrive", s_redrive, PROCESSED, hang={"reserve-inventory"}),
    Scenario("supervisor-threshold", s_threshold, COMPENSATED, hang={"charge-payment"}, heal=False),
    Scenario("compensation-claim", s_compensation_claim, COMPENSATED, hang={"charge-payment"}, heal=False),
    # timed out with the effect applied (reply lost): the step itself is compensated first
    Scenario("threshold-unknown-outcome", s_threshold, COMPENSATED, lost={"charge-payment"}, heal=False),
    Scenario("compensation-claim-unknown-outcome", s_compensation_claim, COMPENSATED, lost={"charge-payment"},
             heal=False),
    Scenario("unknown-outcome-compensation-reply", s_unknown_compensation_reply, COMPENSATED,
             lost={"charge-payment"}, heal=False),
    Scenario("lost-submission-send", s_lost_submission_send, PROCESSED),
    Scenario("operator-retry", s_retry, PROCESSED, workflow=HOLD, reject={"charge-payment": "declined"}),
    Scenario("operator-cancel", s_cancel, {"ProcessState": "Error", "Outcome": "cancelled",
                                           "CompensationState": "completed"},
             workflow=HOLD, reject={"charge-payment": "declined"}),
    # held after timing out with the effect applied: the cancel compensates the step too
    Scenario("operator-cancel-unknown-outcome", s_cancel, {"ProcessState": "Error", "Outcome": "cancelled",
                                                           "CompensationState": "completed"},
             workflow=HOLD, lost={"charge-payment"}, heal=False),
]


HELD = {"ProcessState": "Error", "Mode": "held"}


def crash_then_recover(sc: Scenario, rt: CrashRuntime, agents: AgentSim, oid: str, trigger: Callable[[], Any],
                       k: int, redeliver: bool) -> dict[str, Any]:
    """Cut ``sc``'s trigger after ``k`` effects, heal what the scenario heals and, ``redeliver``, run
    the trigger again (at-least-once: the same message again, or the operator/timer again): what
    the order's state must converge to."""
    rt.crash_at = k
    with pytest.raises(Crash):
        trigger()
    if sc.heal:
        agents.hang.clear()
    if redeliver:
        trigger()
    elif sc.name.startswith("operator-") and state(rt, oid)["Mode"] == "held":
        return HELD  # the operator's call died before its write and was not repeated
    return sc.expect


def _check(rt: CrashRuntime, oid: str, agents: AgentSim, sc: Scenario, expect: dict[str, Any]) -> None:
    st = drive(rt, oid, agents)
    for key, value in expect.items():
        assert st.get(key) == value, (key, st)
    assert not st.get("LockedBy")
    mine = [c for c in agents.calls if c[0] == oid]
    assert len(mine) == len(set(mine)), mine  # each remote effect once (per idempotency key)
    comps = [c[2] for c in mine if c[2] in ("refund", "release")]
    if st["ProcessState"] == "Processed" or st["Mode"] == "held":
        assert comps == []
        if st["ProcessState"] == "Processed":
            assert [c[2] for c in mine] == ["reserve", "charge", "ship"]
    else:
        done_forward = [c[2] for c in mine if c[2] in ("reserve", "charge")]
        expected = [{"charge": "refund", "reserve": "release"}[op] for op in reversed(done_forward)]
        assert comps == expected, mine
        # a step that timed out (outcome unknown) is compensated all the same: by its key, an
        # effect undone (in calls) or nothing to undo (tombstoned); an error reply is not
        undo = {"charge-payment": "refund", "reserve-inventory": "release"}
        for name, row in steps(rt, oid).items():
            if row["State"] == "Failed" and name in undo:
                if row.get("OutcomeUnknown"):
                    assert row["Compensation"] == "Done", row
                    assert (oid, name, undo[name]) in mine + agents.tombstones, (mine, agents.tombstones)
                else:
                    assert not row.get("Compensation"), row
    # the index empties (lazily) once the order is settled
    rt.clock.advance(600)
    sweep(rt)
    assert [r for r in rt.store.index_rows() if r["OrderId"] == oid] == []
    assert st["FailureCount"] <= 3


@pytest.mark.parametrize("echo_fence", [True, False], ids=["token", "no-token"])
@pytest.mark.parametrize("redeliver", [True, False], ids=["redelivered", "lost"])
@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_crash_after_every_effect_converges(sc: Scenario, redeliver: bool, echo_fence: bool) -> None:
    """``echo_fence``: the agents echo each request's fencing token (replies decided on its rows,
    the redelivered reply's token then stale), or drop it (every reply decided on a read)."""
    k = 0
    while True:
        rt = make_runtime(workflow=sc.workflow)
        agents = AgentSim(rt, reject=dict(sc.reject or {}), hang=set(sc.hang or ()), lost=set(sc.lost or ()),
                          echo_fence=echo_fence)
        oid, trigger = sc.setup(rt, agents)
        before_failures = state(rt, oid)["FailureCount"]
        _check(rt, oid, agents, sc, crash_then_recover(sc, rt, agents, oid, trigger, k, redeliver))
        if sc.name in ("claim", "reply-first-step", "reply-last-step", "lost-submission-send") and sc.heal:
            # a crash costs at most one timeout
            assert state(rt, oid)["FailureCount"] - before_failures <= 1
        if rt.crash_exhausted:
            break
        k += 1
    assert k >= 2  # every scenario has at least an index write and a state write


@pytest.mark.parametrize("k", range(0, 5))
def test_submission_crash_points(k: int) -> None:
    """Submission: crash after k effects; the client retries with its Idempotency-Key, or gives up."""
    for client_retries in (True, False):
        rt = make_runtime()
        agents = AgentSim(rt)
        rt.crash_at = k
        with pytest.raises(Crash):
            post(rt, headers={"Idempotency-Key": "crash-key"})
        from shared.core.orders import order_id_for_key

        oid = order_id_for_key("crash-key")
        exists = rt.store.read_row(oid, "state") is not None
        assert exists == (k >= 2)  # the order exists iff its one transaction ran
        if client_retries:
            r = post(rt, headers={"Idempotency-Key": "crash-key"})
            assert r.status in (200, 202) and r.body["orderId"] == oid
            exists = True
        if exists:
            st = drive(rt, oid, agents)
            assert st["ProcessState"] == "Processed"
            # died between the transaction and the first request (before or after the order's
            # search index rows, which come first): a client retry re-sends the request (replay);
            # without one, the Supervisor redrives it at CompleteBy
            assert st["FailureCount"] == (1 if k in (2, 3) and not client_retries else 0)
        else:
            rt.clock.advance(600)
            sweep(rt)
            assert rt.store.index_rows() == []  # the orphan guard row is cleaned up
            assert rt.store.read_row(oid, "state") is None


# ---- a wait on an open breaker --------------------------------------------------------------------
WAIT_TRIGGERS = ["waiting-reply", "probe-resume", "closed-resume", "probe-reply", "wait-expired", "terminate"]


def _waiting(rt: CrashRuntime, agents: AgentSim, trigger: str) -> tuple[str, Callable[[], Any]]:
    """The shipping step in flight, its remote's breaker open (watched, as a gate opens it) and the
    step registered as waiting, as the agent does; then what ``trigger`` names, ready to deliver."""
    from datetime import timedelta

    from shared.api.operator import terminate_order
    from shared.core.breaker.state import BreakerRow, BreakerState
    from shared.core.breaker.waiting import WaitingStep
    from shared.runtime.resume import resume_waiting
    from shared.storage.waiting import register_waiting
    from tests.unit.core.statemachine.test_waiting import open_shipping, resume, waiting_reply

    s = "create-shipment"
    agents.hang.add(s)
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("LeaseKey") == f"{s}:1")
    agents.hang.clear()
    open_shipping(rt, BreakerRow("shipping", BreakerState.OPEN, retry_at=rt.clock() + timedelta(seconds=5), opens=1))
    register_waiting(rt.store, "shipping", WaitingStep(oid, 1, s), rt.clock())
    until = (rt.clock() + timedelta(seconds=5)).isoformat()
    if trigger == "waiting-reply":
        return oid, lambda: handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until))
    handle_reply(rt, waiting_reply(oid, 1, until=until))
    rt.bus.take("scheduler")  # type: ignore[attr-defined]
    if trigger == "probe-resume":
        return oid, lambda: resume(rt, oid, 1, why="probe", tag="probe-1")
    if trigger == "closed-resume":
        _close(rt)
        resume_waiting(rt.store, rt.bus, "scheduler", "shipping", 1)  # the closer: resumes sent, rows forgotten
        return oid, _schedule_trigger(rt)
    if trigger == "probe-reply":
        resume(rt, oid, 1, why="probe", tag="probe-1")
        return oid, _reply_trigger(rt, agents, s)
    if trigger == "wait-expired":
        rt.clock.advance(301)  # type: ignore[attr-defined]
        return oid, lambda: sweep(rt)
    return oid, lambda: terminate_order(rt, oid)


def _close(rt: CrashRuntime) -> None:
    from shared.core.breaker.state import BreakerRow, BreakerState
    from shared.storage.breakers import read_breaker, write_breaker

    row = read_breaker(rt.store, "shipping")
    if row.state is not BreakerState.CLOSED:
        write_breaker(rt.store, replace(BreakerRow("shipping", BreakerState.CLOSED, opens=1), etag=row.etag))


@pytest.mark.parametrize("trigger", WAIT_TRIGGERS)
def test_a_crash_around_a_wait_converges_with_one_wait_and_no_attempt_spent(trigger: str) -> None:
    """Crash after every effect of each move of a wait, then the message again (Service Bus
    redelivers it; the Supervisor's timer runs again). The breaker then closes and its closer
    resumes what still waits. The order settles as without the crash: its step still on attempt
    1, FailureCount 0, one ``stepWaiting`` and at most one ``resumed`` in its history, and never
    more than one waiting row for it."""
    from shared.core.breaker.waiting import WaitingStep
    from shared.runtime.resume import resume_waiting
    from shared.storage.waiting import waiting_steps
    from tests.unit.core.statemachine.test_operator import kinds

    k = 0
    while True:
        rt = make_runtime()
        agents = AgentSim(rt)
        oid, deliver = _waiting(rt, agents, trigger)
        rt.crash_at = k
        with pytest.raises(Crash):
            deliver()
        assert len(waiting_steps(rt.store, "shipping")) <= 1
        if trigger != "terminate" or state(rt, oid)["Mode"] == "forward":
            deliver()  # the same message again (a terminate that died before its write is asked again)
        assert len(waiting_steps(rt.store, "shipping")) <= 1
        _close(rt)
        resume_waiting(rt.store, rt.bus, "scheduler", "shipping", 1)
        st = drive(rt, oid, agents)
        history = kinds(rt, oid)
        if trigger in ("wait-expired", "terminate"):
            assert (st["Mode"], st["Outcome"]) == ("held", "held"), st  # the pivot, its outcome unknown
            assert "resumed" not in history
        else:
            assert (st["ProcessState"], st["Outcome"]) == ("Processed", "processed"), st
            assert history.count("resumed") == 1, history
        assert history.count("stepWaiting") == 1, history
        assert steps(rt, oid)["create-shipment"]["Attempt"] == 1 and st["FailureCount"] == 0
        assert WaitingStep(oid, 1, "create-shipment") not in waiting_steps(rt.store, "shipping")
        if rt.crash_exhausted:
            break
        k += 1
    assert k >= 1


# ---- suspend and resume -------------------------------------------------------------------------
SUSPEND_TRIGGERS = ["suspend-in-flight", "suspend-pending", "reply-while-suspended", "redrive-while-suspended",
                    "resume-idle", "resume-in-flight"]


def _suspension(rt: CrashRuntime, agents: AgentSim, trigger: str) -> tuple[str, Callable[[], Any]]:
    """An order and the move of its suspension that ``trigger`` names, ready to run."""
    from shared.api.operator import resume_order, suspend_order

    c, s = "charge-payment", "create-shipment"
    if trigger == "suspend-pending":  # redriven, waiting for a claim
        agents.hang.add("reserve-inventory")
        oid = post(rt).body["orderId"]
        agents.work(rt.clock())
        _expire_and_sweep(rt)()
        agents.hang.clear()
        return oid, lambda: suspend_order(rt, oid)
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("LeaseKey") == f"{c}:1")
    if trigger == "suspend-in-flight":
        return oid, lambda: suspend_order(rt, oid)
    if trigger == "redrive-while-suspended":
        agents.hang.add(c)
        agents.work(rt.clock())  # the request is lost at the hung agent
        assert suspend_order(rt, oid).status == 202
        agents.hang.clear()
        return oid, _expire_and_sweep(rt)
    assert suspend_order(rt, oid).status == 202
    if trigger == "resume-in-flight":
        return oid, lambda: resume_order(rt, oid)
    reply = _reply_trigger(rt, agents, c)
    if trigger == "reply-while-suspended":
        return oid, reply
    reply()
    assert state(rt, oid)["StepName"] == s and not state(rt, oid).get("LeaseKey")
    return oid, lambda: resume_order(rt, oid)


@pytest.mark.parametrize("trigger", SUSPEND_TRIGGERS)
def test_a_crash_around_a_suspension_converges(trigger: str) -> None:
    """Crash after every effect of each move of a suspension, then the same call, message or sweep
    again. The order is resumed if it is still suspended and settles Processed, every remote
    effect once, and nothing is dispatched while it is suspended."""
    from shared.api.operator import resume_order
    from tests.unit.core.statemachine.test_operator import kinds

    k = 0
    while True:
        rt = make_runtime()
        agents = AgentSim(rt)
        oid, deliver = _suspension(rt, agents, trigger)
        rt.crash_at = k
        with pytest.raises(Crash):
            deliver()
        again = trigger.startswith("suspend") and not state(rt, oid).get("Suspended")
        again |= trigger.startswith("resume") and bool(state(rt, oid).get("Suspended"))
        again |= trigger in ("reply-while-suspended", "redrive-while-suspended")
        if again:
            deliver()
        if trigger.startswith("suspend") or trigger.endswith("while-suspended"):
            # suspended: whatever was in flight ends, and nothing new is dispatched
            st = drive(rt, oid, agents, until=lambda st: not st.get("LeaseKey"))
            assert st["Suspended"] and st["ProcessState"] == "Pending", st
            history = kinds(rt, oid)
            assert "dispatched" not in history[history.index("suspended"):], history
            assert resume_order(rt, oid).status == 202
        st = drive(rt, oid, agents)
        assert (st["ProcessState"], st["Outcome"]) == ("Processed", "processed"), st
        mine = [c for c in agents.calls if c[0] == oid]
        assert [c[2] for c in mine] == ["reserve", "charge", "ship"], mine
        rt.clock.advance(600)  # type: ignore[attr-defined]
        sweep(rt)
        assert [r for r in rt.store.index_rows() if r["OrderId"] == oid] == []
        if rt.crash_exhausted:
            break
        k += 1
    assert k >= 1


# ---- a wait for a rate limit's slot ---------------------------------------------------------------
def _rate_waiting(rt: CrashRuntime, agents: AgentSim) -> tuple[str, str, Callable[[], Any]]:
    """The shipping step in flight and its agent's ``waiting`` reply for a rate limit's slot 40 s
    away (``wake``, no breaker opening: docs/contracts.md), ready to deliver; and its wake-up time."""
    from datetime import timedelta

    from tests.unit.core.statemachine.test_waiting import waiting_reply

    s = "create-shipment"
    agents.hang.add(s)
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("LeaseKey") == f"{s}:1")
    agents.hang.clear()
    until = (rt.clock() + timedelta(seconds=40)).isoformat()
    return oid, until, lambda: handle_reply(rt, waiting_reply(oid, 1, wake=True, until=until))


@pytest.mark.parametrize("redeliver", [True, False], ids=["redelivered", "lost"])
def test_a_crash_around_a_rate_wait_still_wakes_the_step_without_a_failure(redeliver: bool) -> None:
    """The scheduler dies after each effect of recording a rate limit's wait, among them right
    after the wait's commit and before its wake-up is sent; its reply comes again, or never (then
    nothing but the Supervisor knows the step waits: no breaker is open, none watches it). The
    step is woken within a sweep of its deadline (the wake-up + WAKE_GRACE) and the order settles
    Processed: attempt 1, FailureCount 0, one ``stepWaiting``, the shipment made once. A copy of
    the wake-up (the scheduler's and the Supervisor's, or one past the queue's duplicate window)
    does no harm."""
    from datetime import timedelta

    from shared.core.breaker.waiting import WaitingStep, probe_tag, resume_message
    from shared.core.times import parse_iso
    from tests.unit.core.statemachine.test_operator import kinds

    k, crashed_before_send = 0, False
    while True:
        rt = make_runtime()
        agents = AgentSim(rt)
        oid, until, deliver = _rate_waiting(rt, agents)
        rt.crash_at = k
        with pytest.raises(Crash):
            deliver()
        recorded = steps(rt, oid)["create-shipment"].get("WaitingOn") == "shipping"
        woken = [m for m in rt.bus.sent.get("scheduler", []) if m.body.get("kind") == "resume"]  # type: ignore[attr-defined]
        if recorded and not woken:
            crashed_before_send = True  # the gap: the wait recorded, its wake-up never sent
            assert state(rt, oid)["FailureCount"] == 0
        if redeliver:
            deliver()
        waits = recorded or redeliver
        if not waits:  # died before the wait's commit, the reply lost for good: as any lost reply
            st = drive(rt, oid, agents)  # the attempt times out and is redriven
            assert st["ProcessState"] == "Processed" and st["FailureCount"] <= 1, st
            k += 1
            continue
        assert parse_iso(state(rt, oid)["CompleteBy"]) <= parse_iso(until) + timedelta(seconds=5)  # not 300 s
        rt.clock.advance(60)  # type: ignore[attr-defined]  # past the wake-up and its grace: one sweep
        sweep(rt)
        wakes = [m for m in rt.bus.take("scheduler") if m.body.get("kind") == "resume"]  # type: ignore[attr-defined]
        # the Supervisor's (its own id), and the scheduler's if it was sent before the crash
        assert [m.body["tag"][:7] for m in wakes][-1:] == ["rewake-"] and len(wakes) <= 2, wakes
        for _ in range(2):  # it comes twice (past duplicate detection): the step probes, same request id
            assert handle_schedule(rt, json.dumps(wakes[0].body).encode(), message_id=wakes[0].message_id) == "probing"
        for wake in wakes[1:]:  # and the other: the step probes too (the agent answers the two as one)
            assert handle_schedule(rt, json.dumps(wake.body).encode(), message_id=wake.message_id) == "probing"
        st = drive(rt, oid, agents)
        assert (st["ProcessState"], st["Outcome"]) == ("Processed", "processed"), st
        assert steps(rt, oid)["create-shipment"]["Attempt"] == 1 and st["FailureCount"] == 0, st
        history = kinds(rt, oid)
        assert history.count("stepWaiting") == 1, history
        assert not steps(rt, oid)["create-shipment"].get("WakeAt")
        # a copy of the wake-up, past duplicate detection: the wait is over, nothing happens
        copy = resume_message(WaitingStep(oid, 1, "create-shipment"), "scheduler", remote="shipping", why="probe",
                              tag=probe_tag(parse_iso(until)))
        assert handle_schedule(rt, json.dumps(copy.body).encode(), message_id=copy.message_id) == "stale"
        drive(rt, oid, agents)
        mine = [c for c in agents.calls if c[0] == oid]
        assert [c[2] for c in mine] == ["reserve", "charge", "ship"], mine
        if rt.crash_exhausted:
            break
        k += 1
    assert crashed_before_send and k >= 2
