"""Operator actions of issue 11 on the in-memory twin: retry of each kind (held, failed and
compensated -> a new generation, compensation failed -> redriven), cancel of a failed order,
terminate (in flight, Pending, with the pivot in flight), and a 409 with its reason for every
action in every state it does not apply to.

Every remote effect is applied once net (:func:`net_effects`): a step is applied again only
after its compensation undid it. The search index follows each transition (:func:`listed_in`).

Helpers here (state builders, ``net_effects``, ``HookStore``, ``assert_index_settled``) are
shared with ``test_history`` and ``test_operator_crash_points``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from shared.api.http import HttpResult
from shared.api.operator import cancel_order, resume_order, retry_order, suspend_order, terminate_order
from shared.api.orders import get_history, get_order
from shared.api.search import search_orders
from shared.core.messages import OutMessage
from shared.core.rows import Op
from shared.core.statemachine import Category, StateRow, View, category_of, index_rows
from shared.core.workflows import Step
from shared.messaging import MemoryBus
from shared.runtime import Runtime
from shared.scheduler import handle_reply
from shared.storage.memory import MemoryStore
from shared.supervisor import sweep
from tests.unit.harness import (
    WORKFLOW,
    AgentSim,
    Clock,
    CrashRuntime,
    deliver_schedules,
    drive,
    make_runtime,
    post,
    redriven,
    state,
    steps,
)

HOLD = tuple(replace(s, on_failure="hold") if s.name == "charge-payment" else s for s in WORKFLOW)
UNDOES = {"release": "reserve-inventory", "refund": "charge-payment"}  # compensation -> the step it undoes
ACTIONS: dict[str, Callable[[Any, str], HttpResult]] = {
    "retry": retry_order, "cancel": cancel_order, "terminate": terminate_order, "suspend": suspend_order,
    "resume": resume_order}


# ---------------------------------------------------------------------------------------------
# helpers
def mem(rt: Runtime) -> MemoryStore:
    assert isinstance(rt.store, MemoryStore)
    return rt.store


def membus(rt: Runtime) -> MemoryBus:
    assert isinstance(rt.bus, MemoryBus)
    return rt.bus


def clock_of(rt: Runtime) -> Clock:
    assert isinstance(rt.clock, Clock)
    return rt.clock


class HookStore(MemoryStore):
    """A MemoryStore that runs ``action`` once, right after a chosen read of an order: whatever
    ``action`` writes lands between that reader's read and its write (an interleaving)."""

    def __init__(self) -> None:
        super().__init__()
        self.hooks: list[tuple[str, str, Callable[[], Any]]] = []
        self.fired: list[Any] = []

    def after(self, method: str, order_id: str, action: Callable[[], Any]) -> None:
        self.hooks.append((method, order_id, action))

    def _fire(self, method: str, order_id: str) -> None:
        for i, (m, oid, action) in enumerate(self.hooks):
            if (m, oid) == (method, order_id):
                del self.hooks[i]
                self.fired.append(action())
                return

    def read_partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        rows = super().read_partition(order_id)
        self._fire("read_partition", order_id)
        return rows

    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None:
        row = super().read_row(order_id, row_key)
        self._fire("read_row", order_id)
        return row

    def transact(self, order_id: str, ops: Sequence[Op]) -> dict[str, str]:
        """``transact`` hooks run right BEFORE the write (e.g. a reply decided on its fencing
        token has no read: the rival lands between the token's issue and the reply's write)."""
        self._fire("transact", order_id)
        return super().transact(order_id, ops)


def net_effects(agents: AgentSim, oid: str) -> dict[str, int]:
    """The remote calls of the order, in order, as a balance per step: 1 while its effect
    stands, 0 once undone. Fails on a double effect: a step applied while its earlier effect
    still stands, or a compensation of nothing (those are tombstones, never calls)."""
    balance: dict[str, int] = {}
    for order_id, step, operation in agents.calls:
        if order_id != oid:
            continue
        if operation in UNDOES:
            assert UNDOES[operation] == step and balance.get(step) == 1, ("undo of nothing", agents.calls)
            balance[step] = 0
        else:
            assert balance.get(step, 0) == 0, ("double effect", agents.calls)
            balance[step] = 1
    return balance


def events(rt: Any, oid: str) -> list[dict[str, Any]]:
    """The order's whole history, paged through the history endpoint."""
    out: list[dict[str, Any]] = []
    params: dict[str, str] = {"limit": "1000"}
    while True:
        page = get_history(rt, oid, params)
        assert page.status == 200, page.body
        out += page.body["history"]
        if page.body["continuationToken"] is None:
            return out
        params = {"limit": "1000", "continuationToken": page.body["continuationToken"]}


def kinds(rt: Any, oid: str) -> list[str]:
    return [str(e["event"]) for e in events(rt, oid)]


