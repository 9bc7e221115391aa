"""The agent end to end on the local Service Bus emulator and the remote services simulator.

A request goes to the agent's queue with the SDK, is received and handed to the adapter as the
Functions host hands it (azure.functions.ServiceBusMessage), and the reply is read back from
the replies queue. A redelivered request's reply is dropped by duplicate detection.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.functions.servicebus import ServiceBusMessage as FunctionMessage
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from functions.agents import process_message
from local.procs import Proc, free_port
from shared.agent import AgentRuntime, RetryPolicy, loads
from shared.core.workflows import AGENTS_BY_NAME
from shared.messaging import ServiceBusBus
from shared.observability.telemetry import trace_id
from shared.runtime.clients import LockedSender
from shared.settings import queue_names

pytestmark = pytest.mark.integration

QUEUES = queue_names()
TRACEPARENT = "00-11111111111111111111111111111111-2222222222222222-01"


@pytest.fixture(scope="module")
def remotes_url() -> Iterator[str]:
    port = free_port()
    proc = Proc("remotes", [sys.executable, "-m", "local.remotes", "--host", "127.0.0.1", "--port", str(port)])
    proc.start("ready", timeout=30)
    yield f"http://127.0.0.1:{port}"
    proc.stop()


@pytest.fixture
def client(servicebus: Any) -> Iterator[ServiceBusClient]:
    c = ServiceBusClient.from_connection_string(servicebus.connection_string)
    yield c
    c.close()


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def to_function_message(msg: Any) -> FunctionMessage:
    """What the Functions host hands the function for a received SDK message."""
    return FunctionMessage(
        body=b"".join(msg.body) if not isinstance(msg.body, bytes) else msg.body,
        message_id=msg.message_id, correlation_id=msg.correlation_id, reply_to=msg.reply_to,
        application_properties={_text(k): _text(v) for k, v in (msg.application_properties or {}).items()},
        user_properties={}, delivery_count=msg.delivery_count, content_type=msg.content_type,
    )


def test_request_in_reply_out_and_duplicate_reply_dropped(client: ServiceBusClient, remotes_url: str) -> None:
    oid = f"o-{uuid.uuid4().hex[:8]}"
    mid = f"{oid}:reserve-inventory:1"
    complete_by = datetime.now(UTC) + timedelta(seconds=20)
    body = {
        "kind": "step", "orderId": oid, "step": "reserve-inventory", "operation": "reserve", "attempt": 1,
        "idempotencyKey": f"{oid}:reserve-inventory", "completeBy": complete_by.isoformat(),
        "order": {"customerId": "c-1", "currency": "EUR", "total": "19.98",
                  "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}]},
        "context": {},
    }
    with client.get_queue_sender(QUEUES["InventoryQueue"]) as s:
        s.send_messages(ServiceBusMessage(
            json.dumps(body), message_id=mid, correlation_id=mid, reply_to=QUEUES["RepliesQueue"],
            time_to_live=complete_by - datetime.now(UTC), application_properties={"traceparent": TRACEPARENT}))
    with client.get_queue_receiver(QUEUES["InventoryQueue"], max_wait_time=10) as r:
        [received] = r.receive_messages(max_message_count=1, max_wait_time=10)
        fmsg = to_function_message(received)
        r.complete_message(received)

    senders: dict[str, LockedSender] = {}  # the app's sender per queue (shared.runtime.clients), as in the worker
    bus = ServiceBusBus(lambda q: senders.setdefault(q, LockedSender(client, q)))
    runtime = AgentRuntime("inventory", f"{remotes_url}/inventory", bus,
                           policy=RetryPolicy(initial_backoff=0.05, max_backoff=0.2))
    try:
        result = process_message(AGENTS_BY_NAME["inventory"], fmsg, runtime)
        assert result is not None and result.outcome == "success"
        again = process_message(AGENTS_BY_NAME["inventory"], fmsg, runtime)  # a redelivery
        assert again is not None and again.reply == result.reply
    finally:
        for s in senders.values():
            s.close()

    replies = []
    with client.get_queue_receiver(QUEUES["RepliesQueue"]) as r:
        for wait in (10, 1, 1):  # the reply, then room for a (wrongly) undeduplicated second one
            for m in r.receive_messages(max_message_count=1, max_wait_time=wait):
                r.complete_message(m)
                if m.correlation_id == mid:
                    replies.append(m)
    assert len(replies) == 1, "the second reply has the same message_id: duplicate detection drops it"
    [reply] = replies
    assert reply.message_id == f"reply:{mid}"
    props = {_text(k): _text(v) for k, v in reply.application_properties.items()}
    assert trace_id(props["traceparent"]) == trace_id(TRACEPARENT)
    payload = loads(b"".join(reply.body))
    assert payload == {"kind": "step", "orderId": oid, "step": "reserve-inventory", "attempt": 1,
                       "outcome": "success", "result": result.reply.result, "reason": None}
