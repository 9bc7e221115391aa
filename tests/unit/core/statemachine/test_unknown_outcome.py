"""A step that fails by timeout has an unknown outcome: the remote may have applied its effect
(the reply was lost, or the agent hung after the call). It is compensated by its idempotency
key (``compensates``), first, then the Done steps in reverse order. An error reply is a
definitive "nothing applied": that step is not compensated."""

from __future__ import annotations

import json
from dataclasses import replace

from shared.api.operator import cancel_order, retry_order
from shared.api.orders import get_order
from shared.core.effects import Transact
from shared.core.statemachine import View, decide_expired
from shared.scheduler import handle_reply
from shared.supervisor import sweep
from tests.unit.harness import WORKFLOW, AgentSim, deliver_schedules, drive, make_runtime, post, state, steps

HOLD = tuple(replace(s, on_failure="hold") if s.name == "charge-payment" else s for s in WORKFLOW)


def _new(rt) -> str:  # type: ignore[no-untyped-def]
    r = post(rt)
    assert r.status == 202
    return r.body["orderId"]


def _comp_requests(agents: AgentSim, oid: str) -> list[dict]:
    return [b for b in agents.compensation_bodies if b["orderId"] == oid]


def test_timeout_with_lost_reply_is_compensated_first_by_its_key() -> None:
    rt = make_runtime()
    oid = _new(rt)
    agents = AgentSim(rt, lost={"charge-payment"})  # the card is charged; the reply never comes
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"], st["FailureCount"]) == ("Error", "failed", 3)
    assert st["CompensationState"] == "completed" and st["FailedStep"] == "charge-payment"
    # the charge happened once, and is refunded, before the reservation is released
    assert agents.calls == [(oid, "reserve-inventory", "reserve"), (oid, "charge-payment", "charge"),
                            (oid, "charge-payment", "refund"), (oid, "reserve-inventory", "release")]
    refund, release = _comp_requests(agents, oid)
    assert refund["operation"] == "refund" and refund["idempotencyKey"] == f"{oid}:charge-payment:compensate"
    assert refund["compensates"] == {"step": "charge-payment", "idempotencyKey": f"{oid}:charge-payment"}
    assert refund["context"] == {}  # no result to pass: the key names the effect
    assert release["compensates"] == {"step": "reserve-inventory", "idempotencyKey": f"{oid}:reserve-inventory"}
    assert release["context"] == {"reserve-inventory": {"id": "reserve-1"}}  # a Done step keeps its result
    s = steps(rt, oid)
    assert (s["charge-payment"]["State"], s["charge-payment"]["OutcomeUnknown"]) == ("Failed", True)
    assert s["charge-payment"]["Compensation"] == "Done"
    assert s["reserve-inventory"]["Compensation"] == "Done"
    assert s["create-shipment"]["Compensation"] == ""
    view = get_order(rt, oid).body
    assert view["compensation"] == {"state": "completed", "total": 2, "done": 2, "failed": 0, "pending": 0}
    assert [a.body["step"] for a in rt.bus.peek("alerts")] == ["charge-payment"]
    assert rt.store.index_rows() == []


def test_timeout_without_effect_tombstones_the_key_and_a_late_original_is_refused() -> None:
    rt = make_runtime()
    oid = _new(rt)
    agents = AgentSim(rt, hang={"charge-payment"})  # the agent hung before calling: nothing applied
    st = drive(rt, oid, agents)
    assert st["CompensationState"] == "completed"
    # the refund found nothing to undo under the key and tombstoned it
    assert agents.tombstones == [(oid, "charge-payment", "refund")]
    assert f"{oid}:charge-payment" in agents.tombstoned
    assert agents.calls == [(oid, "reserve-inventory", "reserve"), (oid, "reserve-inventory", "release")]
    # the original request lands after its compensation (the agent comes back): refused
    agents.hang.clear()
    before = {k: v for k, v in rt.store.snapshot().items() if k[0] == "state"}
    late = {"kind": "step", "orderId": oid, "step": "charge-payment", "operation": "charge", "attempt": 3,
            "idempotencyKey": f"{oid}:charge-payment", "completeBy": "2099-01-01T00:00:00+00:00",
            "order": {}, "context": {}}
    from shared.core.messages import OutMessage

    agents._handle(OutMessage(queue="agent-payment", body=late, message_id=f"{oid}:charge-payment:3",
                              reply_to="replies"), rt.clock())
    [reply] = agents.pending_replies
    assert (reply.body["outcome"], reply.body["reason"]) == ("error", "compensated")
    assert agents.reply_all() == ["duplicate"]  # the step is Failed at that attempt: nothing changes
    assert {k: v for k, v in rt.store.snapshot().items() if k[0] == "state"} == before
    assert (oid, "charge-payment", "charge") not in agents.calls


