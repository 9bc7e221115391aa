"""The bus the app sends on (``shared.core.messages.Bus``): Service Bus, and an in-memory twin."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from shared.core.messages import OutMessage


class QueueNotFound(Exception):
    pass


class ServiceBusBus:
    """Sends through the worker's shared senders (``shared.runtime.clients``), one lock per sender.

    A queue that does not exist (e.g. an order's status queue nobody created) is remembered
    for ``missing_ttl`` seconds, so that every later status message does not pay for a
    failing link attach; the send raises ``QueueNotFound`` at once (callers treat status
    sends as best-effort)."""

    def __init__(self, sender_for: Callable[[str], Any], missing_ttl: float = 60.0) -> None:
        self._sender_for = sender_for  # queue -> shared.runtime.clients.LockedSender
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

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: dict[str, list[OutMessage]] = defaultdict(list)
        self.fail: set[str] = set()

    def send(self, message: OutMessage) -> None:
        if message.queue in self.fail:
            raise ConnectionError(f"send to {message.queue} failed (injected)")
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
