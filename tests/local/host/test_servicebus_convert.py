"""Conversion of SDK messages to what the function receives, and of output values to SDK messages."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import azure.functions as func
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage, ServiceBusReceiveMode
from azure.servicebus._pyamqp.message import Header, Message, Properties

from local.host.app import FunctionSpec
from local.host.servicebus import to_function_message, to_sdk_message, trigger_argument


def received(delivery_count: int = 0) -> ServiceBusReceivedMessage:
    enq_ms = int(datetime(2026, 11, 22, 7, 0, tzinfo=UTC).timestamp() * 1000)
    msg = Message(
        data=[b'{"a": 1}'],
        header=Header(delivery_count=delivery_count),
        properties=Properties(message_id=b"mid-1", correlation_id=b"corr-1", reply_to=b"replies",
                              content_type=b"application/json", subject=b"subj"),
        application_properties={b"traceparent": b"00-abc-def-01", b"n": 7},
        message_annotations={b"x-opt-sequence-number": 42, b"x-opt-enqueued-time": enq_ms},
    )
    return ServiceBusReceivedMessage(msg, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, receiver=None,
                                     lock_token=uuid.UUID(int=1))


def test_to_function_message():
    m = to_function_message(received(delivery_count=0))
    assert isinstance(m, func.ServiceBusMessage)
    assert m.get_body() == b'{"a": 1}'
    assert (m.message_id, m.correlation_id, m.reply_to, m.content_type) == ("mid-1", "corr-1", "replies",
                                                                             "application/json")
    assert m.delivery_count == 1  # the host reports the first delivery as 1
    assert m.sequence_number == 42 and m.label == "subj"
    assert m.enqueued_time_utc == datetime(2026, 11, 22, 7, 0, tzinfo=UTC)
    assert m.application_properties == {"traceparent": "00-abc-def-01", "n": 7}
    assert m.metadata["MessageId"] == "mid-1" and m.metadata["DeliveryCount"] == 1
    assert m.metadata["ApplicationProperties"] == {"traceparent": "00-abc-def-01", "n": 7}
    assert to_function_message(received(delivery_count=2)).delivery_count == 3


def test_trigger_argument_follows_annotation():
    def spec(ann):
        return FunctionSpec("f", lambda msg: None, False, {"type": "serviceBusTrigger", "name": "msg"},
                            trigger_annotation=ann)
    assert trigger_argument(spec(str), received()) == '{"a": 1}'
    assert trigger_argument(spec(bytes), received()) == b'{"a": 1}'
    assert isinstance(trigger_argument(spec(func.ServiceBusMessage), received()), func.ServiceBusMessage)


def test_to_sdk_message():
    assert str(to_sdk_message("text")) == "text"
    assert b"".join(to_sdk_message(b"\x00\x01").body) == b"\x00\x01"
    m = to_sdk_message({"k": [1, 2]})
    assert json.loads(str(m)) == {"k": [1, 2]} and m.content_type == "application/json"
    original = ServiceBusMessage("x", message_id="keep")
    assert to_sdk_message(original) is original
