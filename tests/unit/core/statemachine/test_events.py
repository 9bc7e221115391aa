"""Steps that wait (``shared.core.statemachine.events``): a ``wait`` for an external event, sent by
``POST /api/orders/{id}/events/{name}``, and a ``delay`` that its timer (a scheduled wake-up) or
the Supervisor ends. Each path is driven through the real handlers on the in-memory store and bus."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from shared.api.http import HttpResult
from shared.api.operator import retry_order, send_event, terminate_order
from shared.api.orders import get_order
from shared.core.workflows import Step
from shared.scheduler import handle_schedule
from shared.supervisor import sweep
from tests.unit.core.statemachine.test_operator import assert_history_whole, kinds, membus
from tests.unit.harness import (
    BODY,
    JSON_HEADERS,
    WORKFLOW,
    AgentSim,
    CrashRuntime,
    deliver_schedules,
    drive,
    make_runtime,
    post,
    state,
    steps,
)

R, C, S = "reserve-inventory", "charge-payment", "create-shipment"
APPROVAL = Step("approval", "", "", 3600, kind="wait", event="approval", decision="approved")
COOL = Step("cool", "", "", 0, kind="delay", delay=timedelta(minutes=5))
WAITING = (WORKFLOW[0], APPROVAL, WORKFLOW[1], WORKFLOW[2])
DELAYED = (WORKFLOW[0], WORKFLOW[1], COOL, WORKFLOW[2])
BIG = {**BODY, "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 1500}]}


def send(rt: CrashRuntime, oid: str, body: Any, name: str = "approval", key: str | None = None) -> HttpResult:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return send_event(rt, oid, name, raw, {**JSON_HEADERS, **({"Idempotency-Key": key} if key else {})})


def at(step: str, attempt: int = 1) -> Any:
    return lambda st: st.get("LeaseKey") == f"{step}:{attempt}"


def waiting_order(workflow: tuple[Step, ...] = WAITING, **post_kwargs: Any) -> tuple[CrashRuntime, AgentSim, str]:
    """An order whose wait step is in flight."""
    rt = make_runtime(workflow=workflow)
    agents = AgentSim(rt)
    oid = post(rt, **post_kwargs).body["orderId"]
    drive(rt, oid, agents, until=at(workflow[1].name))
    return rt, agents, oid


def ops(agents: AgentSim, oid: str) -> list[str]:
    return [op for order, _step, op in agents.calls if order == oid]


# ---------------------------------------------------------------------------------------------
# wait: the event ends it
def test_an_event_ends_its_wait_and_its_body_is_the_steps_result() -> None:
    rt, agents, oid = waiting_order()
    view = get_order(rt, oid).body
    assert view["awaiting"] == {"step": "approval", "kind": "event", "event": "approval", "decision": "approved",
                                "until": view["steps"][1]["completeBy"], "onTimeout": "compensate"}
    assert view["steps"][1]["kind"] == "wait" and view["steps"][1]["state"] == "Running"
    r = send(rt, oid, {"approved": True, "by": "ana"})
    assert (r.status, r.body["result"], r.body["event"]) == (202, "step-done", "approval")
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed"
    assert steps(rt, oid)["approval"]["Result"] == json.dumps({"approved": True, "by": "ana"}, separators=(",", ":"))
    assert ops(agents, oid) == ["reserve", "charge", "ship"]
    assert kinds(rt, oid)[3:7] == ["dispatched", "eventReceived", "stepDone", "dispatched"]
    shown = get_order(rt, oid).body["steps"][1]
    assert shown["event"]["name"] == "approval" and shown["event"]["body"] == {"approved": True, "by": "ana"}
    assert get_order(rt, oid).body["awaiting"] is None
    assert_history_whole(rt, oid)


def test_an_event_before_its_wait_starts_is_kept_and_ends_the_wait_when_it_starts() -> None:
    rt = make_runtime(workflow=WAITING)
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]  # reserve-inventory in flight, not answered yet
    r = send(rt, oid, {"approved": True})
    assert (r.status, r.body["result"]) == (202, "event-kept")
    assert steps(rt, oid)["approval"]["State"] == "Pending"
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed" and ops(agents, oid) == ["reserve", "charge", "ship"]
    history = kinds(rt, oid)
    assert history.index("eventReceived") < history.index("stepDone")
    assert send(rt, oid, {"approved": True}).body["result"] == "event-duplicate"


def test_a_copy_of_an_event_writes_nothing_and_another_event_is_refused() -> None:
    rt, _agents, oid = waiting_order()
    assert send(rt, oid, {"approved": True}, key="k-1").body["result"] == "step-done"
    seq = state(rt, oid)["EventSeq"]
    # the same key: a copy, whatever its body (the first one counted)
    assert send(rt, oid, {"approved": False}, key="k-1").body["result"] == "event-duplicate"
    refused = send(rt, oid, {"approved": False})
    assert refused.status == 409 and "received already" in refused.body["detail"]
    assert state(rt, oid)["EventSeq"] == seq


def test_a_false_decision_compensates_the_order() -> None:
    rt, agents, oid = waiting_order()
    r = send(rt, oid, {"approved": False, "reason": "over budget"})
    assert (r.status, r.body["result"]) == (202, "compensating")
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"], st["CompensationState"]) == ("Error", "failed", "completed")
    assert st["FailedStep"] == "approval" and st["Reason"] == "approval: approved is false"
    assert ops(agents, oid) == ["reserve", "release"]
    assert steps(rt, oid)["approval"]["State"] == "Failed"


@pytest.mark.parametrize("body", [{"approved": "yes"}, {}, {"approved": None}])
def test_a_decision_that_is_not_true_or_false_is_400_and_writes_nothing(body: dict[str, Any]) -> None:
    rt, _agents, oid = waiting_order()
    seq = state(rt, oid)["EventSeq"]
    r = send(rt, oid, body)
    assert r.status == 400 and "must be true or false" in r.body["detail"]
    assert state(rt, oid)["EventSeq"] == seq and steps(rt, oid)["approval"]["State"] == "Running"


# ---------------------------------------------------------------------------------------------
# wait: its timeout
def _timed_out(policy: str) -> tuple[CrashRuntime, AgentSim, str]:
    rt, agents, oid = waiting_order((WORKFLOW[0], replace(APPROVAL, on_timeout=policy), WORKFLOW[1], WORKFLOW[2]))  # type: ignore[arg-type]
    rt.clock.advance(3601)
    sweep(rt)
    return rt, agents, oid


def test_a_wait_that_times_out_with_compensate_releases_what_was_done() -> None:
    rt, agents, oid = _timed_out("compensate")
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"]) == ("Error", "failed")
    assert ops(agents, oid) == ["reserve", "release"] and "waitTimedOut" in kinds(rt, oid)
    late = send(rt, oid, {"approved": True})
    assert late.status == 409


def test_a_wait_that_times_out_with_hold_is_held_and_a_retry_waits_again_or_uses_a_kept_event() -> None:
    rt, agents, oid = _timed_out("hold")
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Mode"]) == ("Error", "held") and ops(agents, oid) == ["reserve"]
    assert send(rt, oid, {"approved": True}).body["result"] == "event-kept"
    assert retry_order(rt, oid).status == 202
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    assert steps(rt, oid)["approval"]["Attempt"] == 2


def test_a_wait_that_times_out_with_continue_goes_on() -> None:
    rt, agents, oid = _timed_out("continue")
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    assert json.loads(steps(rt, oid)["approval"]["Result"]) == {"timedOut": True}


# ---------------------------------------------------------------------------------------------
# the events route's answers
def test_the_events_route_refuses_what_it_cannot_use() -> None:
    rt, agents, oid = waiting_order()
    assert send(rt, "0" * 32, {"approved": True}).status == 404
    assert send(rt, "nope", {"approved": True}).status == 400
    assert send(rt, oid, {"approved": True}, name="Approval!").status == 400
    assert send(rt, oid, [1, 2]).status == 400
    assert send(rt, oid, b"{not json").status == 400
    assert send(rt, oid, b"x" * (16 * 1024 + 1)).status == 413
    for lone in (b'{"approved": true, "by": "\\ud800"}', b'{"\\udfff": 1}'):  # parses; is no text
        assert send(rt, oid, lone).status == send(rt, oid, lone, key="k").status == 400
    deep = send(rt, oid, b'{"a":' * 70 + b"1" + b"}" * 70)
    assert (deep.status, deep.body["title"]) == (400, "Invalid event")
    assert send(rt, oid, {"approved": True}, key="bad key").status == 400
    unknown = send(rt, oid, {"paid": True}, name="payment")
    assert unknown.status == 409 and "waits for no event 'payment'; it waits for 'approval'" in unknown.body["detail"]
    assert send(rt, oid, {"approved": True}).status == 202
    drive(rt, oid, agents)
    other = post(rt, {**BODY, "customerId": "c-2"}).body["orderId"]
    drive(rt, other, agents, until=at("approval"))
    assert terminate_order(rt, other).status == 202
    drive(rt, other, agents)
    finished = send(rt, other, {"approved": True})
    assert finished.status == 409 and "cannot send 'approval'" in finished.body["detail"]


def test_an_order_that_skips_its_wait_refuses_the_event() -> None:
    only_big = replace(APPROVAL, when=load_condition())
    rt = make_runtime(workflow=(WORKFLOW[0], only_big, WORKFLOW[1], WORKFLOW[2]))
    agents = AgentSim(rt)
    small = post(rt).body["orderId"]
    r = send(rt, small, {"approved": True})
    assert r.status == 409 and "skips step 'approval'" in r.body["detail"]
    assert drive(rt, small, agents)["ProcessState"] == "Processed"
    big = post(rt, BIG).body["orderId"]
    drive(rt, big, agents, until=at("approval"))
    assert send(rt, big, {"approved": True}).status == 202


def load_condition() -> Any:
    from shared.core.workflows.conditions import parse
    return parse({"total": {"gt": 1000}})


# ---------------------------------------------------------------------------------------------
# delay
def _scheduler_messages(rt: CrashRuntime) -> list[Any]:
    return [m for q, msgs in membus(rt).sent.items() if q.startswith("scheduler") for m in msgs]


def test_a_delay_ends_with_its_timer_and_not_before() -> None:
    rt = make_runtime(workflow=DELAYED)
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=at("cool"))
    started = datetime.fromisoformat(steps(rt, oid)["cool"]["StartedAt"].replace("Z", "+00:00"))
    [timer] = [m for m in _scheduler_messages(rt) if m.body["kind"] == "wake"]
    assert timer.scheduled_enqueue_time == started + timedelta(minutes=5)
    assert get_order(rt, oid).body["awaiting"]["kind"] == "timer"
    assert deliver_schedules(rt) == []  # not due yet
    rt.clock.advance(300)
    assert deliver_schedules(rt) == ["step-done"]
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    assert "firedAt" in json.loads(steps(rt, oid)["cool"]["Result"])
    assert "by" not in json.loads(steps(rt, oid)["cool"]["Result"])


def test_a_lost_timer_is_ended_by_the_supervisor() -> None:
    rt = make_runtime(workflow=DELAYED)
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=at("cool"))
    for q in list(membus(rt).sent):
        membus(rt).sent[q] = [m for m in membus(rt).sent[q] if m.body.get("kind") != "wake"]
    rt.clock.advance(301)
    assert sweep(rt).acted == {"step-done": 1}
    assert json.loads(steps(rt, oid)["cool"]["Result"])["by"] == "supervisor"
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"


def test_a_delay_until_a_time_of_the_order_counts_from_its_creation() -> None:
    until = replace(COOL, until="createdAt", delay=timedelta(minutes=1))
    rt = make_runtime(workflow=(WORKFLOW[0], WORKFLOW[1], until, WORKFLOW[2]))
    agents = AgentSim(rt)
    created = rt.clock()
    oid = post(rt).body["orderId"]
    rt.clock.advance(20)  # the steps before it took 20 s
    drive(rt, oid, agents, until=at("cool"))
    [timer] = [m for m in _scheduler_messages(rt) if m.body["kind"] == "wake"]
    assert timer.scheduled_enqueue_time == created + timedelta(minutes=1)


def test_a_wake_for_an_attempt_not_in_flight_changes_nothing() -> None:
    rt = make_runtime(workflow=DELAYED)
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=at("cool"))
    seq = state(rt, oid)["EventSeq"]
    for step, attempt in (("cool", 2), (R, 1), ("nope", 1)):
        body = {"kind": "wake", "orderId": oid, "step": step, "attempt": attempt}
        assert handle_schedule(rt, json.dumps(body).encode()) == "stale"
    assert state(rt, oid)["EventSeq"] == seq


def test_a_delay_of_a_suspended_order_ends_and_the_order_waits_for_its_resume() -> None:
    from shared.api.operator import resume_order, suspend_order

    rt = make_runtime(workflow=DELAYED)
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=at("cool"))
    assert suspend_order(rt, oid).status == 202
    rt.clock.advance(300)
    assert deliver_schedules(rt) == ["step-done-suspended"]
    assert resume_order(rt, oid).status == 202
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"


# ---------------------------------------------------------------------------------------------
# crash points: each new decision dies after each of its effects, then is repeated or not
def calls_stand_as_rows_say(rt: CrashRuntime, agents: AgentSim, oid: str) -> dict[str, int]:
    """Each remote effect applied at most once net (``net_effects`` fails on a double), and the
    calls whose effect stands are exactly the Done, uncompensated call steps; the balances."""
    from tests.unit.core.statemachine.test_operator import net_effects

    balance = net_effects(agents, oid)
    rows = steps(rt, oid)
    stands = {n for n, row in rows.items() if row["State"] == "Done" and row["Compensation"] != "Done"}
    assert {n for n, v in balance.items() if v} == stands & {R, C, S}, (balance, rows)
    return balance


def _wake_of(rt: CrashRuntime, oid: str) -> Any:
    [msg] = [m for m in _scheduler_messages(rt) if m.body["kind"] == "wake" and m.body["orderId"] == oid]
    for q in membus(rt).sent:
        membus(rt).sent[q] = [m for m in membus(rt).sent[q] if m is not msg]
    return msg


def c_event_ends_wait(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=at("approval"))
    return oid, lambda: send(rt, oid, {"approved": True})


def c_event_declines(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=at("approval"))
    return oid, lambda: send(rt, oid, {"approved": False})


def c_event_kept(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt).body["orderId"]
    return oid, lambda: send(rt, oid, {"approved": True})


def c_kept_event_wakes(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt).body["orderId"]
    assert send(rt, oid, {"approved": True}).body["result"] == "event-kept"
    agents.work(rt.clock())
    agents.reply_all()  # reserve done: the wait starts and sends its wake-up
    msg = _wake_of(rt, oid)
    return oid, lambda: handle_schedule(rt, json.dumps(msg.body).encode(), message_id=msg.message_id)


def c_timer_fires(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=at("cool"))
    msg = _wake_of(rt, oid)
    rt.clock.advance(300)
    return oid, lambda: handle_schedule(rt, json.dumps(msg.body).encode(), message_id=msg.message_id)


def c_supervisor_ends_delay(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=at("cool"))
    _wake_of(rt, oid)  # lost
    rt.clock.advance(301)
    return oid, lambda: sweep(rt)


def c_wait_times_out(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=at("approval"))
    rt.clock.advance(3601)
    return oid, lambda: sweep(rt)


PROCESSED = {"ProcessState": "Processed", "Outcome": "processed"}
FAILED = {"ProcessState": "Error", "Mode": "finished", "Outcome": "failed"}
CRASHES = [  # (name, workflow, setup, where it leads, where it goes if the action never committed and is not repeated)
    ("event-ends-wait", WAITING, c_event_ends_wait, PROCESSED, FAILED),
    ("event-declines", WAITING, c_event_declines, FAILED, FAILED),
    ("event-kept", WAITING, c_event_kept, PROCESSED, FAILED),
    ("kept-event-wakes", WAITING, c_kept_event_wakes, PROCESSED, PROCESSED),
    ("timer-fires", DELAYED, c_timer_fires, PROCESSED, PROCESSED),
    ("supervisor-ends-delay", DELAYED, c_supervisor_ends_delay, PROCESSED, PROCESSED),
    ("wait-times-out", WAITING, c_wait_times_out, FAILED, FAILED),
]


@pytest.mark.parametrize("repeated", [True, False], ids=["repeated", "not-repeated"])
@pytest.mark.parametrize(("name", "workflow", "setup", "expect", "before"), CRASHES, ids=[c[0] for c in CRASHES])
def test_each_new_decision_crashing_after_every_effect_converges(name: str, workflow: tuple[Step, ...], setup: Any,
                                                                 expect: dict[str, Any], before: dict[str, Any],
                                                                 repeated: bool) -> None:
    from tests.unit.core.statemachine.test_operator import assert_index_settled
    from tests.unit.core.statemachine.test_operator_crash_points import history_matches_state
    from tests.unit.harness import Crash

    k = 0
    while True:
        rt = make_runtime(workflow=workflow)
        agents = AgentSim(rt)
        oid, trigger = setup(rt, agents)
        seq = history_matches_state(rt, oid)
        rt.crash_at = k
        with pytest.raises(Crash):
            trigger()
        committed = history_matches_state(rt, oid) > seq
        goal = expect
        if repeated:
            again = trigger()
            if isinstance(again, HttpResult):  # the client sends its event again: a copy once it committed
                assert again.status == 202 and (again.body["result"] == "event-duplicate") == committed, again.body
        elif not committed and name not in ("timer-fires", "kept-event-wakes", "supervisor-ends-delay"):
            goal = before  # the event never came: the wait times out (the Supervisor is the backstop otherwise)
        st = drive(rt, oid, agents, tick=60.0, max_rounds=400)
        for key, value in goal.items():
            assert st.get(key) == value, (name, k, key, st)
        assert not st.get("LockedBy")
        calls_stand_as_rows_say(rt, agents, oid)
        assert_history_whole(rt, oid)
        assert_index_settled(rt, oid)
        if rt.crash_exhausted:
            break
        k += 1
    assert k >= 1


def test_a_copy_after_a_lost_send_sends_the_request_in_flight_again() -> None:
    """The first call's process died after its write, before the next step's request was sent: the
    client's retry (a copy) sends it, under the same message id (the queue drops it if it was sent;
    this bus has no duplicate detection, so the re-send shows)."""
    from shared.messaging import MemoryBus

    rt = make_runtime(workflow=WAITING, bus=MemoryBus())
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=at("approval"))
    queue = rt.config.agent_queue(rt.config.spec(C))
    assert send(rt, oid, {"approved": True}).body["result"] == "step-done"
    [request] = membus(rt).take(queue)  # lost
    again = send(rt, oid, {"approved": True})
    assert again.body["result"] == "event-duplicate"
    assert [m.message_id for m in membus(rt).take(queue)] == [request.message_id]
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"


@pytest.mark.parametrize("case", ["lost-timer", "wait-timeout-compensate", "wait-timeout-continue", "kept-declined"])
def test_what_the_supervisor_ends_leaves_the_next_deadline_covered_by_an_index_row(case: str) -> None:
    """The sweep deletes the index row it handles: when the Supervisor ends a wait or a delay, the
    next step or the first compensation is handed to a scheduler under a row of its own, so a
    lost notice or request is still found."""
    from shared.core.times import parse_iso
    from tests.unit.core.statemachine.test_operator import mem

    policy = "continue" if case == "wait-timeout-continue" else "compensate"
    workflow = DELAYED if case == "lost-timer" else (WORKFLOW[0], replace(APPROVAL, on_timeout=policy),  # type: ignore[arg-type]
                                                     WORKFLOW[1], WORKFLOW[2])
    rt = make_runtime(workflow=workflow)
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    if case == "kept-declined":
        assert send(rt, oid, {"approved": False}).body["result"] == "event-kept"
    drive(rt, oid, agents, until=at(workflow[1].name if case != "lost-timer" else "cool"))
    for q in list(membus(rt).sent):  # every wake-up lost
        membus(rt).sent[q] = [m for m in membus(rt).sent[q] if m.body.get("kind") != "wake"]
    rt.clock.advance(3601)
    sweep(rt)
    st = state(rt, oid)
    assert st["LeaseKey"] and st["CompleteBy"], st  # something is due next: a step or a compensation
    dues = [parse_iso(r["Due"]) for r in mem(rt).index_rows() if r["OrderId"] == oid]
    deadline = parse_iso(st["CompleteBy"])
    assert deadline is not None and any(d is not None and d <= deadline for d in dues), (st, dues)
    assert drive(rt, oid, agents)["Mode"] == "finished"