def assert_history_whole(rt: Any, oid: str) -> list[dict[str, Any]]:
    """Seq 1..EventSeq, contiguous, oldest first, times never going back."""
    history = events(rt, oid)
    assert [e["seq"] for e in history] == list(range(1, len(history) + 1))
    assert len(history) == state(rt, oid)["EventSeq"]
    ats = [e["at"] for e in history]
    assert ats == sorted(ats)
    return history


def listed_in(rt: Any, oid: str) -> set[str]:
    """The search categories that list the order (each search verifies and repairs)."""
    return {c.value for c in Category
            if oid in [o["orderId"] for o in search_orders(rt, {"state": c.value, "limit": "200"}).body["orders"]]}


def search_rows(rt: Any, oid: str) -> dict[str, dict[str, Any]]:
    return {rk: props for (table, _pk, rk), props in mem(rt).snapshot().items()
            if table == "search" and props.get("OrderId") == oid}


def assert_index_settled(rt: Any, oid: str) -> None:
    """Eventually, the order's search index rows are exactly what its state says: after a
    sweep (a deadline row left behind re-indexes the order) and the searches that verify and
    repair what they return. Only for a settled order (the clock moves on)."""
    clock_of(rt).advance(600)
    sweep(rt)
    assert [r for r in mem(rt).index_rows() if r["OrderId"] == oid] == []  # no deadline row left
    for params in ({}, *({"state": c.value} for c in Category)):
        search_orders(rt, {**params, "limit": "200"})
    view = View.from_entities(rt.store.read_partition(oid))
    assert view.order is not None and view.state is not None
    expected = {r.row_key: r.to_entity() for r in index_rows(view.order, view.state)}
    actual = search_rows(rt, oid)
    assert set(actual) == set(expected), (sorted(actual), sorted(expected))
    for key, row in expected.items():
        assert actual[key].get("Category") == row.get("Category"), (key, actual[key])
    category = category_of(view.state)
    assert listed_in(rt, oid) == {category.value}
    [found] = [o for o in search_orders(rt, {"limit": "200"}).body["orders"] if o["orderId"] == oid]
    assert (found["category"], found["processState"]) == (category.value, str(view.state.process_state))


def requests(rt: Any, queue: str) -> list[OutMessage]:
    return membus(rt).peek(queue)


def in_flight(step: str, workflow: tuple[Step, ...] = WORKFLOW, **sim: Any) -> tuple[CrashRuntime, AgentSim, str]:
    """An order with ``step`` in flight (attempt 1, claimed), its request still in the queue."""
    rt = make_runtime(workflow=workflow)
    agents = AgentSim(rt, **sim)
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("LeaseKey") == f"{step}:1")
    return rt, agents, oid


def finished(workflow: tuple[Step, ...] = WORKFLOW, **sim: Any) -> tuple[CrashRuntime, AgentSim, str]:
    """An order driven until it settles (finished or held)."""
    rt = make_runtime(workflow=workflow)
    agents = AgentSim(rt, **sim)
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents)
    return rt, agents, oid


def failed_compensated() -> tuple[CrashRuntime, AgentSim, str]:
    rt, agents, oid = finished(reject={"create-shipment": "no stock"})
    st = state(rt, oid)
    assert (st["Outcome"], st["Mode"], st["CompensationState"]) == ("failed", "finished", "completed")
    return rt, agents, oid


def compensation_failed() -> tuple[CrashRuntime, AgentSim, str]:
    rt, agents, oid = finished(reject={"create-shipment": "no stock", "charge-payment:compensate": "refund refused"})
    st = state(rt, oid)
    assert (st["Outcome"], st["Mode"], st["CompensationState"]) == ("failed", "finished", "failed")
    return rt, agents, oid


def held_order() -> tuple[CrashRuntime, AgentSim, str]:
    rt, agents, oid = finished(HOLD, reject={"charge-payment": "card declined"})
    assert (state(rt, oid)["Mode"], state(rt, oid)["Outcome"]) == ("held", "held")
    return rt, agents, oid


def pending_redriven() -> tuple[CrashRuntime, AgentSim, str]:
    rt = make_runtime()
    return rt, AgentSim(rt), redriven(rt)


def take_request(rt: Any, queue: str) -> OutMessage:
    """Take the one request waiting in ``queue`` (it has not reached the agent yet)."""
    [req] = membus(rt).take(queue)
    return req


def late(rt: Any, agents: AgentSim, req: OutMessage) -> None:
    """A request held back (slow network) reaches its agent now; the agent replies."""
    membus(rt).sent[req.queue].append(req)
    agents.work(rt.clock())
    agents.reply_all()


