"""The pipeline over the real Service Bus (the local emulator) and Table Storage (Azurite),
through the app's own clients (``shared.runtime.clients``) and runtime, with the agents' side played
by hand: requests are received off the agent queues and answered on ``reply_to``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.api.orders import get_order, submit
from shared.core.statemachine import Config
from shared.messaging import ServiceBusBus
from shared.runtime import Runtime
from shared.runtime.clients import Clients
from shared.scheduler import handle_reply, handle_schedule
from shared.settings import Settings
from shared.supervisor import sweep
from tests.unit.harness import BODY, REQUIRED_VALUES

pytestmark = pytest.mark.integration


class Bus:
    """The module's Service Bus: the app's Clients (senders) and one open receiver per queue."""

    def __init__(self, connection_string: str) -> None:
        self.clients = Clients(Settings.from_env({**REQUIRED_VALUES, "ServiceBusConnection": connection_string}))
        self.receivers: dict[str, Any] = {}

    def receiver(self, queue: str) -> Any:
        if queue not in self.receivers:
            self.receivers[queue] = self.clients.service_bus().get_queue_receiver(queue, max_wait_time=1)
        return self.receivers[queue]

    def close(self) -> None:
        self.clients.close()  # closes the receivers' links with the client


@pytest.fixture(scope="module")
def bus(servicebus: Any) -> Iterator[Bus]:
    b = Bus(servicebus.connection_string)
    yield b
    b.close()


@pytest.fixture
def sb_runtime(table_store: Any, bus: Bus) -> tuple[Runtime, Bus]:
    settings = Settings.from_env({**REQUIRED_VALUES, "StepTimeoutSeconds": "3", "UnclaimedGraceSeconds": "1"})
    rt = Runtime(store=table_store, bus=ServiceBusBus(bus.clients.sender), config=Config.from_settings(settings),
                 keys=settings.token_keys, instance_id="it-1")
    return rt, bus


def _receive(bus: Bus, queue: str, order_id: str, want: int = 1, wait: float = 10.0) -> list[Any]:
    """Receive (and complete) messages of ``order_id`` from ``queue``; others are completed too."""
    out: list[Any] = []
    deadline = time.monotonic() + wait
    receiver = bus.receiver(queue)
    while len(out) < want and time.monotonic() < deadline:
        for m in receiver.receive_messages(max_message_count=want - len(out), max_wait_time=1):
            receiver.complete_message(m)
            body = json.loads(b"".join(m.body))
            if body.get("orderId") == order_id:
                out.append((m, body))
    return out


def _post(rt: Runtime, body: dict | None = None, headers: dict | None = None) -> Any:
    return submit(rt, json.dumps(body or BODY).encode(), {"Content-Type": "application/json", **(headers or {})},
                  max_bytes=65536)


def _props(m: Any) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in (m.application_properties or {}).items()}


def _agent_reply(bus: Bus, request: Any, body: dict, outcome: str = "success",
                 result: dict | None = None, reason: str | None = None) -> None:
    from azure.servicebus import ServiceBusMessage

    reply = {"kind": body["kind"], "orderId": body["orderId"], "step": body["step"], "attempt": body["attempt"],
             "outcome": outcome, "result": result if outcome == "success" else None, "reason": reason}
    bus.clients.sender(request.reply_to).send(ServiceBusMessage(
        json.dumps(reply).encode(), message_id=f"reply:{request.message_id}", correlation_id=request.message_id,
        application_properties={"traceparent": _props(request)["traceparent"]}))


def test_order_flows_through_service_bus(sb_runtime: tuple[Runtime, Bus]) -> None:
    rt, bus = sb_runtime
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    r = _post(rt, {**BODY, "statusQueue": "order-status"}, {"traceparent": tp})
    assert r.status == 202
    oid = r.body["orderId"]
    assert r.body["processState"] == "Processing"  # the submission claimed step 1 and sent its request
    results = {"reserve-inventory": {"reservationId": "r-1"}, "charge-payment": {"paymentId": "p-1"},
               "create-shipment": {"shipmentId": "s-1"}}
    for step, queue in (("reserve-inventory", "agent-inventory"), ("charge-payment", "agent-payment"),
                        ("create-shipment", "agent-shipping")):
        [(req, rbody)] = _receive(bus, queue, oid)
        assert req.message_id == f"{oid}:{step}:1" == req.correlation_id
        assert req.reply_to == "replies"
        assert 0 < req.time_to_live.total_seconds() <= 3
        assert rbody["idempotencyKey"] == f"{oid}:{step}" and rbody["step"] == step
        assert _props(req)["traceparent"].split("-")[1] == tp.split("-")[1]
        _agent_reply(bus, req, rbody, result=results[step])
        [(rep, repbody)] = _receive(bus, "replies", oid)
        assert handle_reply(rt, json.dumps(repbody).encode(), message_id=rep.message_id) in ("step-done", "processed")
    view = get_order(rt, oid).body
    assert view["processState"] == "Processed"
    # order v2: its approval step is Skipped (the total is not over 1000), the calls ran
    assert [s["name"] for s in view["steps"] if s["state"] == "Skipped"] == ["approval"]
    assert [s["result"] for s in view["steps"] if s["state"] != "Skipped"] == list(results.values())
    events = [b["event"] for _, b in _receive(bus, "order-status", oid, want=5)]
    assert events == ["received", "step-done", "step-done", "step-done", "processed"]
    assert _receive(bus, "scheduler", oid, wait=1) == []  # no schedule message on the way


def test_replayed_submission_resends_its_request_once(sb_runtime: tuple[Runtime, Bus]) -> None:
    """A client retry re-sends the in-flight request (in case the first submission died before
    its send); duplicate detection on the agent queue drops it (same message_id)."""
    rt, bus = sb_runtime
    key = {"Idempotency-Key": f"it-replay-{time.time_ns()}"}
    first = _post(rt, headers=key)
    assert first.status == 202
    oid = first.body["orderId"]
    again = _post(rt, headers=key)
    assert (again.status, again.body["orderId"]) == (200, oid)
    got = _receive(bus, "agent-inventory", oid, want=2, wait=2)
    assert [m.message_id for m, _ in got] == [f"{oid}:reserve-inventory:1"]  # the re-send was dropped


def test_rejection_compensates_and_alerts_over_service_bus(sb_runtime: tuple[Runtime, Bus]) -> None:
    rt, bus = sb_runtime
    oid = _post(rt, {**BODY, "statusQueue": "no-such-queue"}).body["orderId"]  # status sends fail: harmless
    [(req, rbody)] = _receive(bus, "agent-inventory", oid)
    _agent_reply(bus, req, rbody, result={"reservationId": "r-9"})
    [(_, rep)] = _receive(bus, "replies", oid)
    handle_reply(rt, json.dumps(rep).encode())
    [(req, rbody)] = _receive(bus, "agent-payment", oid)
    _agent_reply(bus, req, rbody, outcome="error", reason="card declined")
    [(_, rep)] = _receive(bus, "replies", oid)
    assert handle_reply(rt, json.dumps(rep).encode()) == "compensating"
    [(alert, abody)] = _receive(bus, "alerts", oid)
    assert abody["step"] == "charge-payment" and abody["reason"] == "card declined"
    [(comp, cbody)] = _receive(bus, "agent-inventory", oid)
    assert cbody["kind"] == "compensation" and cbody["operation"] == "release"
    assert cbody["context"] == {"reserve-inventory": {"reservationId": "r-9"}}
    assert comp.message_id == f"{oid}:reserve-inventory:compensate:1"
    _agent_reply(bus, comp, cbody, result={"released": "r-9"})
    [(_, rep)] = _receive(bus, "replies", oid)
    assert handle_reply(rt, json.dumps(rep).encode()) == "compensated"
    view = get_order(rt, oid).body
    assert (view["processState"], view["outcome"], view["compensation"]["state"]) == ("Error", "failed", "completed")


def test_lost_send_and_hung_agent_recovered_by_supervisor(sb_runtime: tuple[Runtime, Bus]) -> None:
    rt, bus = sb_runtime
    oid = _post(rt).body["orderId"]
    _receive(bus, "agent-inventory", oid)  # the agent hangs: never replies
    time.sleep(3.1)
    assert sweep(rt).acted == {"redriven": 1}
    view = get_order(rt, oid).body
    assert (view["processState"], view["failureCount"]) == ("Pending", 1)
    _receive(bus, "scheduler", oid)  # the redrive's schedule message is "lost" (consumed, never handled)
    time.sleep(1.1)
    assert sweep(rt).acted == {"rescheduled": 1}
    [(_, body)] = _receive(bus, "scheduler", oid)
    assert body["seq"] == 2
    assert handle_schedule(rt, json.dumps(body).encode()) == "claimed"
    assert handle_schedule(rt, json.dumps(body).encode()) == "resumed"  # redelivered: re-sends the request
    [(req, rbody)] = _receive(bus, "agent-inventory", oid, want=2, wait=2)  # the re-send was dropped
    assert rbody["attempt"] == 2 and req.message_id == f"{oid}:reserve-inventory:2"
    assert datetime.fromisoformat(rbody["completeBy"]) > datetime.now(UTC)
