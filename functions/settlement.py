"""Settlement of the Service Bus triggers (agents, scheduler, replies).

The triggers use the Python worker's SDK-type binding (``azurefunctions-extensions-bindings-servicebus``):
the function gets the SDK's ``ServiceBusReceivedMessage`` and a ``ServiceBusMessageActions``, and
``autoCompleteMessages`` is true. The host settles every message the function leaves unsettled,
after the handler:

* it returns: the host **completes** it;
* it raises :class:`~shared.core.messages.PoisonMessage`: :func:`settle` **dead-letters it at once**,
  with the poison's reason code as ``DeadLetterReason`` and its text as ``DeadLetterErrorDescription``
  (docs/reliability.md, "Poison messages"), and returns. No redelivery: the message never reaches a
  remote service again, and the dead-letter queue says why it is there. The host sees the message
  settled and leaves it (the .NET processor completes only ``!message.IsSettled``);
* it raises anything else (a transient failure): the exception goes on (the invocation is logged
  Failed) and the host **abandons** it. The broker redelivers the message, and dead-letters it once
  MaxDeliveryCount is reached (MaxDeliveryCountExceeded).

Why the host completes, not the function: an explicit complete is a gRPC call from the worker to
the host that waits for the broker's answer inside the invocation, on every message (6 an order);
only a poison message needs what the host cannot do (a reason). A dead-letter that fails (the lock
was lost, the link dropped) raises: the host abandons (the local host counts the message settled
and leaves it to its lock's expiry), and the next delivery is dead-lettered as poison again. The
``received`` view reads the SDK message (or the azure-functions ``ServiceBusMessage`` of the plain
binding) the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from shared.core.messages import PoisonMessage

T = TypeVar("T")
# Service Bus keeps DeadLetterReason and DeadLetterErrorDescription as message properties (at
# most 4,096 characters each); a description is cut to this length, the reason is a short code.
MAX_DESCRIPTION = 1024


class MessageActions(Protocol):
    """What ``settle`` uses of ``azurefunctions.extensions.bindings.servicebus.ServiceBusMessageActions``
    (and tests fake)."""

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None: ...


def settle(actions: MessageActions, message: Any, handle: Callable[[], T]) -> T | None:
    """Run ``handle``; dead-letter ``message`` if it is poison, else leave it to the host
    (module docstring). Returns what ``handle`` returned, or None for a dead-lettered message."""
    try:
        return handle()
    except PoisonMessage as e:
        actions.deadletter(message, deadletter_reason=e.reason,
                           deadletter_error_description=str(e)[:MAX_DESCRIPTION])
        return None


@dataclass(frozen=True)
class Received:
    """A received message as the handlers read it."""

    body: bytes
    message_id: str | None
    reply_to: str | None
    application_properties: dict[str, Any]
    delivery_count: int | None  # 1 on the first delivery

    @property
    def traceparent(self) -> str | None:
        value = self.application_properties.get("traceparent")
        return value if isinstance(value, str) else None


def received(msg: Any) -> Received:
    """The SDK's ``ServiceBusReceivedMessage`` (its body a data section, keys and values maybe
    bytes), or the azure-functions ``ServiceBusMessage``, as :class:`Received`."""
    if hasattr(msg, "get_body"):  # azure.functions.ServiceBusMessage
        body = msg.get_body()
    else:
        raw = msg.body
        body = bytes(raw) if isinstance(raw, (bytes, bytearray)) else (
            raw.encode() if isinstance(raw, str) else b"".join(bytes(part) for part in raw))
    return Received(body=body, message_id=_text(msg.message_id), reply_to=_text(msg.reply_to),
                    application_properties=_properties(msg.application_properties),
                    delivery_count=getattr(msg, "delivery_count", None))


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def _properties(props: Mapping[Any, Any] | None) -> dict[str, Any]:
    return {_text(k): _text(v) for k, v in (props or {}).items()}