# ---------------------------------------------------------------------------------------------
# retry, kind 1: a held order runs again from its failed step, its key replayed
def test_retry_of_a_held_order_runs_again_from_its_failed_step_with_its_key() -> None:
    rt, agents, oid = held_order()
    assert listed_in(rt, oid) == {"attention"}
    agents.reject.clear()
    r = retry_order(rt, oid)
    assert r.status == 202 and r.headers["Location"] == f"/api/orders/{oid}"
    assert r.body == {"orderId": oid, "action": "retry", "result": "retried", "processState": "Pending"}
    st = state(rt, oid)
    assert (st["Mode"], st["LeaseKey"], st["StepName"], st["FailureCount"], st["Generation"]) == (
        "forward", "unclaimed", "charge-payment", 0, 0)
    assert steps(rt, oid)["charge-payment"]["State"] == "Pending"
    assert events(rt, oid)[-1] | {"at": None} == {"seq": st["EventSeq"], "at": None, "event": "retried",
                                                  "step": "charge-payment", "instance": "instance-a",
                                                  "traceId": events(rt, oid)[0]["traceId"]}
    assert listed_in(rt, oid) == {"inFlight"}
    deliver_schedules(rt)
    [again] = requests(rt, "agent-payment")
    assert again.body["idempotencyKey"] == f"{oid}:charge-payment"  # the same key: the remote dedups
    assert again.body["attempt"] == 2
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"]) == ("Processed", "processed")
    assert net_effects(agents, oid) == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


# retry, kind 2: failed and compensated -> a new generation with fresh keys
def test_retry_of_a_failed_compensated_order_restarts_it_as_a_new_generation() -> None:
    rt, agents, oid = failed_compensated()
    assert listed_in(rt, oid) == {"attention"}
    before = steps(rt, oid)
    agents.reject.clear()
    r = retry_order(rt, oid)
    assert r.status == 202 and r.body["result"] == "restarted" and r.body["processState"] == "Pending"
    st = state(rt, oid)
    assert (st["ProcessState"], st["Mode"], st["LeaseKey"], st["StepIndex"], st["Generation"]) == (
        "Pending", "forward", "unclaimed", 0, 1)
    for gone in ("Outcome", "CompensationState", "FinishedAt", "FailedStep", "Reason"):
        assert gone not in st, gone
    assert (st["FailureCount"], st["CompIndex"]) == (0, -1)
    for name, row in steps(rt, oid).items():
        # fresh, but the attempt counters go on: a late reply of the old run never matches
        assert (row["State"], row["Compensation"], row.get("Result")) == ("Pending", "", None), row
        assert row["Attempt"] == before[name]["Attempt"]
        assert row["CompensationAttempt"] == before[name]["CompensationAttempt"]
    assert events(rt, oid)[-1]["event"] == "restarted" and events(rt, oid)[-1]["detail"] == {"generation": 1}
    assert listed_in(rt, oid) == {"inFlight"}
    assert get_order(rt, oid).body["generation"] == 1
    sent_before = len(agents.calls)
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Generation"]) == ("Processed", 1)
    # the new run's requests carry fresh keys: the remotes would answer the old keys with the
    # undone effects of generation 0
    mine = [c for c in agents.calls[sent_before:] if c[0] == oid]
    assert [c[2] for c in mine] == ["reserve", "charge", "ship"]
    keys = [k for k in agents.effects if k.startswith(f"{oid}:g1:")]
    assert sorted(keys) == sorted(f"{oid}:g1:{s.name}" for s in WORKFLOW)
    # applied again only after their compensation: reserve, charge, refund, release, reserve, ...
    assert [c[2] for c in agents.calls if c[0] == oid] == ["reserve", "charge", "refund", "release",
                                                          "reserve", "charge", "ship"]
    assert net_effects(agents, oid) == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}
    body = get_order(rt, oid).body
    assert (body["generation"], body["category"]) == (1, "processed")
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


def test_a_restarted_order_that_fails_again_compensates_its_own_generation_and_restarts_again() -> None:
    rt, agents, oid = failed_compensated()
    assert retry_order(rt, oid).body["result"] == "restarted"
    st = drive(rt, oid, agents)  # create-shipment is still refused
    assert (st["Outcome"], st["CompensationState"], st["Generation"]) == ("failed", "completed", 1)
    refunds = [b for b in agents.compensation_bodies if b["orderId"] == oid and b["operation"] == "refund"]
    assert [b["compensates"]["idempotencyKey"] for b in refunds] == [f"{oid}:charge-payment",
                                                                      f"{oid}:g1:charge-payment"]
    assert [b["idempotencyKey"] for b in refunds] == [f"{oid}:charge-payment:compensate",
                                                      f"{oid}:g1:charge-payment:compensate"]
    agents.reject.clear()
    assert retry_order(rt, oid).body["result"] == "restarted"
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Generation"]) == ("Processed", 2)
    assert f"{oid}:g2:create-shipment" in agents.effects
    assert net_effects(agents, oid) == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}
    assert kinds(rt, oid).count("restarted") == 2
    assert_history_whole(rt, oid)


