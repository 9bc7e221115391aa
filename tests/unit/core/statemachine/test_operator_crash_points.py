"""Crash points and races of the operator's decisions (issue 11): retry (restart, compensation
redrive, held), cancel of a failed order, terminate, and the retention purge.

Crash points, as in ``test_crash_points``: the action runs only its first k effects and "dies";
then the operator calls again (redelivered), or never does (lost), and the Supervisor and the
agents run until the order settles. It must settle where the action leads (or, when the call
died before its write and was not repeated, where the order was going anyway), with every
remote effect applied once net, no claim left, no deadline row left, a whole history, and a
search index that ends up saying what the state says.

Races: terminate against a reply (both orders, and each losing its ETag race to the other),
retry against a supervisor sweep, purge against retry/cancel. ``HookStore`` runs the rival
between a reader's read and its write.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from shared.api.http import HttpResult
from shared.api.operator import cancel_order, retry_order, terminate_order
from shared.api.orders import get_history, get_order
from shared.api.search import search_orders
from shared.core.messages import OutMessage
from shared.core.statemachine import View, decide_expired
from shared.scheduler import handle_reply, handle_schedule
from shared.storage.memory import MemoryStore
from shared.supervisor import sweep
from shared.supervisor.retention import purge
from tests.unit.core.statemachine.test_operator import (
    HookStore,
    assert_history_whole,
    assert_index_settled,
    clock_of,
    events,
    kinds,
    listed_in,
    mem,
    membus,
    net_effects,
    search_rows,
)
from tests.unit.harness import (
    AgentSim,
    Clock,
    Crash,
    CrashRuntime,
    deliver_schedules,
    drive,
    make_runtime,
    post,
    redriven,
    state,
    steps,
)

Setup = Callable[[CrashRuntime, AgentSim], tuple[str, Callable[[], Any]]]


def _until_running(step: str) -> Callable[[dict[str, Any]], bool]:
    return lambda st: st.get("LeaseKey") == f"{step}:1"


# ---------------------------------------------------------------------------------------------
# scenarios: each builds an order and returns the action to crash in
def s_restart(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    oid = post(rt).body["orderId"]
    agents.reject["create-shipment"] = "no stock"
    drive(rt, oid, agents)
    agents.reject.clear()
    return oid, lambda: retry_order(rt, oid)


def s_compensation_redrive(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    oid = post(rt).body["orderId"]
    agents.reject.update({"create-shipment": "no stock", "charge-payment:compensate": "refund refused"})
    drive(rt, oid, agents)
    del agents.reject["charge-payment:compensate"]
    return oid, lambda: retry_order(rt, oid)


def s_cancel_failed(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    oid = post(rt).body["orderId"]
    agents.reject["create-shipment"] = "no stock"
    drive(rt, oid, agents)
    return oid, lambda: cancel_order(rt, oid)


def s_terminate_in_flight(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=_until_running("charge-payment"))
    return oid, lambda: terminate_order(rt, oid)


def s_terminate_pending(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    oid = redriven(rt)
    return oid, lambda: terminate_order(rt, oid)


def s_terminate_pivot(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=_until_running("create-shipment"))
    return oid, lambda: terminate_order(rt, oid)


def s_terminate_restarted(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    oid, restart = s_restart(rt, agents)
    assert restart().status == 202
    return oid, lambda: terminate_order(rt, oid)


def s_cancel_restarted(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    oid, restart = s_restart(rt, agents)
    assert restart().status == 202
    return oid, lambda: cancel_order(rt, oid)


def s_cancel_held(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=_until_running("create-shipment"))
    agents.hang.add("create-shipment")
    assert terminate_order(rt, oid).body["result"] == "held"
    return oid, lambda: cancel_order(rt, oid)


def s_retry_terminated_pivot(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    oid, terminate = s_terminate_pivot(rt, agents)
    assert terminate().body["result"] == "held"
    return oid, lambda: retry_order(rt, oid)


def _delivery(rt: CrashRuntime, msg: OutMessage) -> Callable[[], str]:
    return lambda: handle_reply(rt, json.dumps(msg.body).encode(), message_id=msg.message_id)


def s_compensation_reply_after_terminate(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Callable[[], Any]]:
    """The first compensation's reply after a terminate (the refund of the fenced charge)."""
    oid, terminate = s_terminate_in_flight(rt, agents)
    assert terminate().status == 202
    for _ in range(10):
        deliver_schedules(rt)
        agents.work(rt.clock())
        found = [m for m in agents.pending_replies if m.body["kind"] == "compensation"]
        if found:
            reply = found[0]
            agents.pending_replies.remove(reply)
            agents.reply_all()
            return oid, _delivery(rt, reply)
        agents.reply_all()
    raise AssertionError("no compensation reply")


