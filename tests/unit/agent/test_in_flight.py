"""The agent's state check (``shared.agent.worker.check_in_flight``, the pure rule
``shared.core.statemachine.request_not_in_flight``): a request for an order that does not exist
(UnknownOrder), or whose step attempt (or compensation attempt) the order does not have in flight
(StepNotInFlight), is poison; every request the core sends is in flight when it arrives."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from shared.agent.parsing import ReceivedRequest, parse_request
from shared.agent.worker import check_in_flight
from shared.core.messages import OutMessage, PoisonMessage
from shared.core.rows import STATE_ROW
from shared.core.workflows import load_registry
from shared.storage.memory import MemoryStore
from tests.unit.harness import BODY, AgentSim, drive, make_runtime, post, state

R, C, S = "reserve-inventory", "charge-payment", "create-shipment"


def request_of(m: OutMessage) -> ReceivedRequest:
    return parse_request(json.dumps(m.body).encode(), message_id=m.message_id, reply_to=m.reply_to or "replies")


def verdict(rt: Any, m: OutMessage) -> str | None:
    try:
        check_in_flight(rt, request_of(m))
    except PoisonMessage as e:
        return e.reason
    return None


class CheckingAgents(AgentSim):
    """Agents that check each request as they take it (the worker's order), and record the verdicts."""

    verdicts: list[tuple[str, str, str | None]]

    def _handle(self, req: OutMessage, now: datetime) -> None:
        if not hasattr(self, "verdicts"):
            self.verdicts = []
        self.verdicts.append((req.body["kind"], req.body["step"], verdict(self.rt, req)))
        super()._handle(req, now)


@pytest.mark.parametrize("body, reject", [
    (BODY, {}),
    (BODY, {S: "no stock"}),  # compensations of the done steps
    ({**BODY, "workflow": "express"}, {}),  # a parallel step's branches
    ({**BODY, "workflow": "express"}, {S: "no"}),
])
def test_every_request_the_core_sends_is_in_flight_when_it_arrives(body: dict[str, Any],
                                                                   reject: dict[str, str]) -> None:
    rt = make_runtime(registry=load_registry())
    agents = CheckingAgents(rt, reject=reject)
    oid = post(rt, body).body["orderId"]
    drive(rt, oid, agents)
    assert agents.verdicts and all(v is None for _k, _s, v in agents.verdicts), agents.verdicts
    if reject:
        assert any(k == "compensation" for k, _s, _v in agents.verdicts)


def test_a_request_for_an_order_that_does_not_exist_is_unknown_order() -> None:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    [req] = rt.bus.take("agent-inventory")
    other = OutMessage(queue=req.queue, body={**req.body, "orderId": "f" * 32, "idempotencyKey": "x"},
                       message_id="m", reply_to="replies")
    assert verdict(rt, other) == "UnknownOrder"
    assert verdict(rt, req) is None and state(rt, oid)["LeaseKey"] == f"{R}:1"


def test_a_copy_after_the_order_moved_on_is_step_not_in_flight() -> None:
    rt = make_runtime()
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    [req] = rt.bus.peek("agent-inventory")
    agents.work(rt.clock())
    agents.reply_all()  # the step is done, the next one in flight
    assert verdict(rt, req) == "StepNotInFlight"
    with pytest.raises(PoisonMessage, match=f"'{R}' attempt 1 is not in flight"):
        check_in_flight(rt, request_of(req))
    drive(rt, oid, agents)
    with pytest.raises(PoisonMessage, match="the order is finished"):
        check_in_flight(rt, request_of(req))


class PointReadsOnly(MemoryStore):
    """A store that records its point reads and fails any read of a whole partition."""

    def __init__(self) -> None:
        super().__init__()
        self.point_reads: list[tuple[str, str]] = []

    def read_row(self, order_id: str, row_key: str) -> Any:
        self.point_reads.append((order_id, row_key))
        return super().read_row(order_id, row_key)

    def read_partition(self, order_id: str) -> Any:
        raise AssertionError(f"read the partition of {order_id}")


def test_a_request_whose_token_is_current_is_checked_on_one_point_read_of_the_state_row() -> None:
    store = PointReadsOnly()
    rt = make_runtime(store=store)
    oid = post(rt).body["orderId"]
    [req] = rt.bus.peek("agent-inventory")
    assert req.body.get("fence")
    assert verdict(rt, req) is None
    assert store.point_reads == [(oid, STATE_ROW)]


@pytest.mark.parametrize("token", ["garbage", "another order's"])
def test_a_token_not_issued_for_this_order_is_not_trusted(token: str) -> None:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    [req] = rt.bus.peek("agent-inventory")
    agents = AgentSim(rt)
    agents.work(rt.clock())
    agents.reply_all()  # this order's step is done: its request is no longer in flight
    post(rt, {**BODY, "customerId": "c-2"})
    [theirs] = [m for m in rt.bus.peek("agent-inventory") if m.body["orderId"] != oid]
    assert verdict(rt, theirs) is None  # their token is current, and says their step is in flight
    fence = "A" * 40 if token == "garbage" else theirs.body["fence"]
    moved_on = OutMessage(queue=req.queue, body={**req.body, "fence": fence}, message_id="m", reply_to="replies")
    assert verdict(rt, moved_on) == "StepNotInFlight"


def test_an_attempt_the_supervisor_superseded_is_not_in_flight() -> None:
    from shared.supervisor import sweep

    rt = make_runtime()
    post(rt)
    [first] = rt.bus.take("agent-inventory")
    rt.clock.advance(31)
    sweep(rt)  # timed out: redriven (attempt 2 follows through the scheduler queue)
    assert verdict(rt, first) == "StepNotInFlight"


def test_a_branch_done_is_not_in_flight_while_its_sibling_is() -> None:
    from shared.scheduler import handle_reply

    rt = make_runtime(registry=load_registry())
    agents = AgentSim(rt)
    post(rt, {**BODY, "workflow": "express"})
    reqs = {m.body["step"]: m for q in ("agent-inventory", "agent-payment") for m in rt.bus.peek(q)}
    assert set(reqs) == {R, C} and all(verdict(rt, m) is None for m in reqs.values())
    agents.work(rt.clock())
    [reply] = [m for m in agents.pending_replies if m.body["step"] == C]
    handle_reply(rt, json.dumps(reply.body).encode(), message_id=reply.message_id)
    assert verdict(rt, reqs[C]) == "StepNotInFlight" and verdict(rt, reqs[R]) is None


def test_the_request_with_a_wrong_step_for_the_agent_is_unknown_step() -> None:
    from shared.core.workflows.catalog import AGENTS_BY_NAME
    from tests.unit.agent.test_runtime import request_body

    body = request_body(step="create-shipment", operation="ship")
    with pytest.raises(PoisonMessage) as e:
        parse_request(json.dumps(body).encode(), message_id="m", reply_to="r", agent=AGENTS_BY_NAME["inventory"].name)
    assert e.value.reason == "UnknownStep"


@pytest.mark.parametrize("raw, reason", [
    (b"[1, 2,", "InvalidJson"),
    (b"\xff\xfe", "InvalidJson"),
    (b"[1]", "SchemaViolation"),
    (json.dumps({"kind": "step", "orderId": "o-1"}).encode(), "SchemaViolation"),
])
def test_a_request_that_is_not_one_names_its_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(PoisonMessage) as e:
        parse_request(raw, message_id="m", reply_to="r", agent="inventory")
    assert e.value.reason == reason and str(e.value)


def test_no_reply_to_is_a_schema_violation() -> None:
    from tests.unit.agent.test_runtime import request_body

    with pytest.raises(PoisonMessage) as e:
        parse_request(json.dumps(request_body()).encode(), message_id="m", reply_to=None, agent="inventory")
    assert e.value.reason == "SchemaViolation" and "reply_to" in str(e.value)