def test_restart_of_an_order_that_failed_at_its_first_step() -> None:
    rt, agents, oid = finished(reject={"reserve-inventory": "unknown sku"})
    st = state(rt, oid)
    assert (st["Outcome"], st["CompensationState"]) == ("failed", "none")
    assert listed_in(rt, oid) == {"attention"}
    agents.reject.clear()
    assert retry_order(rt, oid).body["result"] == "restarted"
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Generation"]) == ("Processed", 1)
    assert net_effects(agents, oid) == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}


@pytest.mark.parametrize("how", ["lost", "hang"])
def test_restart_after_a_timeout_applies_the_step_again_only_after_it_was_undone(how: str) -> None:
    """charge-payment times out for good (outcome unknown) and is compensated by its key; the
    restart sends it under a new key, which the old compensation never tombstoned."""
    rt = make_runtime()
    agents = AgentSim(rt, lost={"charge-payment"}) if how == "lost" else AgentSim(rt, hang={"charge-payment"})
    oid = post(rt).body["orderId"]
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"], st["FailureCount"]) == ("failed", "completed", 3)
    if how == "hang":
        assert f"{oid}:charge-payment" in agents.tombstoned  # nothing applied: the key is tombstoned
    agents.lost.clear()
    agents.hang.clear()
    assert retry_order(rt, oid).body["result"] == "restarted"
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed"
    assert f"{oid}:g1:charge-payment" not in agents.tombstoned
    charges = [c[2] for c in agents.calls if c[0] == oid and c[1] == "charge-payment"]
    assert charges == (["charge", "refund", "charge"] if how == "lost" else ["charge"])
    assert net_effects(agents, oid) == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}


def test_late_replies_of_the_old_generation_are_stale_after_a_restart() -> None:
    rt, agents, oid = failed_compensated()
    assert retry_order(rt, oid).body["result"] == "restarted"
    deliver_schedules(rt)  # generation 1 claims: reserve-inventory attempt 2 in flight
    before = {k: v for k, v in mem(rt).snapshot().items() if k[0] == "state"}
    old = [{"kind": "step", "orderId": oid, "step": "reserve-inventory", "attempt": 1, "outcome": "success",
            "result": {"id": "old"}, "reason": None},
           {"kind": "step", "orderId": oid, "step": "create-shipment", "attempt": 1, "outcome": "error",
            "result": None, "reason": "no stock"},
           {"kind": "compensation", "orderId": oid, "step": "charge-payment", "attempt": 1, "outcome": "success",
            "result": {"id": "refund-old"}, "reason": None}]
    for body in old:
        assert handle_reply(rt, json.dumps(body).encode()) == "stale"
    assert {k: v for k, v in mem(rt).snapshot().items() if k[0] == "state"} == before
    st = drive(rt, oid, AgentSim(rt, effects=agents.effects, calls=agents.calls))
    assert st["ProcessState"] == "Processed"


# retry, kind 3: a compensation that failed for good is redriven
def test_retry_redrives_only_the_compensations_that_failed() -> None:
    rt, agents, oid = compensation_failed()
    assert listed_in(rt, oid) == {"attention"}
    s = steps(rt, oid)
    assert (s["charge-payment"]["Compensation"], s["reserve-inventory"]["Compensation"]) == ("Failed", "Done")
    agents.reject.pop("charge-payment:compensate")
    r = retry_order(rt, oid)
    assert r.status == 202 and r.body["result"] == "compensation-redriven" and r.body["processState"] == "Error"
    st = state(rt, oid)
    assert (st["Mode"], st["LeaseKey"], st["CompIndex"], st["CompensationState"], st["Generation"]) == (
        "compensate", "unclaimed", 1, "running", 0)
    assert "FinishedAt" not in st
    s = steps(rt, oid)
    assert (s["charge-payment"]["Compensation"], s["reserve-inventory"]["Compensation"]) == ("Pending", "Done")
    last = events(rt, oid)[-1]
    assert (last["event"], last["detail"]) == ("retried", {"retry": "compensation", "steps": ["charge-payment"]})
    assert listed_in(rt, oid) == {"inFlight"}
    st = drive(rt, oid, agents)
    assert (st["Mode"], st["Outcome"], st["CompensationState"]) == ("finished", "failed", "completed")
    # the refund ran once (its refused attempts applied nothing); the release was not redone
    assert [c[2] for c in agents.calls if c[0] == oid] == ["reserve", "charge", "release", "refund"]
    assert net_effects(agents, oid) == {"reserve-inventory": 0, "charge-payment": 0}
    assert kinds(rt, oid)[-3:] == ["compensationDispatched", "compensationDone", "compensated"]
    # still failed and not retried: it stays on the attention list, and can now be restarted
    assert listed_in(rt, oid) == {"attention"}
    agents.reject.clear()
    assert retry_order(rt, oid).body["result"] == "restarted"
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    assert net_effects(agents, oid) == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


