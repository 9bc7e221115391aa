"""Outgoing messages: one description (``OutMessage``), a Service Bus sender, an in-memory twin.

Every message the app sends carries ``traceparent`` (a child of the order's trace) as an
application property, a deterministic ``message_id`` (so the queues' duplicate detection
drops re-sends after a crash/redelivery) and a JSON body (UTF-8, decimals as strings).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from shared.models import dumps


@dataclass(frozen=True)
class OutMessage:
    queue: str  # the queue's name (already resolved from its setting)
    body: dict[str, Any]
    message_id: str
    correlation_id: str | None = None
    reply_to: str | None = None
    subject: str | None = None
    time_to_live: timedelta | None = None
    scheduled_enqueue_time: datetime | None = None
    application_properties: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        return dumps(self.body).encode("utf-8")


class PoisonMessage(ValueError):
    """A message that can never be processed: not JSON, a wrong schema, an unknown order or step.

    Handlers raise it after logging the reason. The trigger then abandons the message, and the
    broker dead-letters it once MaxDeliveryCount is reached (reason MaxDeliveryCountExceeded),
    where it stays for inspection and replay and the dead-letter alert sees it. A poison
    message never changes state, and costs at most MaxDeliveryCount cheap invocations.
    """


class Bus(Protocol):
    def send(self, message: OutMessage) -> None: ...


class QueueNotFound(Exception):
    pass


class ServiceBusBus:
    """Sends through the worker's shared senders (``shared.clients``), one lock per sender.

    A queue that does not exist (e.g. an order's status queue nobody created) is remembered
    for ``missing_ttl`` seconds, so that every later status message does not pay for a
    failing link attach; the send raises ``QueueNotFound`` at once (callers treat status
    sends as best-effort)."""

    def __init__(self, sender_for: Callable[[str], Any], missing_ttl: float = 60.0) -> None:
        self._sender_for = sender_for  # queue -> clients.LockedSender
        self._missing: dict[str, float] = {}
        self._missing_ttl = missing_ttl

    def send(self, message: OutMessage) -> None:
        import time

        from azure.servicebus import ServiceBusMessage
        from azure.servicebus.exceptions import MessagingEntityNotFoundError

        until = self._missing.get(message.queue)
        if until is not None:
            if time.monotonic() < until:
                raise QueueNotFound(message.queue)
            self._missing.pop(message.queue, None)

        props: dict[str | bytes, Any] = {k: v for k, v in message.application_properties.items()}
        sb = ServiceBusMessage(
            message.encoded(),
            message_id=message.message_id,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            subject=message.subject,
            content_type="application/json",
            time_to_live=message.time_to_live,
            scheduled_enqueue_time_utc=message.scheduled_enqueue_time,
            application_properties=props or None,
        )
        try:
            self._sender_for(message.queue).send(sb)
        except MessagingEntityNotFoundError as exc:
            self._missing[message.queue] = time.monotonic() + self._missing_ttl
            raise QueueNotFound(message.queue) from exc


class MemoryBus:
    """Records sent messages per queue. ``fail`` makes sends to a queue raise (tests)."""

    def __init__(self, known_queues: set[str] | None = None) -> None:
        self._lock = threading.Lock()
        self.sent: dict[str, list[OutMessage]] = defaultdict(list)
        self.fail: set[str] = set()
        self.known_queues = known_queues

    def send(self, message: OutMessage) -> None:
        if message.queue in self.fail:
            raise ConnectionError(f"send to {message.queue} failed (injected)")
        if self.known_queues is not None and message.queue not in self.known_queues:
            raise QueueNotFound(message.queue)
        with self._lock:
            self.sent[message.queue].append(message)

    def take(self, queue: str) -> list[OutMessage]:
        with self._lock:
            out = self.sent.pop(queue, [])
        return out

    def peek(self, queue: str) -> list[OutMessage]:
        with self._lock:
            return list(self.sent.get(queue, []))

    def all(self) -> list[OutMessage]:
        with self._lock:
            return [m for msgs in self.sent.values() for m in msgs]