def test_error_reply_does_not_compensate_the_failed_step() -> None:
    rt = make_runtime()
    oid = _new(rt)
    agents = AgentSim(rt, reject={"charge-payment": "card declined"})
    st = drive(rt, oid, agents)
    assert st["CompensationState"] == "completed"
    s = steps(rt, oid)
    assert s["charge-payment"]["State"] == "Failed" and s["charge-payment"]["OutcomeUnknown"] is False
    assert s["charge-payment"]["Compensation"] == ""
    assert [b["step"] for b in _comp_requests(agents, oid)] == ["reserve-inventory"]
    assert agents.tombstones == []


def test_error_reply_after_earlier_timeouts_settles_the_outcome() -> None:
    """Attempts 1 and 2 time out (outcome unknown), attempt 3 gets an error reply: the remote
    answered for the key (the same on every attempt), so nothing was applied under it."""
    rt = make_runtime()
    oid = _new(rt)
    agents = AgentSim(rt, hang={"charge-payment"})
    st = drive(rt, oid, agents, until=lambda st: st.get("FailureCount") == 2)  # redriven twice
    assert (st["ProcessState"], st["LeaseKey"]) == ("Pending", "unclaimed")
    assert steps(rt, oid)["charge-payment"]["OutcomeUnknown"] is True
    agents.hang.clear()
    agents.reject["charge-payment"] = "card declined"
    st = drive(rt, oid, agents)
    assert st["CompensationState"] == "completed"
    s = steps(rt, oid)
    assert (s["charge-payment"]["OutcomeUnknown"], s["charge-payment"]["Compensation"]) == (False, "")
    assert [b["step"] for b in _comp_requests(agents, oid)] == ["reserve-inventory"]


def test_timeout_of_a_step_without_compensation_holds_the_order_and_compensates_nothing() -> None:
    # The pivot (create-shipment) timed out with its effect applied: the goods may be on their
    # way. Refunding and releasing now would give them away, so the order waits for an operator.
    rt = make_runtime()
    assert WORKFLOW[-1].on_failure == "compensate"  # held by the unknown outcome, not by policy
    oid = _new(rt)
    agents = AgentSim(rt, lost={"create-shipment"})
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Mode"], st["FailedStep"]) == ("Error", "held", "create-shipment")
    assert agents.compensation_bodies == []
    assert [a.body["step"] for a in rt.bus.peek("alerts")] == ["create-shipment"]
    assert steps(rt, oid)["create-shipment"]["OutcomeUnknown"] is True


def test_held_pivot_retry_learns_the_outcome_by_its_key_and_ships_once() -> None:
    rt = make_runtime()
    oid = _new(rt)
    agents = AgentSim(rt, lost={"create-shipment"})
    drive(rt, oid, agents)
    agents.lost.clear()  # the service answers again
    assert retry_order(rt, oid).status == 202
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed"
    assert agents.compensation_bodies == []
    # the retry replayed the step's one idempotency key: the service answered with the shipment
    # it had made, and applied nothing again
    assert [c[2] for c in agents.calls] == ["reserve", "charge", "ship"]
    assert steps(rt, oid)["create-shipment"]["State"] == "Done"


def test_held_pivot_cancel_compensates_the_done_steps_in_reverse() -> None:
    rt = make_runtime()
    oid = _new(rt)
    agents = AgentSim(rt, lost={"create-shipment"})
    drive(rt, oid, agents)
    assert cancel_order(rt, oid).status == 202
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("cancelled", "completed")
    assert [b["step"] for b in _comp_requests(agents, oid)] == ["charge-payment", "reserve-inventory"]
    assert steps(rt, oid)["create-shipment"]["Compensation"] == ""