@dataclass
class Scenario:
    name: str
    setup: Setup
    expect: dict[str, Any]  # where the action leads
    before: dict[str, Any]  # where the order goes if the action never committed (and was not repeated)


PROCESSED = {"ProcessState": "Processed", "Outcome": "processed"}
ALL_DONE = {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}
FAILED = {"ProcessState": "Error", "Mode": "finished", "Outcome": "failed", "CompensationState": "completed"}
UNDONE = {"reserve-inventory": 0, "charge-payment": 0}
TERMINATED = {"ProcessState": "Error", "Mode": "finished", "Outcome": "terminated", "CompensationState": "completed"}
HELD = {"ProcessState": "Error", "Mode": "held", "Outcome": "held"}

SCENARIOS = [
    Scenario("restart", s_restart, {**PROCESSED, "Generation": 1}, {**FAILED, "Generation": 0}),
    Scenario("compensation-redrive", s_compensation_redrive, FAILED, {**FAILED, "CompensationState": "failed"}),
    Scenario("cancel-failed", s_cancel_failed, {**FAILED, "Outcome": "cancelled"}, FAILED),
    Scenario("terminate-in-flight", s_terminate_in_flight, TERMINATED, PROCESSED),
    Scenario("terminate-pending", s_terminate_pending, TERMINATED, PROCESSED),
    Scenario("terminate-pivot", s_terminate_pivot, HELD, PROCESSED),
    Scenario("terminate-restarted", s_terminate_restarted, {**TERMINATED, "CompensationState": "none"},
             {**PROCESSED, "Generation": 1}),
    Scenario("cancel-restarted", s_cancel_restarted, {**FAILED, "Outcome": "cancelled", "CompensationState": "none"},
             {**PROCESSED, "Generation": 1}),
    Scenario("retry-terminated-pivot", s_retry_terminated_pivot, PROCESSED, HELD),
    Scenario("cancel-terminated-pivot", s_cancel_held, {**FAILED, "Outcome": "cancelled"}, HELD),
    Scenario("compensation-reply-after-terminate", s_compensation_reply_after_terminate, TERMINATED, TERMINATED),
]


def history_matches_state(rt: CrashRuntime, oid: str) -> int:
    """The history rows are exactly history-1..EventSeq (read straight from the store)."""
    seq = int(state(rt, oid).get("EventSeq", 0))
    stored = [r.seq for r in rt.store.read_history(oid, 0, 10_000)]
    assert stored == list(range(1, seq + 1)), (stored, seq)
    return seq


def assert_effects_agree_with_rows(rt: CrashRuntime, agents: AgentSim, oid: str) -> None:
    """Each remote effect once net (``net_effects`` fails on a double), and standing exactly
    where the order's rows say: a Done step not compensated stands, anything else does not
    (a step whose outcome is unknown and that cannot be compensated, the pivot, may be either)."""
    balance = net_effects(agents, oid)
    for name, row in steps(rt, oid).items():
        if row["State"] == "Failed" and row.get("OutcomeUnknown") and row["Compensation"] == "":
            continue
        stands = row["State"] == "Done" and row["Compensation"] != "Done"
        assert balance.get(name, 0) == int(stands), (name, row, agents.calls)


def converge(rt: CrashRuntime, oid: str, agents: AgentSim, sc: Scenario, expect: dict[str, Any]) -> None:
    st = drive(rt, oid, agents)
    for key, value in expect.items():
        assert st.get(key) == value, (key, st)
    assert not st.get("LockedBy")
    assert_effects_agree_with_rows(rt, agents, oid)
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


