"""The agent runtime against the real remote services simulator (``python -m local.remotes``).

The simulator is started the way the stack starts it, on a random free loopback port, and
stopped by PID. Faults are set through its control endpoints.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from local.procs import Proc, free_port
from local.remotes.client import RemotesClient
from shared.agent import AgentRuntime, RetryPolicy, loads, parse_request
from shared.messaging import MemoryBus

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
FAST = RetryPolicy(initial_backoff=0.05, max_backoff=0.2, jitter=0.02, max_call_timeout=5.0)


@pytest.fixture(scope="module")
def remotes() -> Iterator[RemotesClient]:
    port = free_port()
    proc = Proc("remotes", [sys.executable, "-m", "local.remotes", "--host", "127.0.0.1", "--port", str(port)])
    proc.start("ready", timeout=30)
    client = RemotesClient(f"http://127.0.0.1:{port}")
    try:
        yield client
    finally:
        client.close()
        proc.stop()


@pytest.fixture
def rc(remotes: RemotesClient) -> RemotesClient:
    remotes.reset_faults()
    return remotes


class Sender(MemoryBus):
    """The app's in-memory bus; ``sent`` shows each reply as it would arrive (decoded JSON)."""

    @property
    def replies(self) -> list[dict[str, Any]]:
        return [{"queue": m.queue, "body": loads(m.encoded()), "message_id": m.message_id,
                 "correlation_id": m.correlation_id, "props": m.application_properties} for m in self.all()]


