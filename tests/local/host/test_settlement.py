"""SDK-type Service Bus bindings in the local host (local/host/settlement.py): the binding data the
extension decodes, the indexing of the trigger and settlement parameters, the gRPC Settlement
service, and (against the emulator) explicit settlement with autoCompleteMessages false."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import azurefunctions.extensions.bindings.servicebus as servicebus
import pytest
import uamqp
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus import ServiceBusReceivedMessage as SdkMessage
from uamqp.message import MessageHeader, MessageProperties

from local.host import settlement
from local.host.app import index_functions, load_app
from local.procs import free_port
from tests.conftest import Endpoint, start_servicebus

from .conftest import SAMPLE_APP, SAMPLE_QUEUES, Host, start_host, wait_for


def sdk_message(delivery_count: int = 0, body: bytes = b'{"a": 1}') -> tuple[Any, uuid.UUID]:
    """An SDK received message as the Python SDK gives it (prior deliveries in the header)."""
    token = uuid.uuid4()
    header = MessageHeader()
    header.delivery_count = delivery_count
    raw = uamqp.Message(body=body, header=header,
                        properties=MessageProperties(message_id=b"m-1", reply_to=b"replies", correlation_id=b"c-1",
                                                     content_type=b"application/json"),
                        application_properties={b"traceparent": b"00-abc", b"n": 7},
                        annotations={b"x-opt-sequence-number": 42, b"x-opt-enqueued-time": 1_700_000_000_000})
    raw.delivery_annotations = {b"x-opt-lock-token": token}
    return SdkMessage(raw, receiver=None), token


def test_the_binding_data_is_what_the_extension_decodes() -> None:
    msg, token = sdk_message(delivery_count=0)
    data = settlement.model_binding_data(msg, delivery_count=1)
    assert (data.version, data.source, data.content_type) == ("1.0", "AzureServiceBusReceivedMessage",
                                                               "application/octet-stream")
    assert data.content.startswith(token.bytes_le + b"x-opt-lock-token")
    got = settlement.trigger_value("serviceBusTrigger", data, servicebus.ServiceBusReceivedMessage, {})
    assert isinstance(got, SdkMessage)
    assert str(got.lock_token) == str(token)
    assert got.delivery_count == 1  # counted as the host's SDK counts it: 1 on the first delivery
    assert (got.message_id, got.reply_to, got.correlation_id, got.content_type) == ("m-1", "replies", "c-1",
                                                                                     "application/json")
    assert b"".join(got.body) == b'{"a": 1}'
    assert got.application_properties == {b"traceparent": b"00-abc", b"n": 7}
    assert got.sequence_number == 42 and got.enqueued_time_utc is not None


def test_the_sample_apps_sdk_type_function_is_indexed_with_its_settlement_parameter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # load_app imports the sample's function_app.py as ``function_app`` (and puts its folder on
    # sys.path), as a worker does: undone after the test, or later tests' ``import function_app``
    # would get the sample instead of the app (tests/indexed.py).
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    app, _ = load_app(SAMPLE_APP)
    specs, errors = index_functions(app, {"SettleQueue": "q", "SettleAutoQueue": "qa", "InQueue": "i", "OutQueue": "o",
                                          "PoisonQueue": "p", "SlowQueue": "s", "SessionQueue": "x",
                                          "TimerSchedule": "0 0 0 1 1 *", "Greeting": "g"})
    assert errors == []
    by_name = {s.name: s for s in specs}
    spec = by_name["settles_itself"]
    assert spec.sdk_type and spec.settlement_param == "message_actions"
    assert spec.trigger["autoCompleteMessages"] is False
    auto = by_name["settles_poison_only"]
    assert auto.sdk_type and auto.settlement_param == "message_actions" and auto.trigger["autoCompleteMessages"] is True
    assert not by_name["on_message"].sdk_type and by_name["on_message"].settlement_param is None


def test_an_unbound_parameter_that_is_no_settlement_client_is_an_error() -> None:
    assert settlement.settlement_param(["extra"], {"extra": int}) is None
    assert settlement.settlement_param(["a", "b"], {"a": servicebus.ServiceBusMessageActions}) is None
    assert settlement.settlement_param(["a"], {"a": servicebus.ServiceBusMessageActions}) == "a"


@pytest.fixture
def server() -> Iterator[tuple[settlement.SettlementServer, list[tuple[str, str, dict[str, Any]]], int]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    calls: list[tuple[str, str, dict[str, Any]]] = []

    async def settle(action: str, token: str, kw: dict[str, Any]) -> None:
        if token == "unknown":
            raise settlement.UnknownLockToken(token)
        if token == "lost":
            raise RuntimeError("lock lost")
        calls.append((action, token, kw))

    port = free_port()
    srv = settlement.SettlementServer(loop, settle, "127.0.0.1", port)
    srv.start()
    yield srv, calls, port
    srv.stop()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


class Locked:
    def __init__(self, token: str) -> None:
        self.lock_token = token


def test_the_settlement_service_takes_the_extensions_calls(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _srv, calls, port = server
    # the worker's argv, as the host starts it: the client reads the endpoint from there
    monkeypatch.setattr(sys, "argv", ["worker", "--host", "127.0.0.1", "--port", str(port),
                                      "--functions-grpc-max-message-length", "2147483647"])
    monkeypatch.setattr(servicebus.ServiceBusMessageActions, "_instance", None)
    actions = settlement.settlement_client()
    assert isinstance(actions, servicebus.ServiceBusMessageActions)
    actions.complete(Locked("t-1"))
    actions.abandon(Locked("t-2"))
    actions.deadletter(Locked("t-3"), deadletter_reason="UnknownOrder", deadletter_error_description="no order x")
    actions.deadletter(Locked("t-4"))
    actions.renew_message_lock(Locked("t-5"))
    assert calls == [("complete", "t-1", {}), ("abandon", "t-2", {}),
                     ("deadletter", "t-3", {"reason": "UnknownOrder", "error_description": "no order x"}),
                     ("deadletter", "t-4", {"reason": None, "error_description": None}), ("renew", "t-5", {})]
    with pytest.raises(Exception, match="NOT_FOUND|no message|unknown"):
        actions.complete(Locked("unknown"))
    with pytest.raises(Exception, match="lock lost"):
        actions.complete(Locked("lost"))
    with pytest.raises(Exception, match="UNIMPLEMENTED|Method not implemented"):
        actions.release_session("s-1")


# ----------------------------------------------------------------------------- against the emulator


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    ep = start_servicebus(tmp_path_factory.mktemp("sb-settle"), config=SAMPLE_QUEUES)
    yield ep
    ep.proc.stop()


@pytest.fixture(scope="module")
def host(sb: Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    h = start_host(tmp_path_factory.mktemp("host-settle"), values={"ServiceBusConnection": sb.connection_string})
    yield h
    h.proc.stop()


def _send(sb: Endpoint, mid: str, todo: dict[str, Any], queue: str = "sample-settle") -> None:
    from azure.servicebus import ServiceBusClient

    with ServiceBusClient.from_connection_string(sb.connection_string) as c, c.get_queue_sender(queue) as s:
        s.send_messages(ServiceBusMessage(json.dumps(todo), message_id=mid, reply_to="replies",
                                          application_properties={"traceparent": "00-abc"}))


def _dead_letters(sb: Endpoint, queue: str = "sample-settle") -> dict[str, Any]:
    from azure.servicebus import ServiceBusClient

    out = {}
    with ServiceBusClient.from_connection_string(sb.connection_string) as c, \
            c.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as r:
        for m in r.receive_messages(max_message_count=50, max_wait_time=2):
            out[m.message_id] = m
            r.complete_message(m)
    return out


def _active(sb: Endpoint, queue: str = "sample-settle") -> list[str]:
    from azure.servicebus import ServiceBusClient

    with ServiceBusClient.from_connection_string(sb.connection_string) as c, c.get_queue_receiver(queue) as r:
        return [m.message_id for m in r.peek_messages(max_message_count=50)]


def _deliveries(host: Host, mid: str) -> list[dict[str, Any]]:
    return [r for r in host.read("settle") if r["message_id"] == mid]


@pytest.mark.integration
def test_complete_deadletter_and_abandon_through_the_settlement_client(sb: Endpoint, host: Host) -> None:
    run = uuid.uuid4().hex[:8]
    done, dead, again = f"c-{run}", f"d-{run}", f"a-{run}"
    _send(sb, done, {"do": "complete"})
    _send(sb, dead, {"do": "deadletter", "reason": "InvalidJson", "description": "body is not JSON"})
    _send(sb, again, {"do": "abandon", "then": "complete"})
    wait_for(lambda: len(_deliveries(host, again)) >= 2 and _deliveries(host, done) and _deliveries(host, dead),
             20, what="the deliveries")
    [first] = _deliveries(host, done)
    assert first["type"] == "azure.servicebus._common.message.ServiceBusReceivedMessage"
    assert first["delivery_count"] == 1 and first["reply_to"] == "replies"
    assert first["props"] == {"traceparent": "00-abc"}
    uuid.UUID(first["lock_token"])
    assert [d["delivery_count"] for d in _deliveries(host, again)] == [1, 2]  # abandoned, delivered again
    dl = wait_for(lambda: _dead_letters(sb).get(dead), 10, what="the dead letter")
    assert (dl.dead_letter_reason, dl.dead_letter_error_description) == ("InvalidJson", "body is not JSON")
    assert dl.delivery_count == 0  # the AMQP header's prior deliveries: dead-lettered at its first
    wait_for(lambda: not {done, dead, again} & set(_active(sb)), 10, what="every message settled")


@pytest.mark.integration
def test_a_message_its_function_does_not_settle_is_delivered_again_after_its_lock(sb: Endpoint, host: Host) -> None:
    """autoCompleteMessages false: a return does not settle it (the host honours the binding's
    setting); the lock (5 s) expires and the broker delivers it again. An exception is another
    matter: the .NET processor abandons an unsettled message whatever autoCompleteMessages says
    (ReceiverManager.ProcessOneMessage's catch; docs/local-stack.md), so it comes again at once."""
    run = uuid.uuid4().hex[:8]
    left, failed = f"n-{run}", f"r-{run}"
    _send(sb, left, {"do": "none", "then": "complete"})
    _send(sb, failed, {"do": "raise", "then": "complete"})
    wait_for(lambda: len(_deliveries(host, left)) >= 2 and len(_deliveries(host, failed)) >= 2, 30,
             what="the second deliveries")
    # (each message's own gap: the first delivery of one may come before the other is even sent)
    for mid, at_once in ((left, False), (failed, True)):
        first, second = _deliveries(host, mid)[:2]
        assert (first["delivery_count"], second["delivery_count"]) == (1, 2)
        assert (second["at"] - first["at"] < 4) == at_once, mid


@pytest.mark.integration
def test_a_second_settlement_of_one_message_fails(sb: Endpoint, host: Host) -> None:
    mid = f"t-{uuid.uuid4().hex[:8]}"
    _send(sb, mid, {"do": "twice"})
    [err] = wait_for(lambda: [r for r in host.read("settle-error") if r["message_id"] == mid], 20, what="the error")
    assert err["error"] == "SettlementError"
    assert len(_deliveries(host, mid)) == 1


@pytest.mark.integration
def test_with_auto_complete_the_host_settles_what_its_function_left(sb: Endpoint, host: Host) -> None:
    """autoCompleteMessages true (the app's triggers): a return is completed, an exception abandoned
    (delivered again at once, not after the 5 s lock), and a message the function dead-lettered itself
    is left alone: no second settlement, no warning."""
    run, queue = uuid.uuid4().hex[:8], "sample-settle-auto"
    done, dead, again, dead_raised = f"ac-{run}", f"ad-{run}", f"ar-{run}", f"adr-{run}"
    _send(sb, done, {"do": "return"}, queue)
    _send(sb, dead, {"do": "deadletter", "reason": "SchemaViolation", "description": "no orderId"}, queue)
    _send(sb, again, {"do": "raise", "then": "return"}, queue)
    # dead-lettered, then the function raises: the processor's catch skips a settled message (no abandon)
    _send(sb, dead_raised, {"do": "deadletter-then-raise", "reason": "Poison", "description": "then raised"}, queue)

    def deliveries(mid: str) -> list[dict[str, Any]]:
        return [r for r in host.read("settle-auto") if r["message_id"] == mid]

    wait_for(lambda: len(deliveries(again)) >= 2 and deliveries(done) and deliveries(dead), 20, what="the deliveries")
    first, second = deliveries(again)[:2]
    assert (first["delivery_count"], second["delivery_count"]) == (1, 2)
    assert second["at"] - first["at"] < 4  # abandoned by the host, not left to its lock
    taken: dict[str, Any] = {}  # _dead_letters takes every dead letter there: keep each it took

    def dead_letter(mid: str) -> Any:
        taken.update(_dead_letters(sb, queue))
        return taken.get(mid)

    dl = wait_for(lambda: dead_letter(dead), 10, what="the dead letter")
    assert (dl.dead_letter_reason, dl.dead_letter_error_description) == ("SchemaViolation", "no orderId")
    dl = wait_for(lambda: dead_letter(dead_raised), 10, what="the raised dead letter")
    assert (dl.dead_letter_reason, dl.dead_letter_error_description) == ("Poison", "then raised")
    wait_for(lambda: not {done, dead, again, dead_raised} & set(_active(sb, queue)), 10, what="every message settled")
    time.sleep(6)  # past the lock: a message the host failed to settle would be delivered again
    assert [len(deliveries(m)) for m in (done, dead, dead_raised)] == [1, 1, 1]
    assert len(deliveries(again)) == 2
    log = host.proc.log_path.read_text() if host.proc.log_path else ""
    assert not [line for line in log.splitlines() if "could not" in line and run in line]
