"""Explicit settlement of the Service Bus triggers (agents, scheduler, replies).

The triggers use the Python worker's SDK-type binding (``azurefunctions-extensions-bindings-servicebus``):
the function gets the SDK's ``ServiceBusReceivedMessage`` and a ``ServiceBusMessageActions``, and
``autoCompleteMessages`` is false, so the host settles nothing itself. :func:`settle` is the one place
that settles, after the handler:

* it returns: **complete**;
* it raises :class:`~shared.core.messages.PoisonMessage`: **dead-letter at once**, with the poison's
  reason code as ``DeadLetterReason`` and its text as ``DeadLetterErrorDescription``
  (docs/reliability.md, "Poison messages"). No redelivery: the message never reaches a remote
  service again, and the dead-letter queue says why it is there;
* it raises anything else (a transient failure): **abandon**, and the exception goes on (the
  invocation is logged Failed). The broker redelivers the message, and dead-letters it once
  MaxDeliveryCount is reached (MaxDeliveryCountExceeded), as with auto-completion.

A settlement that fails (the lock was lost, the link dropped) leaves the message to its lock's
expiry: the broker delivers it again, and the handlers are idempotent. The ``received`` view reads
the SDK message (or the azure-functions ``ServiceBusMessage`` of the plain binding) the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from shared.core.messages import PoisonMessage

log = logging.getLogger("orders.settlement")

T = TypeVar("T")
# Service Bus keeps DeadLetterReason and DeadLetterErrorDescription as message properties (at
# most 4,096 characters each); a description is cut to this length, the reason is a short code.
MAX_DESCRIPTION = 1024


class MessageActions(Protocol):
    """What ``azurefunctions.extensions.bindings.servicebus.ServiceBusMessageActions`` offers (and tests fake)."""

    def complete(self, message: Any) -> None: ...

    def abandon(self, message: Any) -> None: ...

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None: ...


def settle(actions: MessageActions, message: Any, handle: Callable[[], T]) -> T | None:
    """Run ``handle`` and settle ``message`` by its outcome (module docstring). Returns what
    ``handle`` returned, or None for a dead-lettered message."""
    try:
        result = handle()
    except PoisonMessage as e:
        actions.deadletter(message, deadletter_reason=e.reason,
                           deadletter_error_description=str(e)[:MAX_DESCRIPTION])
        return None
    except Exception:
        try:
            actions.abandon(message)
        except Exception as e:  # noqa: BLE001 - the lock expires instead; the first error is the one to see
            log.warning("could not abandon message %s: %s: %s", getattr(message, "message_id", None),
                        type(e).__name__, e)
        raise
    actions.complete(message)
    return result


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