def test_a_compensation_the_supervisor_gave_up_on_is_redriven() -> None:
    rt, agents, oid = finished(reject={"create-shipment": "no stock"}, hang={"charge-payment:compensate"})
    assert state(rt, oid)["CompensationState"] == "failed"
    charge = steps(rt, oid)["charge-payment"]
    assert charge["Compensation"] == "Failed" and "gave up after 3" in charge["CompensationReason"]
    assert "compensationRedriven" in kinds(rt, oid)  # the Supervisor's own redrives, before it gave up
    agents.hang.clear()
    assert retry_order(rt, oid).body["result"] == "compensation-redriven"
    st = drive(rt, oid, agents)
    assert (st["CompensationState"], st["CompFailureCount"], st["Outcome"]) == ("completed", 0, "failed")
    assert net_effects(agents, oid) == {"reserve-inventory": 0, "charge-payment": 0}
    assert_index_settled(rt, oid)


def test_a_cancelled_order_whose_compensation_failed_is_redriven_and_ends_cancelled() -> None:
    rt, agents, oid = held_order()
    agents.reject["reserve-inventory:compensate"] = "release refused"
    assert cancel_order(rt, oid).body["result"] == "cancelling"
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("cancelled", "failed")
    assert listed_in(rt, oid) == {"attention"}  # a compensation that failed for good
    agents.reject.clear()
    assert retry_order(rt, oid).body["result"] == "compensation-redriven"
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"], st["Mode"]) == ("cancelled", "completed", "finished")
    assert net_effects(agents, oid) == {"reserve-inventory": 0}
    assert listed_in(rt, oid) == {"error"}
    assert retry_order(rt, oid).status == 409
    assert_index_settled(rt, oid)


# ---------------------------------------------------------------------------------------------
# cancel
def test_cancel_of_a_failed_order_ends_it_with_no_new_effect() -> None:
    rt, agents, oid = failed_compensated()
    calls = list(agents.calls)
    r = cancel_order(rt, oid)
    assert r.status == 202 and r.body["result"] == "cancelled" and r.body["processState"] == "Error"
    st = state(rt, oid)
    assert (st["Mode"], st["Outcome"], st["CompensationState"], st.get("LockedBy")) == (
        "finished", "cancelled", "completed", None)
    last = events(rt, oid)[-1]
    assert (last["event"], last["detail"]) == ("cancelled", {"compensations": 0})
    assert agents.calls == calls and membus(rt).peek("scheduler") == []
    assert listed_in(rt, oid) == {"error"}  # it left the attention list
    assert retry_order(rt, oid).status == 409 and cancel_order(rt, oid).status == 409
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


def test_cancel_of_an_order_that_failed_at_its_first_step() -> None:
    rt, agents, oid = finished(reject={"reserve-inventory": "unknown sku"})
    assert cancel_order(rt, oid).body["result"] == "cancelled"
    st = state(rt, oid)
    assert (st["Outcome"], st["CompensationState"]) == ("cancelled", "none")
    assert agents.calls == [] and listed_in(rt, oid) == {"error"}


@pytest.mark.parametrize("step", ["reserve-inventory", "charge-payment", "create-shipment"])
def test_cancel_is_refused_in_flight_and_says_use_terminate(step: str) -> None:
    rt, _agents, oid = in_flight(step)
    before = mem(rt).snapshot()
    r = cancel_order(rt, oid)
    assert r.status == 409 and r.content_type == "application/problem+json"
    assert r.body["type"].endswith("/wrong-state")
    assert "terminate" in r.body["detail"] and f"step {step} in flight" in r.body["detail"]
    assert mem(rt).snapshot() == before


