"""Parallel steps (``shared.core.statemachine.groups``): the shipped ``express`` workflow reserves
stock and charges together, then ships. Driven through the real handlers on the memory store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.api.operator import resume_order, suspend_order, terminate_order
from shared.api.orders import get_order
from shared.core.messages import OutMessage
from shared.core.statemachine.groups import STOPPED_REASON
from shared.core.workflows import Registry, WorkflowError, load_directory, load_registry
from shared.core.workflows.catalog import AGENTS_BY_NAME
from shared.scheduler import handle_reply
from shared.supervisor import sweep
from tests.unit.core.statemachine.test_operator import assert_history_whole, kinds, net_effects
from tests.unit.harness import BODY, AgentSim, Crash, CrashRuntime, drive, make_runtime, post, state, steps

R, C, S = "reserve-inventory", "charge-payment", "create-shipment"
EXPRESS = {**BODY, "workflow": "express"}


def runtime(**overrides: Any) -> CrashRuntime:
    return make_runtime(registry=load_registry(), **overrides)


def requests(rt: CrashRuntime, agents: AgentSim) -> None:
    """The agents apply every request waiting in their queues; the replies are held back."""
    agents.work(rt.clock())


def reply_of(agents: AgentSim, step: str) -> OutMessage:
    [msg] = [m for m in agents.pending_replies if m.body["step"] == step]
    agents.pending_replies.remove(msg)
    return msg


def deliver(rt: CrashRuntime, msg: OutMessage) -> str:
    return handle_reply(rt, json.dumps(msg.body).encode(), message_id=msg.message_id)


def ops(agents: AgentSim, oid: str) -> list[str]:
    return [op for order, _step, op in agents.calls if order == oid]


def test_both_branches_are_dispatched_together_and_the_last_reply_dispatches_the_next_step() -> None:
    rt = runtime()
    agents = AgentSim(rt)
    oid = post(rt, EXPRESS).body["orderId"]
    st = state(rt, oid)
    assert (st["LeaseKey"], st["StepName"]) == ("prepare:1", "prepare")
    assert [s["State"] for s in steps(rt, oid).values()] == ["Running", "Running", "Pending"]
    requests(rt, agents)
    assert sorted(ops(agents, oid)) == ["charge", "reserve"]
    assert deliver(rt, reply_of(agents, C)) == "branch-done"
    assert state(rt, oid)["LeaseKey"] == "prepare:1"
    assert deliver(rt, reply_of(agents, R)) == "step-done"
    assert state(rt, oid)["LeaseKey"] == f"{S}:1"
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    assert kinds(rt, oid)[:5] == ["accepted", "dispatched", "dispatched", "stepDone", "stepDone"]
    shown = get_order(rt, oid).body
    assert shown["currentStep"] is None or shown["processState"] == "Processed"
    assert_history_whole(rt, oid)


@pytest.mark.parametrize("first", [R, C])
def test_a_failure_after_the_group_undoes_its_branches_in_reverse_order_of_completion(first: str) -> None:
    rt = runtime()
    agents = AgentSim(rt, reject={S: "no"})
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)
    second = C if first == R else R
    assert deliver(rt, reply_of(agents, first)) == "branch-done"
    rt.clock.advance(1)
    assert deliver(rt, reply_of(agents, second)) == "step-done"
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"]) == ("Error", "failed")
    undo = {R: "release", C: "refund"}
    assert [op for op in ops(agents, oid) if op in ("release", "refund")] == [undo[second], undo[first]]


def test_a_branch_that_fails_stops_the_other_and_undoes_what_it_may_have_done() -> None:
    """The charge is declined while the reservation is in flight: the reservation is stopped (its
    outcome unknown) and released by its key; its late reply is stale."""
    rt = runtime()
    agents = AgentSim(rt, reject={C: "declined"})
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)  # both applied (the charge rejected), replies held
    assert deliver(rt, reply_of(agents, C)) == "compensating"
    rows = steps(rt, oid)
    assert (rows[R]["State"], rows[R]["OutcomeUnknown"]) == ("Failed", True)
    shown = {s["name"]: s for s in get_order(rt, oid).body["steps"]}
    assert (shown[R]["outcomeUnknown"], shown[R]["failureReason"], shown[C]["outcomeUnknown"]) == (
        True, STOPPED_REASON, False)
    assert deliver(rt, reply_of(agents, R)) == "stale"
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"], st["FailedStep"]) == ("Error", "failed", C)
    assert ops(agents, oid) == ["reserve", "release"] and net_effects(agents, oid) == {R: 0}
    assert "stepFailed" in kinds(rt, oid)


def test_a_branch_that_fails_after_the_other_is_done_undoes_it() -> None:
    rt = runtime()
    agents = AgentSim(rt, reject={C: "declined"})
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)
    assert deliver(rt, reply_of(agents, R)) == "branch-done"
    assert deliver(rt, reply_of(agents, C)) == "compensating"
    assert drive(rt, oid, agents)["Outcome"] == "failed"
    assert ops(agents, oid) == ["reserve", "release"]


def test_a_hung_branch_is_redriven_alone_and_the_group_fails_at_max_failure_count() -> None:
    rt = runtime(max_failures=2)
    agents = AgentSim(rt, hang={C})
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)
    assert deliver(rt, reply_of(agents, R)) == "branch-done"
    rt.clock.advance(31)
    assert sweep(rt).acted == {"redriven": 1}
    drive(rt, oid, agents, until=lambda st: st.get("LeaseKey") == "prepare:2")
    rows = steps(rt, oid)
    assert (rows[R]["State"], rows[R]["Attempt"], rows[C]["State"], rows[C]["Attempt"]) == ("Done", 1, "Running", 2)
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"], st["FailureCount"]) == ("Error", "failed", 2)
    assert ops(agents, oid) == ["reserve", "release"]  # the hung charge never applied: its refund is a tombstone


def test_terminate_stops_every_branch_in_flight_and_compensates() -> None:
    rt = runtime()
    agents = AgentSim(rt)
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)  # both applied, replies held
    r = terminate_order(rt, oid)
    assert (r.status, r.body["result"]) == (202, "terminating")
    assert {n: row["State"] for n, row in steps(rt, oid).items()} == {R: "Failed", C: "Failed", S: "Pending"}
    agents.reply_all()  # late: stale
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("terminated", "completed")
    assert net_effects(agents, oid) == {R: 0, C: 0}


def test_suspended_during_the_group_it_ends_and_the_next_step_waits_for_resume() -> None:
    rt = runtime()
    agents = AgentSim(rt)
    oid = post(rt, EXPRESS).body["orderId"]
    assert suspend_order(rt, oid).status == 202
    requests(rt, agents)
    assert deliver(rt, reply_of(agents, R)) == "branch-done"
    assert deliver(rt, reply_of(agents, C)) == "step-done-suspended"
    assert resume_order(rt, oid).status == 202
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"


def test_a_branchs_waiting_reply_is_ignored_and_the_group_redriven_at_its_deadline() -> None:
    rt = runtime()
    agents = AgentSim(rt, breaker_open={C: 1})
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)
    assert deliver(rt, reply_of(agents, C)) == "ignored"
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    assert "redriven" in kinds(rt, oid) and "stepWaiting" not in kinds(rt, oid)


def test_a_duplicate_branch_reply_changes_nothing() -> None:
    rt = runtime()
    agents = AgentSim(rt)
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)
    msg = reply_of(agents, R)
    assert deliver(rt, msg) == "branch-done"
    seq = state(rt, oid)["EventSeq"]
    assert deliver(rt, msg) == "duplicate"
    assert state(rt, oid)["EventSeq"] == seq


# ---------------------------------------------------------------------------------------------
# crash points: each decision of a group dies after each of its effects, then its message comes again or not
def _first_branch_reply(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)
    msg = reply_of(agents, R)
    return oid, lambda: deliver(rt, msg)


def _last_branch_reply(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)
    assert deliver(rt, reply_of(agents, R)) == "branch-done"
    msg = reply_of(agents, C)
    return oid, lambda: deliver(rt, msg)


def _failing_branch_reply(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    agents.reject[C] = "declined"
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)
    msg = reply_of(agents, C)
    return oid, lambda: deliver(rt, msg)


def _group_redrive(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)
    assert deliver(rt, reply_of(agents, R)) == "branch-done"
    agents.pending_replies.clear()  # the charge's reply is lost
    rt.clock.advance(31)
    return oid, lambda: sweep(rt)


def _terminate(rt: CrashRuntime, agents: AgentSim) -> tuple[str, Any]:
    oid = post(rt, EXPRESS).body["orderId"]
    requests(rt, agents)
    return oid, lambda: terminate_order(rt, oid)


CRASHES = [("first-branch-reply", _first_branch_reply), ("last-branch-reply", _last_branch_reply),
           ("failing-branch-reply", _failing_branch_reply), ("group-redrive", _group_redrive),
           ("terminate", _terminate)]


@pytest.mark.parametrize("again", [True, False], ids=["again", "never-again"])
@pytest.mark.parametrize(("name", "setup"), CRASHES, ids=[c[0] for c in CRASHES])
def test_each_group_decision_crashing_after_every_effect_converges(name: str, setup: Any, again: bool) -> None:
    from tests.unit.core.statemachine.test_events import calls_stand_as_rows_say
    from tests.unit.core.statemachine.test_operator import assert_index_settled
    from tests.unit.core.statemachine.test_operator_crash_points import history_matches_state

    k = 0
    while True:
        rt = runtime()
        agents = AgentSim(rt)
        oid, trigger = setup(rt, agents)
        history_matches_state(rt, oid)
        rt.crash_at = k
        with pytest.raises(Crash):
            trigger()
        if again:
            trigger()
        st = drive(rt, oid, agents, max_rounds=400)
        assert st["Mode"] in ("finished", "held") and not st.get("LockedBy"), st
        balance = calls_stand_as_rows_say(rt, agents, oid)
        if st["ProcessState"] == "Processed":
            assert balance == {R: 1, C: 1, S: 1}
        assert_history_whole(rt, oid)
        assert_index_settled(rt, oid)
        if rt.crash_exhausted:
            break
        k += 1
    assert k >= 1


# ---------------------------------------------------------------------------------------------
# the file format
def _load(tmp_path: Path, text: str) -> Registry:
    (tmp_path / "p.v1.yaml").write_text(text, encoding="utf-8")
    return load_directory(tmp_path, AGENTS_BY_NAME)


def _branch(name: str, extra: str = "") -> str:
    return (f"      - name: {name}\n        agent: payment\n        operation: charge\n"
            f"        timeoutSeconds: 5\n{extra}")


@pytest.mark.parametrize(("branches", "reason"), [
    (1, "a parallel step has 2 to 8 branches, not 1"),
    (9, "a parallel step has 2 to 8 branches, not 9"),
])
def test_a_parallel_step_has_two_to_eight_branches(tmp_path: Path, branches: int, reason: str) -> None:
    text = "name: p\nversion: 1\nsteps:\n  - name: g\n    kind: parallel\n    branches:\n" + "".join(
        _branch(f"b{i}") for i in range(branches))
    with pytest.raises(WorkflowError) as caught:
        _load(tmp_path, text)
    assert reason in str(caught.value)


@pytest.mark.parametrize(("extra", "reason"), [
    ("        when: {total: {gt: 1}}\n", "without its own when"),
    ("        kind: delay\n", "does not take"),
])
def test_a_branch_is_a_plain_call(tmp_path: Path, extra: str, reason: str) -> None:
    text = ("name: p\nversion: 1\nsteps:\n  - name: g\n    kind: parallel\n    branches:\n"
            + _branch("a") + _branch("b", extra))
    with pytest.raises(WorkflowError) as caught:
        _load(tmp_path, text)
    assert reason in str(caught.value)


def test_branch_names_are_step_names(tmp_path: Path) -> None:
    text = ("name: p\nversion: 1\nsteps:\n  - name: a\n    agent: payment\n    operation: charge\n"
            "    timeoutSeconds: 5\n  - name: g\n    kind: parallel\n    branches:\n" + _branch("a") + _branch("b"))
    with pytest.raises(WorkflowError) as caught:
        _load(tmp_path, text)
    assert "steps[1].branches[0].name: duplicate step name 'a'" in str(caught.value)


def test_a_groups_when_applies_to_every_branch(tmp_path: Path) -> None:
    text = ("name: p\nversion: 1\nsteps:\n  - name: a\n    agent: payment\n    operation: charge\n"
            "    timeoutSeconds: 5\n  - name: g\n    kind: parallel\n    when: {total: {gt: 100}}\n    branches:\n"
            + _branch("b") + _branch("c"))
    wf = _load(tmp_path, text).get("p", 1)
    assert [(s.name, s.group, s.when is not None) for s in wf.steps] == [
        ("a", None, False), ("b", "g", True), ("c", "g", True)]
