"""Service Bus messages between the SDK and the function, as the Functions host converts them.

Received: the host sends the worker the message's binding data as trigger metadata (the
Service Bus extension 5.x's ``ServiceBusTriggerBindingStrategy``), and the worker decodes it
with the azure-functions library's ``ServiceBusMessageInConverter``. This module builds the
same metadata and decodes it with that same converter, so a function receives what it would
in Azure: naive UTC datetimes for ``enqueued_time_utc`` / ``expires_at_utc`` and ``None`` for
what the host never sends. Sent: an output binding's value becomes an SDK message.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import azure.functions as func
from azure.functions import meta
from azure.functions.servicebus import ServiceBusMessage as FunctionServiceBusMessage
from azure.functions.servicebus import ServiceBusMessageInConverter
from azure.servicebus import ServiceBusMessage

from .app import FunctionSpec
from .settlement import model_binding_data, trigger_value


def _text(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v


def message_body(msg: Any) -> bytes:
    body = msg.body
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        parts = list(body)
    except TypeError:
        return json.dumps(body, default=str).encode("utf-8")
    if all(isinstance(p, (bytes, bytearray)) for p in parts):
        return b"".join(parts)
    return json.dumps(parts, default=str).encode("utf-8")


def function_delivery_count(msg: Any) -> int | None:
    """Delivery count as the Functions host reports it: 1 on the first delivery.

    On the wire the AMQP header's delivery-count is the number of PRIOR attempts (0 the first
    time); the Python SDK passes it through unchanged, while the .NET SDK the host uses adds one.
    """
    dc = msg.delivery_count
    return None if dc is None else int(dc) + 1


# DateTimeOffset.MaxValue.DateTime as the host writes it: the ExpiresAt of a message with no time-to-live
DOTNET_MAX_DATETIME = "9999-12-31T23:59:59.9999999"
_MAX_UTC = datetime.max.replace(tzinfo=UTC)


def _datum(value: Any, kind: str) -> meta.Datum | None:
    return None if value is None else meta.Datum(value, kind)


def _host_datetimes(value: datetime | str | None) -> tuple[meta.Datum | None, meta.Datum | None]:
    """A .NET date as the host sends it, JSON, in its two keys: ``...Utc`` carries
    ``DateTimeOffset.DateTime`` (UTC clock time, no offset: the worker makes it a naive datetime),
    the other the offset. The text is formatted once for both."""
    if value is None:
        return None, None
    if isinstance(value, str):
        text = value
    else:  # as Json.NET writes it: seven fraction digits, trailing zeros dropped
        utc = value.astimezone(UTC)
        fraction = f"{utc.microsecond:06d}0".rstrip("0")
        text = utc.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "")
    return meta.Datum(f'"{text}"', "json"), meta.Datum(f'"{text}+00:00"', "json")


def host_expires_at(msg: Any) -> datetime | str | None:
    """``ExpiresAt`` as the host's .NET SDK computes it: the message's absolute-expiry-time if set,
    else enqueued time + time-to-live; with no time-to-live, ``DateTimeOffset.MaxValue``."""
    properties = getattr(msg.raw_amqp_message, "properties", None)
    absolute = getattr(properties, "absolute_expiry_time", None)
    if absolute:
        try:
            return datetime.fromtimestamp(absolute / 1000, UTC)
        except (OverflowError, OSError, ValueError):  # past year 9999: .NET's MaxValue
            return DOTNET_MAX_DATETIME
    enqueued, ttl = msg.enqueued_time_utc, msg.time_to_live
    if enqueued is None:
        return None
    if ttl is None or ttl >= _MAX_UTC - enqueued:
        return DOTNET_MAX_DATETIME
    return enqueued + ttl


def host_trigger_metadata(msg: Any) -> dict[str, meta.Datum]:
    """The trigger metadata the Functions host sends the worker for one message: the binding data
    of the Service Bus extension 5.x (``ServiceBusTriggerBindingStrategy.AddBindingData``), null
    values left out as the host leaves them out. It never sends LockedUntil, State, TimeToLive,
    DeadLetterReason, DeadLetterErrorDescription, ScheduledEnqueueTimeUtc nor EnqueuedSequenceNumber."""
    props = json.dumps({_text(k): _text(v) for k, v in (msg.application_properties or {}).items()}, default=str)
    lock_token = getattr(msg, "lock_token", None)
    annotations = msg.raw_amqp_message.annotations or {}
    # each SDK property read once (every read re-checks the AMQP sections), each date formatted once
    expires_utc, expires_at = _host_datetimes(host_expires_at(msg))
    enqueued_utc, enqueued_at = _host_datetimes(msg.enqueued_time_utc)
    subject = _datum(msg.subject, "string")
    data = {
        "DeliveryCount": _datum(function_delivery_count(msg), "int"),
        "DeadLetterSource": _datum(msg.dead_letter_source, "string"),
        "LockToken": _datum(str(lock_token) if lock_token else None, "string"),
        "ExpiresAtUtc": expires_utc,
        "ExpiresAt": expires_at,
        "EnqueuedTimeUtc": enqueued_utc,
        "EnqueuedTime": enqueued_at,
        "MessageId": _datum(msg.message_id, "string"),
        "ContentType": _datum(msg.content_type, "string"),
        "ReplyTo": _datum(msg.reply_to, "string"),
        "SequenceNumber": _datum(msg.sequence_number, "int"),
        "To": _datum(msg.to, "string"),
        "Subject": subject,
        "Label": subject,
        "CorrelationId": _datum(msg.correlation_id, "string"),
        "ApplicationProperties": meta.Datum(props, "json"),
        "UserProperties": meta.Datum(props, "json"),
        "SessionId": _datum(msg.session_id, "string"),
        "ReplyToSessionId": _datum(msg.reply_to_session_id, "string"),
        "PartitionKey": _datum(msg.partition_key, "string"),
        "TransactionPartitionKey": _datum(_text(annotations.get(b"x-opt-via-partition-key")), "string"),
    }
    return {name: datum for name, datum in data.items() if datum is not None}


# The dates this host writes (_host_datetimes): Json.NET's, with or without the "+00:00" offset
_HOST_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?(\+00:00)?")


class InConverter(ServiceBusMessageInConverter, binding=None):  # binding=None: not registered
    """The library's converter, with a fast path for the dates this host writes: the library tries
    up to 16 ``strptime`` formats one after the other (each miss a raised ValueError), four dates a
    message, which was a fifth of the instance's event loop CPU. Same result as the library's
    ``_parse_datetime`` (a tested property): UTC-aware with the offset, naive without, a seventh
    fraction digit dropped; anything else goes to the library."""

    @classmethod
    def _parse_datetime(cls, datetime_str: str | None) -> datetime | None:
        m = _HOST_DATE.fullmatch(datetime_str) if datetime_str else None
        if m is None:
            return super()._parse_datetime(datetime_str)
        y, mo, d, h, mi, sec, fraction, offset = m.groups()
        try:
            return datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec),
                            int((fraction or "")[:6].ljust(6, "0")), tzinfo=UTC if offset else None)
        except ValueError:  # out of range: the library's error
            return super()._parse_datetime(datetime_str)


def to_function_message(msg: Any) -> FunctionServiceBusMessage:
    """The SDK's received message as the worker hands it to the function: the host's trigger
    metadata, decoded by the azure-functions library's own converter, as the worker does."""
    decoded = InConverter.decode(meta.Datum(message_body(msg), "bytes"), trigger_metadata=host_trigger_metadata(msg))
    assert isinstance(decoded, FunctionServiceBusMessage)
    return decoded