def test_hold_policy_compensates_nothing_until_the_operator_cancels() -> None:
    rt = make_runtime(workflow=HOLD)
    oid = _new(rt)
    agents = AgentSim(rt, lost={"charge-payment"})
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Mode"], st["FailureCount"]) == ("Error", "held", 3)
    assert agents.compensation_bodies == []
    assert steps(rt, oid)["charge-payment"]["OutcomeUnknown"] is True
    r = cancel_order(rt, oid)
    assert r.status == 202
    st = state(rt, oid)
    assert (st["Mode"], st["CompIndex"]) == ("compensate", 1)  # the timed-out step first
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"], st["CompensationState"]) == ("Error", "cancelled", "completed")
    refund, release = _comp_requests(agents, oid)
    assert refund["compensates"] == {"step": "charge-payment", "idempotencyKey": f"{oid}:charge-payment"}
    assert release["step"] == "reserve-inventory"
    assert agents.calls[-2:] == [(oid, "charge-payment", "refund"), (oid, "reserve-inventory", "release")]
    assert steps(rt, oid)["charge-payment"]["Compensation"] == "Done"


def test_hold_then_retry_that_succeeds_compensates_nothing() -> None:
    rt = make_runtime(workflow=HOLD)
    oid = _new(rt)
    agents = AgentSim(rt, lost={"charge-payment"})
    drive(rt, oid, agents)
    agents.lost.clear()
    assert retry_order(rt, oid).status == 202
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed"
    assert agents.compensation_bodies == []
    assert [c[2] for c in agents.calls] == ["reserve", "charge", "ship"]  # the charge once, replayed


def test_cancel_of_a_pending_order_redriven_after_a_timeout_compensates_that_step() -> None:
    rt = make_runtime()
    oid = _new(rt)
    agents = AgentSim(rt, lost={"charge-payment"})
    drive(rt, oid, agents, until=lambda st: st.get("FailureCount") == 1)  # charge timed out once
    st = state(rt, oid)
    assert (st["ProcessState"], st["LeaseKey"]) == ("Pending", "unclaimed")
    assert steps(rt, oid)["charge-payment"]["OutcomeUnknown"] is True
    assert cancel_order(rt, oid).status == 202
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("cancelled", "completed")
    assert [b["step"] for b in _comp_requests(agents, oid)] == ["charge-payment", "reserve-inventory"]
    assert agents.calls[-2:] == [(oid, "charge-payment", "refund"), (oid, "reserve-inventory", "release")]


def test_threshold_decision_writes_each_row_once_and_schedules_the_failed_step_first() -> None:
    rt = make_runtime(max_failures=1)
    oid = _new(rt)
    deliver_schedules(rt)
    rows = rt.store.read_partition(oid)
    [req] = rt.bus.take("agent-inventory")
    handle_reply(rt, json.dumps({"kind": "step", "orderId": oid, "step": "reserve-inventory", "attempt": 1,
                                 "outcome": "success", "result": {"reservationId": "r-1"},
                                 "reason": None}).encode())
    assert req.body["step"] == "reserve-inventory"
    rt.clock.advance(31)
    v = View.from_entities(rt.store.read_partition(oid))
    d = decide_expired(v, rt.ctx())
    assert d.verdict == "compensating"
    [tx] = [e for e in d.effects if isinstance(e, Transact)]
    keys = [op.row["RowKey"] for op in tx.ops]
    assert len(keys) == len(set(keys))  # one op per row: the failed step is marked, not written twice
    by_key = {op.row["RowKey"]: op.row for op in tx.ops}
    charge = next(r for r in by_key.values() if r.get("Name") == "charge-payment")
    assert (charge["State"], charge["OutcomeUnknown"], charge["Compensation"]) == ("Failed", True, "Pending")
    reserve = next(r for r in by_key.values() if r.get("Name") == "reserve-inventory")
    assert reserve["Compensation"] == "Pending"
    assert by_key["state"]["CompIndex"] == 1 and by_key["state"]["LeaseKey"] == "unclaimed"
    assert rows  # the partition existed before
    rt.run(d.effects)
    sweep(rt)