# ---------------------------------------------------------------------------------------------
# terminate
@pytest.mark.parametrize("applied", [True, False], ids=["applied-before", "never-applied"])
def test_terminate_compensates_done_steps_and_the_one_in_flight_by_its_key(applied: bool) -> None:
    """charge-payment in flight: its request reached the payment service (the card is charged,
    the reply is on its way) or not yet. Either way the refund by its key settles it."""
    rt, agents, oid = in_flight("charge-payment")
    req = take_request(rt, "agent-payment")
    reply = None
    if applied:
        membus(rt).sent[req.queue].append(req)
        agents.work(rt.clock())  # charged; the reply is on its way
        reply = agents.pending_replies.pop()
    r = terminate_order(rt, oid)
    assert r.status == 202 and r.body == {"orderId": oid, "action": "terminate", "result": "terminating",
                                          "processState": "Error"}
    st = state(rt, oid)
    assert (st["Mode"], st["Outcome"], st["LeaseKey"], st["CompIndex"], st.get("LockedBy")) == (
        "compensate", "terminated", "unclaimed", 1, None)
    s = steps(rt, oid)["charge-payment"]
    assert (s["State"], s["FailureReason"], s["OutcomeUnknown"], s["Compensation"]) == (
        "Failed", "terminated by operator", True, "Pending")
    assert listed_in(rt, oid) == {"inFlight"}  # compensating is in flight
    if reply is not None:  # the late success reply changes nothing: the attempt was fenced
        before = {k: v for k, v in mem(rt).snapshot().items() if k[0] == "state"}
        assert handle_reply(rt, json.dumps(reply.body).encode()) in ("stale", "duplicate")
        assert {k: v for k, v in mem(rt).snapshot().items() if k[0] == "state"} == before
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Mode"], st["Outcome"], st["CompensationState"]) == (
        "Error", "finished", "terminated", "completed")
    refunds = [b for b in agents.compensation_bodies if b["operation"] == "refund"]
    assert refunds[0]["compensates"] == {"step": "charge-payment", "idempotencyKey": f"{oid}:charge-payment"}
    if applied:
        assert [c[2] for c in agents.calls] == ["reserve", "charge", "refund", "release"]
    else:
        assert [c[2] for c in agents.calls] == ["reserve", "release"]
        assert agents.tombstones == [(oid, "charge-payment", "refund")]
        late(rt, agents, req)  # the original request arrives after all: refused, nothing applied
        assert [c[2] for c in agents.calls] == ["reserve", "release"]
    assert net_effects(agents, oid) == {"reserve-inventory": 0, **({"charge-payment": 0} if applied else {})}
    assert kinds(rt, oid)[4:] == ["terminated", "compensationDispatched", "compensationDone",
                                  "compensationDispatched", "compensationDone", "compensated"]
    assert events(rt, oid)[4]["detail"] == {"compensations": 2}
    assert listed_in(rt, oid) == {"error"}
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


def test_terminate_with_the_first_step_in_flight_compensates_it_by_its_key() -> None:
    rt, agents, oid = in_flight("reserve-inventory")
    assert terminate_order(rt, oid).body["result"] == "terminating"
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"], st["FailedStep"]) == ("terminated", "completed",
                                                                         "reserve-inventory")
    # the reserve request was still queued ahead of the release: applied, then undone
    assert [c[2] for c in agents.calls] == ["reserve", "release"]
    assert net_effects(agents, oid) == {"reserve-inventory": 0}
    assert_index_settled(rt, oid)


def test_terminate_of_a_pending_redriven_order() -> None:
    rt, agents, oid = pending_redriven()  # its first request was lost: nothing applied
    st = state(rt, oid)
    r = terminate_order(rt, oid)
    assert r.status == 202 and r.body["result"] == "terminating"
    after = state(rt, oid)
    assert (after["Mode"], after["Outcome"], after["LeaseKey"], after["ScheduleSeq"]) == (
        "compensate", "terminated", "unclaimed", st["ScheduleSeq"] + 1)
    s = steps(rt, oid)["reserve-inventory"]
    assert (s["State"], s["FailureReason"], s["Compensation"]) == ("Failed", "terminated by operator", "Pending")
    st = drive(rt, oid, agents)  # the old schedule message and the new one: one claims, one is ignored
    assert (st["ProcessState"], st["Mode"], st["Outcome"], st["CompensationState"]) == (
        "Error", "finished", "terminated", "completed")
    assert agents.calls == [] and agents.tombstones == [(oid, "reserve-inventory", "release")]
    assert_history_whole(rt, oid)
    assert_index_settled(rt, oid)


def test_terminate_of_a_restarted_order_before_its_claim_has_nothing_to_compensate() -> None:
    rt, agents, oid = failed_compensated()
    assert retry_order(rt, oid).body["result"] == "restarted"
    calls = list(agents.calls)
    r = terminate_order(rt, oid)
    assert r.status == 202 and r.body["result"] == "terminated"
    st = state(rt, oid)
    assert (st["Mode"], st["Outcome"], st["CompensationState"], st.get("LeaseKey")) == (
        "finished", "terminated", "none", None)
    assert deliver_schedules(rt) == ["ignored"]  # the restart's schedule message finds nothing to claim
    assert agents.calls == calls
    assert events(rt, oid)[-1]["event"] == "terminated"
    assert_index_settled(rt, oid)