def trigger_argument(spec: FunctionSpec, msg: Any) -> Any:
    """Convert by the parameter's annotation: an SDK type (``model_binding_data``, decoded by the
    extension: ``local.host.settlement``), ServiceBusMessage (default), str or bytes."""
    ann = spec.trigger_annotation
    if spec.sdk_type:
        data = model_binding_data(msg, function_delivery_count(msg))
        return trigger_value(spec.trigger_type, data, ann, host_trigger_metadata(msg))
    if ann is str or ann == "str":
        return message_body(msg).decode("utf-8")
    if ann is bytes or ann == "bytes":
        return message_body(msg)
    return to_function_message(msg)


def traceparent_of(msg: Any) -> str | None:
    """The W3C trace parent the sender put in the message's properties (or its Diagnostic-Id)."""
    props = msg.application_properties or {}
    for key in (b"traceparent", "traceparent", b"Diagnostic-Id", "Diagnostic-Id"):
        if key in props:
            return str(_text(props[key]))
    return None


def to_sdk_message(value: Any) -> ServiceBusMessage:
    """An output binding's value as SDK messages: str, bytes, JSON-able values, SDK messages."""
    if isinstance(value, ServiceBusMessage):
        return value
    if isinstance(value, (str, bytes, bytearray)):
        return ServiceBusMessage(bytes(value) if not isinstance(value, str) else value)
    if isinstance(value, func.ServiceBusMessage):
        return ServiceBusMessage(value.get_body(), correlation_id=value.correlation_id,
                                 content_type=value.content_type, message_id=value.message_id)
    return ServiceBusMessage(json.dumps(value), content_type="application/json")