@pytest.mark.parametrize("redeliver", [True, False], ids=["called-again", "not-called-again"])
@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_an_operator_action_crashing_after_every_effect_converges(sc: Scenario, redeliver: bool) -> None:
    k = 0
    while True:
        rt = make_runtime()
        agents = AgentSim(rt)
        oid, trigger = sc.setup(rt, agents)
        seq_before = history_matches_state(rt, oid)
        rt.crash_at = k
        with pytest.raises(Crash):
            trigger()
        # the action's events exist if and only if its state change committed
        committed = history_matches_state(rt, oid) > seq_before
        expect = sc.expect
        if redeliver:
            again = trigger()
            if isinstance(again, HttpResult):
                # done already: 409 (the order moved on); else it applies now
                assert again.status == (409 if committed else 202), (k, again.body)
        elif not committed:
            expect = sc.before
        converge(rt, oid, agents, sc, expect)
        if rt.crash_exhausted:
            break
        k += 1
    assert k >= 2


# ---------------------------------------------------------------------------------------------
# races: terminate against a reply
def _reply_of(agents: AgentSim, rt: CrashRuntime, step: str) -> OutMessage:
    """Let the agent of ``step`` work: its effect is applied, its reply held back."""
    agents.work(rt.clock())
    [msg] = [m for m in agents.pending_replies if m.body["step"] == step]
    agents.pending_replies.remove(msg)
    return msg


def _deliver(rt: CrashRuntime, msg: OutMessage) -> str:
    return handle_reply(rt, json.dumps(msg.body).encode(), message_id=msg.message_id)


def test_reply_first_then_terminate_compensates_the_step_it_completed() -> None:
    rt = make_runtime()
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    reply = _reply_of(agents, rt, "reserve-inventory")
    assert _deliver(rt, reply) == "step-done"  # charge-payment now in flight
    assert terminate_order(rt, oid).body["result"] == "terminating"
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"], st["FailedStep"]) == ("terminated", "completed", "charge-payment")
    assert net_effects(agents, oid) == UNDONE  # charged then refunded, reserved then released
    assert_index_settled(rt, oid)


def test_terminate_first_then_the_late_success_reply_changes_nothing_and_the_key_undoes_it() -> None:
    rt = make_runtime()
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    reply = _reply_of(agents, rt, "reserve-inventory")  # reserved; the reply is late
    assert terminate_order(rt, oid).body["result"] == "terminating"
    fenced = {k: v for k, v in mem(rt).snapshot().items() if k[0] == "state"}
    assert _deliver(rt, reply) in ("stale", "duplicate")
    assert {k: v for k, v in mem(rt).snapshot().items() if k[0] == "state"} == fenced
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("terminated", "completed")
    # the release named the reservation by its key: undone, though the order never saw the reply
    assert [c[2] for c in agents.calls] == ["reserve", "release"]
    assert steps(rt, oid)["reserve-inventory"]["State"] == "Failed"
    assert "stepDone" not in kinds(rt, oid)
    assert_index_settled(rt, oid)


def test_a_late_reply_to_a_terminated_attempt_is_reported_stale() -> None:
    rt = make_runtime()
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    reply = _reply_of(agents, rt, "reserve-inventory")
    assert terminate_order(rt, oid).status == 202
    assert _deliver(rt, reply) == "stale"


def test_terminate_loses_its_race_to_a_reply_and_decides_again_on_fresh_rows() -> None:
    """The reply commits between terminate's read and its write: terminate's transaction loses
    (ETag), it reads again and terminates the order as it now is (charge-payment in flight)."""
    store = HookStore()
    rt = make_runtime(store=store)
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    reply = _reply_of(agents, rt, "reserve-inventory")
    store.after("read_partition", oid, lambda: _deliver(rt, reply))
    r = terminate_order(rt, oid)
    assert store.fired == ["step-done"]
    assert r.status == 202 and r.body["result"] == "terminating"
    assert state(rt, oid)["FailedStep"] == "charge-payment"
    assert kinds(rt, oid) == ["accepted", "dispatched", "stepDone", "dispatched", "terminated"]
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("terminated", "completed")
    assert net_effects(agents, oid) == UNDONE
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


