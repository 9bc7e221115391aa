"""The scheduler's and replies' poison messages, each with its reason code (the dead-letter reason),
and the at-least-once traffic that is NOT poison: a stale schedule notice, a superseded attempt's reply."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.core.messages import PoisonMessage
from shared.scheduler import handle_reply, handle_schedule
from tests.unit.harness import WORKFLOW, AgentSim, drive, make_runtime, post


def reason(handle: Any, rt: Any, body: bytes) -> str:
    with pytest.raises(PoisonMessage) as e:
        handle(rt, body, message_id="m")
    assert str(e.value)  # the description names the problem
    return str(e.value.reason)


def finished_order() -> tuple[Any, str]:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    drive(rt, oid, AgentSim(rt))
    return rt, oid


@pytest.mark.parametrize("body, expected", [
    (b'{"kind": "schedule", "orderId": ', "InvalidJson"),
    (b"\xff\xfe not json", "InvalidJson"),
    (json.dumps({"kind": "schedule", "orderId": 12345, "seq": "zero"}).encode(), "SchemaViolation"),
    (json.dumps({"kind": "schedule", "orderId": "a" * 32, "seq": 0, "step": "no-such-step"}).encode(),
     "SchemaViolation"),
    (json.dumps({"kind": "schedule", "orderId": "a" * 32, "seq": 0}).encode(), "UnknownOrder"),
])
def test_schedule_poison_reasons(body: bytes, expected: str) -> None:
    assert reason(handle_schedule, make_runtime(), body) == expected


def test_a_schedule_notice_naming_a_step_says_so() -> None:
    with pytest.raises(PoisonMessage, match="step: Extra inputs are not permitted"):
        handle_schedule(make_runtime(), json.dumps({"kind": "schedule", "orderId": "a" * 32, "seq": 0,
                                                    "step": "x"}).encode())


def test_reply_poison_reasons() -> None:
    rt, oid = finished_order()
    reply = {"kind": "step", "orderId": oid, "step": WORKFLOW[1].name, "attempt": 1, "outcome": "success",
             "result": {"paymentId": "p"}, "reason": None}
    assert reason(handle_reply, rt, b"\xff\xfe not json") == "InvalidJson"
    assert reason(handle_reply, rt, json.dumps({**reply, "attempt": "one"}).encode()) == "SchemaViolation"
    assert reason(handle_reply, rt, json.dumps({**reply, "orderId": "b" * 32}).encode()) == "UnknownOrder"
    assert reason(handle_reply, rt, json.dumps({**reply, "step": "no-such-step"}).encode()) == "UnknownStep"


def test_stale_traffic_is_not_poison() -> None:
    """A schedule notice for a finished order and a late reply of a finished step: completed
    quietly with their verdict, no state change (at-least-once delivery makes both normal)."""
    rt, oid = finished_order()
    before = rt.store.read_partition(oid)
    assert handle_schedule(rt, json.dumps({"kind": "schedule", "orderId": oid, "seq": 0}).encode())
    late = {"kind": "step", "orderId": oid, "step": WORKFLOW[1].name, "attempt": 1, "outcome": "error",
            "result": None, "reason": "late"}
    assert handle_reply(rt, json.dumps(late).encode())
    assert rt.store.read_partition(oid) == before