def test_terminate_with_the_pivot_in_flight_holds_the_order() -> None:
    rt, agents, oid = in_flight("create-shipment")
    r = terminate_order(rt, oid)
    assert r.status == 202 and r.body == {"orderId": oid, "action": "terminate", "result": "held",
                                          "processState": "Error"}
    st = state(rt, oid)
    assert (st["Mode"], st["Outcome"], st.get("LeaseKey"), st.get("LockedBy")) == ("held", "held", None, None)
    assert "create-shipment" in st["Reason"] and "outcome is unknown" in st["Reason"]
    s = steps(rt, oid)
    assert (s["create-shipment"]["State"], s["create-shipment"]["OutcomeUnknown"]) == ("Failed", True)
    assert all(row["Compensation"] == "" for row in s.values())  # nothing undone: goods may have left
    assert [(e["event"], e.get("step")) for e in events(rt, oid)[-2:]] == [("terminated", "create-shipment"),
                                                                          ("held", "create-shipment")]
    assert events(rt, oid)[-2]["detail"] == {"held": True}
    assert listed_in(rt, oid) == {"attention"}
    assert mem(rt).index_rows() == []  # held: no deadline
    # the late shipment reply changes nothing
    agents.work(rt.clock())
    assert agents.reply_all() in (["stale"], ["duplicate"])
    assert state(rt, oid)["Mode"] == "held"
    # the operator retries: the shipment is replayed under its key (the remote answers it once)
    assert retry_order(rt, oid).body["result"] == "retried"
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed"
    assert net_effects(agents, oid) == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}
    assert_index_settled(rt, oid)


def test_terminate_held_with_the_pivot_then_cancel_compensates_the_steps_before_it() -> None:
    rt, agents, oid = in_flight("create-shipment", hang={"create-shipment"})
    assert terminate_order(rt, oid).body["result"] == "held"
    assert cancel_order(rt, oid).body["result"] == "cancelling"
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("cancelled", "completed")
    assert net_effects(agents, oid) == {"reserve-inventory": 0, "charge-payment": 0}
    assert_index_settled(rt, oid)


def test_terminate_a_retried_held_order_before_its_claim() -> None:
    """Held after an error reply (nothing applied), retried, terminated before the retry was
    sent: only the Done steps are compensated."""
    rt, agents, oid = held_order()
    agents.reject.clear()
    assert retry_order(rt, oid).body["result"] == "retried"
    assert terminate_order(rt, oid).body["result"] == "terminating"
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("terminated", "completed")
    assert [c[2] for c in agents.calls] == ["reserve", "release"] and agents.tombstones == []
    assert_index_settled(rt, oid)


# ---------------------------------------------------------------------------------------------
# every action in every state: it applies, or 409 with the reason and nothing written
def _processing() -> tuple[CrashRuntime, AgentSim, str]:
    return in_flight("charge-payment")