ORDER = {"customerId": "c-1", "currency": "EUR", "total": "19.98",
         "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}]}


def request(order_id: str, step: str, operation: str, *, kind: str = "step", agent: str, attempt: int = 1,
            context: dict[str, Any] | None = None, seconds: float = 3.0, order: dict[str, Any] | None = None,
            compensates: bool = False):
    suffix = ":compensate" if kind == "compensation" else ""
    body = {
        "kind": kind, "orderId": order_id, "step": step, "operation": operation, "attempt": attempt,
        "idempotencyKey": f"{order_id}:{step}{suffix}",
        "completeBy": (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(),
        "order": order or ORDER, "context": context or {},
    }
    if compensates:
        body["compensates"] = {"step": step, "idempotencyKey": f"{order_id}:{step}"}
    return parse_request(json.dumps(body).encode(), message_id=f"{order_id}:{step}{suffix}:{attempt}",
                         reply_to="replies", application_properties={"traceparent": TRACEPARENT}, agent=agent)


def rt(rc: RemotesClient, agent: str, sender: Sender, policy: RetryPolicy = FAST) -> AgentRuntime:
    return AgentRuntime(agent, rc.url(agent), sender, policy=policy)


def test_whole_order_and_its_compensations(rc: RemotesClient) -> None:
    oid = f"o-{uuid.uuid4().hex[:8]}"
    s = Sender()
    inv, pay = rt(rc, "inventory", s), rt(rc, "payment", s)

    r1 = inv.handle(request(oid, "reserve-inventory", "reserve", agent="inventory"))
    r2 = pay.handle(request(oid, "charge-payment", "charge", agent="payment",
                            context={"reserve-inventory": r1.reply.result}))
    assert (r1.outcome, r2.outcome) == ("success", "success")
    charge = s.replies[1]["body"]["result"]
    assert Decimal(charge["amount"]) == Decimal("19.98") and charge["amount"] == "19.98"

    c2 = pay.handle(request(oid, "charge-payment", "refund", kind="compensation", agent="payment",
                            context={"charge-payment": charge}))
    c1 = inv.handle(request(oid, "reserve-inventory", "release", kind="compensation", agent="inventory",
                            context={"reserve-inventory": s.replies[0]["body"]["result"]}))
    assert (c2.outcome, c1.outcome) == ("success", "success"), (c2, c1)
    assert [m["body"]["kind"] for m in s.replies] == ["step", "step", "compensation", "compensation"]
    effects = [(e["service"], e["operation"], e["idempotencyKey"]) for e in rc.ledger(order_id=oid)]
    assert effects == [
        ("inventory", "reserve", f"{oid}:reserve-inventory"),
        ("payment", "charge", f"{oid}:charge-payment"),
        ("payment", "refund", f"{oid}:charge-payment:compensate"),
        ("inventory", "release", f"{oid}:reserve-inventory:compensate"),
    ]


def test_redelivered_request_applies_the_effect_once_and_replies_the_same(rc: RemotesClient) -> None:
    oid = f"o-{uuid.uuid4().hex[:8]}"
    s = Sender()
    inv = rt(rc, "inventory", s)
    inv.handle(request(oid, "reserve-inventory", "reserve", agent="inventory"))
    inv.handle(request(oid, "reserve-inventory", "reserve", agent="inventory"))
    assert len(rc.ledger(order_id=oid)) == 1
    a, b = s.replies
    assert a["message_id"] == b["message_id"] == f"reply:{oid}:reserve-inventory:1"
    assert a["body"] == b["body"]


def test_business_rejection_is_an_error_reply_with_the_reason(rc: RemotesClient) -> None:
    rc.set_faults("inventory", rejectSkus=["SKU-9"])
    oid = f"o-{uuid.uuid4().hex[:8]}"
    s = Sender()
    order = {**ORDER, "items": [{"sku": "SKU-9", "quantity": 1, "unitPrice": "19.98"}]}
    result = rt(rc, "inventory", s).handle(request(oid, "reserve-inventory", "reserve", agent="inventory",
                                                   order=order))
    assert result.outcome == "error" and result.calls == 1
    assert s.replies[0]["body"]["reason"] == "out of stock: SKU-9"
    assert rc.ledger(order_id=oid) == []


def test_lost_response_is_recovered_by_retrying_the_same_key(rc: RemotesClient) -> None:
    rc.set_faults("payment", lostResponseRate=1.0)
    oid = f"o-{uuid.uuid4().hex[:8]}"
    s = Sender()
    result = rt(rc, "payment", s).handle(request(oid, "charge-payment", "charge", agent="payment"))
    assert result.outcome == "success" and result.statuses == (503, 200)
    [effect] = rc.ledger(order_id=oid)
    assert effect["result"]["paymentId"] == s.replies[0]["body"]["result"]["paymentId"]


def test_service_down_sends_nothing_by_complete_by(rc: RemotesClient) -> None:
    rc.set_faults("shipping", down="reset")
    oid = f"o-{uuid.uuid4().hex[:8]}"
    s = Sender()
    t0 = time.monotonic()
    result = rt(rc, "shipping", s).handle(request(oid, "create-shipment", "ship", agent="shipping", seconds=1.0))
    assert result.status == "expired" and s.replies == [] and result.calls >= 2
    assert time.monotonic() - t0 < 1.6


def test_hung_service_is_cut_off_at_complete_by(rc: RemotesClient) -> None:
    rc.set_faults("shipping", hangRate=1.0, hangSeconds=5)
    oid = f"o-{uuid.uuid4().hex[:8]}"
    s = Sender()
    t0 = time.monotonic()
    result = rt(rc, "shipping", s, RetryPolicy(max_call_timeout=30.0)).handle(
        request(oid, "create-shipment", "ship", agent="shipping", seconds=1.0))
    assert result.status == "expired" and result.statuses == ("timeout",)
    assert time.monotonic() - t0 < 1.5 and s.replies == []


def test_compensation_by_key_undoes_an_effect_whose_reply_was_lost(rc: RemotesClient) -> None:
    """The charge went through but nobody heard back (the step timed out): the refund carries no
    paymentId, only ``compensates``; the remote finds the charge by its key and refunds it."""
    oid = f"o-{uuid.uuid4().hex[:8]}"
    rc.set_faults("payment", lostResponseRate=1.0)
    r = rc.call("payment", "charge", {"orderId": oid, "order": ORDER, "context": {}}, f"{oid}:charge-payment")
    assert r.status_code == 503
    rc.reset_faults()
    s = Sender()
    result = rt(rc, "payment", s).handle(request(oid, "charge-payment", "refund", kind="compensation",
                                                 agent="payment", compensates=True))
    assert result.outcome == "success" and result.reply.result["refundId"]
    charge, refund = rc.ledger(order_id=oid)
    assert (charge["operation"], refund["operation"]) == ("charge", "refund")
    assert refund["paymentId"] == charge["result"]["paymentId"]
    assert refund["idempotencyKey"] == f"{oid}:charge-payment:compensate"
    assert refund["compensates"] == f"{oid}:charge-payment"


def test_compensation_of_nothing_then_the_late_original_is_an_error_reply(rc: RemotesClient) -> None:
    oid = f"o-{uuid.uuid4().hex[:8]}"
    s = Sender()
    inv = rt(rc, "inventory", s)
    c = inv.handle(request(oid, "reserve-inventory", "release", kind="compensation", agent="inventory",
                           compensates=True))
    assert c.outcome == "success" and c.reply.result == {"released": None, "nothingToUndo": True}
    late = inv.handle(request(oid, "reserve-inventory", "reserve", agent="inventory", attempt=2))
    assert (late.outcome, late.calls) == ("error", 1)  # 409: permanent, not retried
    assert s.replies[-1]["body"]["reason"] == "compensated"
    [tomb] = rc.ledger(order_id=oid)
    assert (tomb["kind"], tomb["operation"]) == ("tombstone", "release")