@pytest.mark.parametrize("echo_fence", [False, True], ids=["read", "token"])
def test_a_reply_loses_its_race_to_terminate_and_changes_nothing(echo_fence: bool) -> None:
    """Terminate commits between the reply handler's read (or, with a fencing token, the token's
    issue) and its write: the reply's transaction loses (ETag), it reads again and finds its
    attempt fenced."""
    store = HookStore()
    rt = make_runtime(store=store)
    agents = AgentSim(rt, echo_fence=echo_fence)
    oid = post(rt).body["orderId"]
    reply = _reply_of(agents, rt, "reserve-inventory")
    assert ("fence" in reply.body) is echo_fence
    store.after("transact" if echo_fence else "read_partition", oid, lambda: terminate_order(rt, oid))
    verdict = _deliver(rt, reply)
    [r] = store.fired
    assert r.status == 202 and r.body["result"] == "terminating"
    assert verdict in ("stale", "duplicate")
    assert steps(rt, oid)["reserve-inventory"]["State"] == "Failed"
    assert "stepDone" not in kinds(rt, oid)
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("terminated", "completed")
    assert [c[2] for c in agents.calls] == ["reserve", "release"]
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


def test_terminate_racing_an_error_reply_one_wins() -> None:
    """An error reply (the charge declined) and terminate, on the same rows: the reply wins, the
    order is failing (compensating), and terminate, reading again, is refused."""
    store = HookStore()
    rt = make_runtime(store=store)
    agents = AgentSim(rt, reject={"charge-payment": "declined"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=_until_running("charge-payment"))
    reply = _reply_of(agents, rt, "charge-payment")
    store.after("read_partition", oid, lambda: _deliver(rt, reply))
    r = terminate_order(rt, oid)
    assert store.fired == ["compensating"]
    assert r.status == 409 and "compensating" in r.body["detail"]
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("failed", "completed")
    assert net_effects(agents, oid) == {"reserve-inventory": 0}
    assert_index_settled(rt, oid)


def test_two_terminates_at_once_record_one() -> None:
    store = HookStore()
    rt = make_runtime(store=store)
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    store.after("read_partition", oid, lambda: terminate_order(rt, oid))
    second = terminate_order(rt, oid)
    [first] = store.fired
    assert first.status == 202 and second.status == 409  # the loser reads again: already terminating
    assert kinds(rt, oid).count("terminated") == 1
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("terminated", "completed")
    assert net_effects(agents, oid) == {"reserve-inventory": 0}


def test_terminate_wins_its_race_against_a_sweep_that_redrives_the_step() -> None:
    """The step timed out: the Supervisor reads the order to redrive it, terminate commits
    right then; the sweep's write loses (ETag): no failure counted, no redrive recorded."""
    store = HookStore()
    rt = make_runtime(store=store)
    agents = AgentSim(rt, hang={"reserve-inventory"})
    oid = post(rt).body["orderId"]
    agents.work(rt.clock())  # hung: no reply
    clock_of(rt).advance(31)
    store.after("read_partition", oid, lambda: terminate_order(rt, oid))
    report = sweep(rt)
    [r] = store.fired
    assert r.status == 202 and r.body["result"] == "terminating"
    assert report.lost_races == 1 and report.acted == {}
    assert state(rt, oid)["FailureCount"] == 0 and "redriven" not in kinds(rt, oid)
    agents.hang.clear()
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("terminated", "completed")
    assert agents.calls == [] and agents.tombstones == [(oid, "reserve-inventory", "release")]
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


# ---------------------------------------------------------------------------------------------
# races: retry against a supervisor sweep
def _held(store: MemoryStore | None = None) -> tuple[CrashRuntime, AgentSim, str]:
    from tests.unit.core.statemachine.test_operator import HOLD

    rt = make_runtime(store=store, workflow=HOLD)
    agents = AgentSim(rt, reject={"charge-payment": "declined"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents)
    agents.reject.clear()
    return rt, agents, oid


def test_two_retries_at_once_one_wins() -> None:
    store = HookStore()
    rt, agents, oid = _held(store)
    store.after("read_partition", oid, lambda: retry_order(rt, oid))
    second = retry_order(rt, oid)
    [first] = store.fired
    assert first.status == 202 and second.status == 409  # read again: Pending, nothing to retry
    assert kinds(rt, oid).count("retried") == 1
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    assert net_effects(agents, oid) == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}
    assert_index_settled(rt, oid)


def test_a_second_supervisor_that_holds_the_order_loses_to_the_first_and_the_retry_counts_once() -> None:
    """Two supervisors decide the same threshold (held); the first commits, the operator
    retries, then the second's write (decided on the old rows) loses its ETag race."""
    from tests.unit.core.statemachine.test_operator import HOLD

    rt = make_runtime(workflow=HOLD)
    agents = AgentSim(rt, hang={"charge-payment"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("FailureCount") == 2 and st.get("LockedBy") is not None)
    clock_of(rt).advance(31)
    view = View.from_entities(rt.store.read_partition(oid))
    late_decision = decide_expired(view, rt.ctx())  # the second supervisor, on the same rows
    assert late_decision.verdict == "held"
    report = sweep(rt)
    assert report.acted == {"held": 1}
    agents.hang.clear()
    assert retry_order(rt, oid).body["result"] == "retried"
    assert rt.run(late_decision.effects).lost_race
    st = state(rt, oid)
    assert (st["Mode"], st["FailureCount"], st["LeaseKey"]) == ("forward", 0, "unclaimed")
    assert kinds(rt, oid).count("held") == 1 and kinds(rt, oid).count("alert") == 1
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed"
    assert net_effects(agents, oid) == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


def _leftover_row(rt: CrashRuntime, oid: str) -> None:
    """The held order's deadline row survived (its last transition's delete was lost)."""
    st = state(rt, oid)
    from shared.core.effects import PutIndex

    rt.run([PutIndex(oid, rt.clock() - timedelta(seconds=1), note="left over")])
    assert st["Mode"] == "held"


def test_retry_between_the_sweeps_read_and_its_delete_of_a_leftover_row() -> None:
    """The sweep reads a held order (no deadline: delete its row); the operator retries right
    then (a new deadline, a new row). The sweep re-indexes from the state it reads next and
    deletes only the row it read: the retry's row survives and the order runs."""
    store = HookStore()
    rt, agents, oid = _held(store)
    _leftover_row(rt, oid)
    store.after("read_row", oid, lambda: retry_order(rt, oid))
    report = sweep(rt)
    [r] = store.fired
    assert r.status == 202 and r.body["result"] == "retried"
    assert report.deleted == 1 and report.lost_races == 0
    st = state(rt, oid)
    assert [x["OrderId"] for x in mem(rt).index_rows()] == [oid]  # the retry's row
    assert st["IndexDue"] == mem(rt).index_rows()[0]["Due"]
    assert listed_in(rt, oid) == {"inFlight"}
    membus(rt).take("scheduler")  # the retry's schedule notice is lost too: the row brings it back
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed"
    assert "rescheduled" in kinds(rt, oid)
    assert_index_settled(rt, oid)


def test_retry_while_the_sweep_reindexes_a_held_order_ends_consistent() -> None:
    """The sweep's re-index of a held order reads it held, the retry commits and re-indexes
    it in flight, then the sweep's (stale) index write lands: search repairs it, and the
    order's later transitions leave its index right."""
    store = HookStore()
    rt, agents, oid = _held(store)
    _leftover_row(rt, oid)
    store.after("read_partition", oid, lambda: retry_order(rt, oid))
    sweep(rt)
    [r] = store.fired
    assert r.status == 202
    assert state(rt, oid)["Mode"] == "forward"
    # the sweep's stale write left it listed as attention only; a round of searches repairs it
    listed_in(rt, oid)
    assert listed_in(rt, oid) == {"inFlight"}
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed"
    assert_index_settled(rt, oid)


def test_the_sweep_loses_its_race_to_a_claim_of_a_retried_order_and_counts_nothing() -> None:
    """A retried order whose schedule notice came late: the sweep, past the grace period, sends
    it again; the scheduler's claim commits between the sweep's read and its write. The sweep
    loses (ETag): nothing counted, one claim, one request."""
    store = HookStore()
    rt, agents, oid = _held(store)
    assert retry_order(rt, oid).status == 202
    [notice] = membus(rt).take("scheduler")
    clock_of(rt).advance(rt.config.grace_seconds + 1)
    store.after("read_partition", oid,
                lambda: handle_schedule(rt, json.dumps(notice.body).encode(), message_id=notice.message_id))
    report = sweep(rt)
    assert store.fired == ["claimed"]
    assert report.lost_races == 1 and report.acted == {}
    st = state(rt, oid)
    assert (st["FailureCount"], st["LeaseKey"]) == (0, "charge-payment:2")
    assert "rescheduled" not in kinds(rt, oid)
    assert len(membus(rt).peek("agent-payment")) == 1
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    assert net_effects(agents, oid) == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}
    assert_index_settled(rt, oid)


def test_a_restart_racing_a_sweep_that_redrives_its_compensation_one_wins() -> None:
    """A compensation redriven by the operator is claimed; it times out; the Supervisor and a
    second operator retry (refused: compensating) race. Nothing counted twice."""
    rt = make_runtime()
    agents = AgentSim(rt, reject={"create-shipment": "no stock"}, hang={"charge-payment:compensate"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents)
    assert state(rt, oid)["CompensationState"] == "failed"
    assert retry_order(rt, oid).body["result"] == "compensation-redriven"
    deliver_schedules(rt)  # claimed: the refund in flight (the agent still hangs)
    agents.work(rt.clock())
    clock_of(rt).advance(31)
    view = View.from_entities(rt.store.read_partition(oid))
    rival = decide_expired(view, rt.ctx())
    assert sweep(rt).acted == {"compensation-redriven": 1}
    assert rt.run(rival.effects).lost_race
    assert retry_order(rt, oid).status == 409
    assert state(rt, oid)["CompFailureCount"] == 1
    agents.hang.clear()
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("failed", "completed")
    assert net_effects(agents, oid) == UNDONE
    assert_index_settled(rt, oid)


# ---------------------------------------------------------------------------------------------
# retention: purge against retry/cancel, and the purge's own crash points
DAY = 86_400.0


class CrashStore(HookStore):
    """``writes_left = k``: the next k writes succeed, the one after 'kills the process'."""

    writes_left: int | None = None

    def _spend(self) -> None:
        if self.writes_left is None:
            return
        if self.writes_left == 0:
            self.writes_left = None
            raise Crash("purge crashed")
        self.writes_left -= 1

    def transact(self, order_id: str, ops: Any) -> None:
        self._spend()
        super().transact(order_id, ops)

    def write_index(self, puts: Any, deletes: Any, *, stale: Any = ()) -> None:
        self._spend()
        super().write_index(puts, deletes, stale=stale)

    def delete_index(self, bucket: str, row_key: str) -> None:
        self._spend()
        super().delete_index(bucket, row_key)


@dataclass
class Aged:
    rt: CrashRuntime
    agents: AgentSim
    orders: dict[str, str]  # kind -> order id


def _aged_orders(store: MemoryStore | None = None, long_history: bool = False) -> Aged:
    """Orders of every kind, finished RetentionDays + 1 ago: processed, cancelled, terminated
    (purgeable), failed-and-compensated, held and compensation-failed (attention: kept)."""
    from tests.unit.core.statemachine.test_operator import HOLD

    rt = make_runtime(store=store, workflow=HOLD)
    agents = AgentSim(rt)
    orders = {}

    def run(kind: str, reject: dict[str, str]) -> str:
        agents.reject.clear()
        agents.reject.update(reject)
        oid = post(rt, body={"customerId": f"c-{kind}", "currency": "EUR", "priority": "normal",
                             "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 5}]}).body["orderId"]
        drive(rt, oid, agents)
        orders[kind] = oid
        return oid

    run("processed", {})
    run("failed", {"create-shipment": "no stock"})
    run("compensation-failed", {"create-shipment": "no stock", "charge-payment:compensate": "refused"})
    run("held", {"charge-payment": "declined"})
    oid = run("cancelled", {"charge-payment": "declined"})
    agents.reject.clear()
    assert cancel_order(rt, oid).status == 202
    drive(rt, oid, agents)
    if long_history:  # > 100 rows: the purge needs several transactions for this one
        oid = run("cancelled-long", {"charge-payment": "declined"})
        for _ in range(25):
            assert retry_order(rt, oid).status == 202
            drive(rt, oid, agents)
        assert cancel_order(rt, oid).status == 202
        drive(rt, oid, agents)
        assert len(events(rt, oid)) > 110
    agents.reject.clear()
    in_flight_oid = post(rt).body["orderId"]
    drive(rt, in_flight_oid, agents, until=_until_running("charge-payment"))
    assert terminate_order(rt, in_flight_oid).status == 202
    drive(rt, in_flight_oid, agents)
    orders["terminated"] = in_flight_oid
    clock_of(rt).advance((rt.config.retention_days + 1) * DAY)
    sweep(rt)
    return Aged(rt, agents, orders)


PURGEABLE = ("processed", "cancelled", "terminated", "cancelled-long")
KEPT = ("failed", "compensation-failed", "held")


def _order_is_whole_or_gone(rt: CrashRuntime, oid: str) -> bool:
    """GET shows the whole order (every row, its whole history), or 404 (and so do history and
    every action): never a half-deleted order. True if it is still there."""
    got = get_order(rt, oid)
    if got.status == 404:
        assert get_history(rt, oid, {}).status == 404
        for action in (retry_order, cancel_order, terminate_order):
            assert action(rt, oid).status == 404
        return False
    assert got.status == 200
    assert len(got.body["steps"]) == 3 and got.body["order"]["items"]
    assert_history_whole(rt, oid)
    return True


def _gone_for_good(rt: CrashRuntime, oid: str) -> None:
    """No row of the order left in the state table; no search lists it, and once the searches
    ran (they drop a row of a changing category whose order is gone), no index row is left."""
    assert rt.store.partition_keys(oid, 1000) == []
    for params in ({}, *({"state": c} for c in ("inFlight", "attention", "processed", "error"))):
        assert oid not in [o["orderId"] for o in search_orders(rt, {**params, "limit": "200"}).body["orders"]]
    assert search_rows(rt, oid) == {}


def test_purge_deletes_only_finished_orders_and_never_those_an_operator_must_act_on() -> None:
    aged = _aged_orders()
    rt = aged.rt
    report = purge(rt)
    assert sorted(report.orders) == sorted(aged.orders[k] for k in PURGEABLE if k in aged.orders)
    for kind in PURGEABLE:
        if kind in aged.orders:
            assert not _order_is_whole_or_gone(rt, aged.orders[kind])
            _gone_for_good(rt, aged.orders[kind])
    for kind in KEPT:
        oid = aged.orders[kind]
        assert _order_is_whole_or_gone(rt, oid)
        assert listed_in(rt, oid) == {"attention"}
    assert purge(rt).purged == 0
    # the kept ones can still be retried, and run to their end
    for kind in KEPT:
        assert retry_order(rt, aged.orders[kind]).status == 202
        drive(rt, aged.orders[kind], aged.agents)
    assert state(rt, aged.orders["held"])["ProcessState"] == "Processed"
    assert state(rt, aged.orders["failed"])["ProcessState"] == "Processed"
    assert purge(rt).purged == 0  # finished today: kept RetentionDays from now


@pytest.mark.parametrize("action", ["retry", "cancel", "get"])
def test_an_operator_action_between_the_purges_read_and_its_delete(action: str) -> None:
    """The purge reads a finished order's state; the operator acts on it right then: refused
    (finished orders take no action) or shown whole; the purge then deletes all of it."""
    store = HookStore()
    aged = _aged_orders(store)
    rt = aged.rt
    oid = aged.orders["cancelled"]
    seen: list[HttpResult] = []
    call = {"retry": retry_order, "cancel": cancel_order, "get": get_order}[action]
    store.after("read_row", oid, lambda: seen.append(call(rt, oid)))
    report = purge(rt)
    [r] = seen
    assert r.status == (200 if action == "get" else 409)
    assert oid in report.orders and report.lost_races == 0
    assert not _order_is_whole_or_gone(rt, oid)
    _gone_for_good(rt, oid)


def test_retry_and_cancel_of_attention_orders_during_a_purge() -> None:
    """While the purge runs, the operator restarts the failed order and cancels the held one:
    neither is purged (neither had a finish-day row when the purge read its page)."""
    store = HookStore()
    aged = _aged_orders(store)
    rt = aged.rt
    failed, held = aged.orders["failed"], aged.orders["held"]
    first = aged.orders["processed"]
    store.after("read_row", first, lambda: (retry_order(rt, failed), cancel_order(rt, held)))
    report = purge(rt)
    [(retried, cancelled)] = store.fired
    assert retried.status == 202 and cancelled.status == 202
    assert failed not in report.orders and held not in report.orders
    for oid in (failed, held):
        assert _order_is_whole_or_gone(rt, oid)
        drive(rt, oid, aged.agents)
    assert state(rt, failed)["ProcessState"] == "Processed"


def test_an_old_failed_order_cancelled_now_is_kept_retention_days_from_now() -> None:
    """An attention order is never purged; cancelling it makes it purgeable, and its retention
    counts from the cancel (not from the day it failed): the cancel's history is kept."""
    aged = _aged_orders()
    rt = aged.rt
    oid = aged.orders["failed"]
    assert cancel_order(rt, oid).body["result"] == "cancelled"
    assert oid not in purge(rt).orders
    assert _order_is_whole_or_gone(rt, oid)


def test_a_compensation_redriven_order_is_kept_retention_days_from_its_new_end() -> None:
    aged = _aged_orders()
    rt = aged.rt
    oid = aged.orders["compensation-failed"]
    aged.agents.reject.clear()
    assert retry_order(rt, oid).body["result"] == "compensation-redriven"
    drive(rt, oid, aged.agents)
    assert retry_order(rt, oid).status == 202  # then restarted: processed today
    drive(rt, oid, aged.agents)
    assert oid not in purge(rt).orders
    clock_of(rt).advance((rt.config.retention_days + 1) * DAY)
    assert oid in purge(rt).orders


def _clone(aged: Aged) -> tuple[CrashStore, CrashRuntime]:
    """A copy of the aged orders' store (rows and ETags), and a runtime on it at the same time."""
    original = aged.rt.store
    assert isinstance(original, MemoryStore)
    store = CrashStore()
    store._rows = dict(original._rows)  # values are replaced on write, never changed in place
    store._etags = itertools.count(next(original._etags) + 1)
    return store, make_runtime(store=store, clock=Clock(aged.rt.clock()), workflow=aged.rt.config.workflow)


def test_purge_crashing_after_every_write_never_leaves_a_half_deleted_order_visible() -> None:
    aged = _aged_orders(long_history=True)
    k = 0
    while True:
        store, rt = _clone(aged)
        store.writes_left = k
        try:
            purge(rt)
            done = True
        except Crash:
            done = False
        store.writes_left = None
        for kind, oid in aged.orders.items():
            assert _order_is_whole_or_gone(rt, oid) or kind in PURGEABLE
        # the next run finishes the job
        purge(rt)
        for kind in PURGEABLE:
            _gone_for_good(rt, aged.orders[kind])
        for kind in KEPT:
            assert _order_is_whole_or_gone(rt, aged.orders[kind])
        if done:
            break
        k += 1
    assert k > 10


def test_a_purge_that_crashed_midway_never_leaves_search_listing_an_order_that_is_gone() -> None:
    store = CrashStore()
    aged = _aged_orders(store)
    rt = aged.rt
    store.writes_left = 2  # the first order's listing rows, then its state transaction; the rest is not
    with pytest.raises(Crash):
        purge(rt)
    gone = [oid for oid in aged.orders.values() if get_order(rt, oid).status == 404]
    assert gone
    listed = {o["orderId"] for p in ({}, {"state": "processed"}, {"state": "error"})
              for o in search_orders(rt, p).body["orders"]}
    assert not listed & set(gone)