def _compensating() -> tuple[CrashRuntime, AgentSim, str]:
    rt = make_runtime()
    agents = AgentSim(rt, reject={"create-shipment": "no stock"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("Mode") == "compensate")
    return rt, agents, oid


def _processed() -> tuple[CrashRuntime, AgentSim, str]:
    return finished()


def _cancelled() -> tuple[CrashRuntime, AgentSim, str]:
    rt, agents, oid = failed_compensated()
    assert cancel_order(rt, oid).status == 202
    return rt, agents, oid


def _terminated() -> tuple[CrashRuntime, AgentSim, str]:
    rt, agents, oid = in_flight("charge-payment")
    assert terminate_order(rt, oid).status == 202
    drive(rt, oid, agents)
    return rt, agents, oid


def suspended_in_flight() -> tuple[CrashRuntime, AgentSim, str]:
    """Suspended while charge-payment is at its agent (its request still in the queue)."""
    rt, agents, oid = in_flight("charge-payment")
    assert suspend_order(rt, oid).status == 202
    return rt, agents, oid


def suspended_idle() -> tuple[CrashRuntime, AgentSim, str]:
    """Suspended, charge-payment's reply recorded since: Pending, nothing in flight."""
    rt, agents, oid = suspended_in_flight()
    drive(rt, oid, agents, until=lambda st: st.get("StepName") == "create-shipment" and not st.get("LeaseKey"))
    return rt, agents, oid


def _restarted_pending() -> tuple[CrashRuntime, AgentSim, str]:
    rt, agents, oid = failed_compensated()
    assert retry_order(rt, oid).status == 202
    return rt, agents, oid


STATES: dict[str, tuple[Callable[[], tuple[CrashRuntime, AgentSim, str]], dict[str, str], str]] = {
    # name: (builder, {action: verdict when it applies}, what the 409 says the order is)
    "processing": (_processing, {"terminate": "terminating", "suspend": "suspended"},
                   "order is Processing, step charge-payment in flight"),
    "pending-redriven": (pending_redriven, {"cancel": "cancelling", "terminate": "terminating",
                                            "suspend": "suspended"}, "order is Pending"),
    "suspended-in-flight": (suspended_in_flight, {"terminate": "terminating", "resume": "unsuspended"},
                            "order is Processing, step charge-payment in flight"),
    "suspended-idle": (suspended_idle, {"cancel": "cancelling", "terminate": "terminating",
                                        "resume": "unsuspended"}, "order is Pending"),
    "held": (held_order, {"retry": "retried", "cancel": "cancelling"}, "order is Error"),
    "compensating": (_compensating, {}, "order is Error and compensating"),
    "processed": (_processed, {}, "order is Processed (processed)"),
    "failed-compensated": (failed_compensated, {"retry": "restarted", "cancel": "cancelled"}, "order is Error"),
    "compensation-failed": (compensation_failed, {"retry": "compensation-redriven"}, "order is Error (failed)"),
    "cancelled": (_cancelled, {}, "order is Error (cancelled)"),
    "terminated": (_terminated, {}, "order is Error (terminated)"),
    "restarted-pending": (_restarted_pending, {"cancel": "cancelled", "terminate": "terminated",
                                               "suspend": "suspended"}, "order is Pending"),
}


@pytest.mark.parametrize("action", sorted(ACTIONS))
@pytest.mark.parametrize("name", sorted(STATES))
def test_every_action_in_every_state_applies_or_is_409_with_its_reason(name: str, action: str) -> None:
    build, applies, described = STATES[name]
    rt, _agents, oid = build()
    before = mem(rt).snapshot()
    sent = len(membus(rt).all())
    r = ACTIONS[action](rt, oid)
    if action in applies:
        assert r.status == 202, r.body
        assert r.body["result"] == applies[action] and r.body["action"] == action
        assert events(rt, oid)[-1]["event"] in ("retried", "restarted", "cancelled", "terminated", "held", "suspended",
                                                 "unsuspended")
        assert_history_whole(rt, oid)
        return
    assert r.status == 409 and r.content_type == "application/problem+json", r.body
    assert r.body["type"] == "https://errors.orders.example/wrong-state"
    assert r.body["orderId"] == oid and r.body["processState"] == state(rt, oid)["ProcessState"]
    assert r.body["detail"].startswith(f"cannot {action}: {described}"), r.body["detail"]
    assert "; only " in r.body["detail"]  # the rule: what the action applies to
    if action == "cancel" and state(rt, oid)["Mode"] == "forward":
        assert "terminate" in r.body["detail"]
    assert mem(rt).snapshot() == before and len(membus(rt).all()) == sent  # nothing written, nothing sent


@pytest.mark.parametrize("name", sorted(STATES))
def test_the_order_names_exactly_the_actions_it_takes(name: str) -> None:
    """``GET /api/orders/{id}``'s ``actions`` (what the console offers) is the set of actions that
    apply in this state, asked of the decisions themselves, and asking writes and sends nothing."""
    from shared.api.orders import get_order

    build, applies, _described = STATES[name]
    rt, _agents, oid = build()
    before, sent = mem(rt).snapshot(), len(membus(rt).all())
    assert get_order(rt, oid).body["actions"] == [a for a in ACTIONS if a in applies]
    assert mem(rt).snapshot() == before and len(membus(rt).all()) == sent


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_unknown_and_malformed_order_ids(action: str) -> None:
    rt = make_runtime()
    assert ACTIONS[action](rt, "f" * 32).status == 404
    for bad in ("x", "", "../state", "f" * 31):
        r = ACTIONS[action](rt, bad)
        assert r.status == 400 and r.body["type"].endswith("/invalid-order-id")
    assert mem(rt).snapshot() == {}


def test_each_action_is_recorded_once_however_often_it_is_called() -> None:
    rt, agents, oid = failed_compensated()
    assert retry_order(rt, oid).status == 202
    for _ in range(3):
        assert retry_order(rt, oid).status == 409  # Pending: already retried
    assert kinds(rt, oid).count("restarted") == 1
    assert terminate_order(rt, oid).status == 202
    for action in ACTIONS.values():
        assert action(rt, oid).status == 409
    assert kinds(rt, oid).count("terminated") == 1
    assert_history_whole(rt, oid)


@pytest.mark.parametrize("how", ["held-by-policy", "held-by-terminate"])
def test_cancel_of_a_held_order_lists_it_in_flight_while_it_compensates(how: str) -> None:
    """A held order (attention) that is cancelled compensates: it is in flight again, and its
    search index says so at once (not only once a search repaired it), with no attention row
    left behind."""
    if how == "held-by-policy":
        rt, _agents, oid = held_order()
    else:
        rt, _agents, oid = in_flight("create-shipment")
        assert terminate_order(rt, oid).body["result"] == "held"
    assert cancel_order(rt, oid).body["result"] == "cancelling"
    assert category_of(StateRow.from_entity(state(rt, oid))).value == "inFlight"
    found = [o["orderId"] for o in search_orders(rt, {"state": "inFlight"}).body["orders"]]
    assert oid in found
    assert not any(key.startswith("cat-attention-") for key in search_rows(rt, oid))
