"""Conversion of SDK messages to what the function receives, and of output values to SDK messages.

What the function receives is pinned against the Functions host: the trigger metadata the Service
Bus extension 5.x sends (ServiceBusTriggerBindingStrategy.AddBindingData; null values left out by
the host), decoded by the azure-functions library's own converter, as the Python worker does."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import azure.functions as func
import pytest
from azure.functions import meta
from azure.functions.servicebus import ServiceBusMessageInConverter
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage, ServiceBusReceiveMode
from azure.servicebus._pyamqp.message import Header, Message, Properties

from local.host.app import FunctionSpec
from local.host.messages import host_trigger_metadata, to_function_message, to_sdk_message, trigger_argument


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
    assert m.enqueued_time_utc == datetime(2026, 11, 22, 7, 0)  # naive UTC, as the worker gets it
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


ENQUEUED = datetime(2026, 11, 22, 7, 0, 0, 250000, tzinfo=UTC)
LOCK = uuid.UUID("6f1c2a9e-0d4b-4c55-9a57-4f1d3c2b1a00")


def rich(ttl_ms: int | None = None, absolute_expiry_ms: int | None = None) -> ServiceBusReceivedMessage:
    """A received message with every property the SDK can show, the broker-only ones included."""
    ms = int(ENQUEUED.timestamp() * 1000)
    msg = Message(
        data=[b"payload"],
        header=Header(delivery_count=1, ttl=ttl_ms),
        properties=Properties(message_id=b"m-1", correlation_id=b"c-1", reply_to=b"replies", to=b"dest",
                              content_type=b"text/plain", subject=b"subj", reply_to_group_id=b"rs-1",
                              group_id=b"s-1", absolute_expiry_time=absolute_expiry_ms),
        application_properties={b"traceparent": b"00-abc-def-01", b"DeadLetterReason": b"why",
                                b"DeadLetterErrorDescription": b"because"},
        message_annotations={b"x-opt-sequence-number": 42, b"x-opt-enqueued-time": ms,
                             b"x-opt-locked-until": ms + 30000, b"x-opt-message-state": 0,
                             b"x-opt-enqueue-sequence-number": 7, b"x-opt-scheduled-enqueue-time": ms - 1000,
                             b"x-opt-partition-key": b"s-1", b"x-opt-deadletter-source": b"orders"},
    )
    return ServiceBusReceivedMessage(msg, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, receiver=None, lock_token=LOCK)


def as_the_host_sends_it(expires_utc: str, expires: str) -> dict[str, meta.Datum]:
    """The host's trigger metadata for ``rich()``, typed as it writes it: strings, ints, and JSON
    for dates (``DateTimeOffset.DateTime``: no offset) and dictionaries."""
    props = json.dumps({"traceparent": "00-abc-def-01", "DeadLetterReason": "why",
                        "DeadLetterErrorDescription": "because"})
    return {
        "DeliveryCount": meta.Datum(2, "int"), "DeadLetterSource": meta.Datum("orders", "string"),
        "LockToken": meta.Datum(str(LOCK), "string"),
        "ExpiresAtUtc": meta.Datum(json.dumps(expires_utc), "json"),
        "ExpiresAt": meta.Datum(json.dumps(expires), "json"),
        "EnqueuedTimeUtc": meta.Datum('"2026-11-22T07:00:00.25"', "json"),
        "EnqueuedTime": meta.Datum('"2026-11-22T07:00:00.25+00:00"', "json"),
        "MessageId": meta.Datum("m-1", "string"), "ContentType": meta.Datum("text/plain", "string"),
        "ReplyTo": meta.Datum("replies", "string"), "SequenceNumber": meta.Datum(42, "int"),
        "To": meta.Datum("dest", "string"), "Subject": meta.Datum("subj", "string"),
        "Label": meta.Datum("subj", "string"), "CorrelationId": meta.Datum("c-1", "string"),
        "ApplicationProperties": meta.Datum(props, "json"), "UserProperties": meta.Datum(props, "json"),
        "SessionId": meta.Datum("s-1", "string"), "ReplyToSessionId": meta.Datum("rs-1", "string"),
        "PartitionKey": meta.Datum("s-1", "string"),
    }


FIELDS = ("application_properties", "content_type", "correlation_id", "dead_letter_error_description",
          "dead_letter_reason", "dead_letter_source", "delivery_count", "enqueued_sequence_number",
          "enqueued_time_utc", "expires_at_utc", "label", "locked_until", "lock_token", "message_id",
          "partition_key", "reply_to", "reply_to_session_id", "scheduled_enqueue_time_utc", "sequence_number",
          "session_id", "state", "subject", "time_to_live", "to", "transaction_partition_key", "user_properties")


def fields(m: func.ServiceBusMessage) -> dict:
    return {name: getattr(m, name) for name in FIELDS}


def test_the_function_gets_what_the_host_hands_the_worker() -> None:
    got = to_function_message(rich(ttl_ms=60_000))
    expected = ServiceBusMessageInConverter.decode(
        meta.Datum(b"payload", "bytes"),
        trigger_metadata=as_the_host_sends_it("2026-11-22T07:01:00.25", "2026-11-22T07:01:00.25+00:00"))
    assert fields(got) == fields(expected)
    assert got.get_body() == b"payload" and got.metadata == expected.metadata
    # naive UTC datetimes, as the worker parses the host's DateTime values
    assert got.enqueued_time_utc == datetime(2026, 11, 22, 7, 0, 0, 250000) and got.enqueued_time_utc.tzinfo is None
    assert got.expires_at_utc == datetime(2026, 11, 22, 7, 1, 0, 250000) and got.expires_at_utc.tzinfo is None
    # what the host never sends is None, although the SDK message has it
    for name in ("locked_until", "state", "time_to_live", "dead_letter_reason", "dead_letter_error_description",
                 "scheduled_enqueue_time_utc", "enqueued_sequence_number"):
        assert getattr(got, name) is None, name
    sdk = rich(ttl_ms=60_000)
    assert sdk.locked_until_utc and sdk.time_to_live and sdk.dead_letter_reason == "why"
    assert sdk.enqueued_sequence_number == 7 and sdk.scheduled_enqueue_time_utc is not None


def test_expiry_follows_the_hosts_sdk() -> None:
    """ExpiresAt: the absolute-expiry-time if the sender set one, else enqueued + TTL; no TTL: MaxValue."""
    no_ttl = to_function_message(rich())
    assert no_ttl.expires_at_utc == datetime(9999, 12, 31, 23, 59, 59, 999999)  # .NET's 7 digits, cut to 6
    assert host_trigger_metadata(rich())["ExpiresAtUtc"].value == '"9999-12-31T23:59:59.9999999"'
    absolute = int((ENQUEUED + timedelta(minutes=5)).timestamp() * 1000)
    assert to_function_message(rich(ttl_ms=60_000, absolute_expiry_ms=absolute)).expires_at_utc == \
        datetime(2026, 11, 22, 7, 5, 0, 250000)


def test_only_the_hosts_keys_are_sent() -> None:
    sent = set(host_trigger_metadata(rich(ttl_ms=1000)))
    assert sent == set(as_the_host_sends_it("", ""))
    for never in ("LockedUntil", "State", "TimeToLive", "DeadLetterReason", "DeadLetterErrorDescription",
                  "ScheduledEnqueueTimeUtc", "EnqueuedSequenceNumber"):
        assert never not in sent


def test_fast_date_parse_gives_the_librarys_result() -> None:
    """InConverter's fast path for the host's own date forms returns what the library's
    ``_parse_datetime`` does, type and zone included; other forms and bad dates go to the library."""
    from local.host.messages import DOTNET_MAX_DATETIME, InConverter

    values = [DOTNET_MAX_DATETIME, DOTNET_MAX_DATETIME + "+00:00", "2026-01-02T03:04:05", "2026-01-02T03:04:05+00:00",
              "2018-08-07T23:17:57.461050Z", "08/07/2018 23:17:57Z", "2026-01-02T03:04:05-00:00"]
    base = datetime(2024, 2, 29, 23, 59, 58, tzinfo=UTC)
    for i in range(300):
        dt = base + timedelta(microseconds=i * 7_654_321)
        for digits in range(1, 8):
            text = dt.strftime("%Y-%m-%dT%H:%M:%S") + "." + f"{dt.microsecond:06d}1"[:digits]
            values += [text, text + "+00:00"]
    for v in values:
        got, want = InConverter._parse_datetime(v), ServiceBusMessageInConverter._parse_datetime(v)
        assert (got, type(got), got.tzinfo) == (want, type(want), want.tzinfo), v
    for bad in ("2026-13-01T00:00:00", "2026-02-30T00:00:00+00:00", "2026-01-01T24:00:00"):
        with pytest.raises(ValueError):
            ServiceBusMessageInConverter._parse_datetime(bad)
        with pytest.raises(ValueError):
            InConverter._parse_datetime(bad)


def test_the_converter_is_not_registered_for_the_binding() -> None:
    from local.host.messages import InConverter

    assert meta._ConverterMeta.get("serviceBusTrigger") is ServiceBusMessageInConverter
    assert InConverter is not ServiceBusMessageInConverter
