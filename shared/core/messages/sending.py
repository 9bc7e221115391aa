"""A message to send (:class:`OutMessage`), the :class:`Bus` it is sent on, and a message that can
never be processed (:class:`PoisonMessage`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from shared.core.jsonio import dumps
from shared.core.messages.fields import Body


@dataclass(frozen=True)
class OutMessage:
    """A message to send: every message the app sends carries ``traceparent`` (a child of the
    order's trace) as an application property, a deterministic ``message_id`` (so the queues'
    duplicate detection drops re-sends after a crash or redelivery) and a JSON body (UTF-8,
    decimals as strings)."""

    queue: str  # the queue's name (already resolved from its setting)
    body: Body  # the JSON body, as a message model's ``to_body()`` makes it
    message_id: str
    correlation_id: str | None = None
    reply_to: str | None = None
    subject: str | None = None
    time_to_live: timedelta | None = None
    scheduled_enqueue_time: datetime | None = None
    application_properties: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        return dumps(self.body).encode("utf-8")


class Bus(Protocol):
    def send(self, message: OutMessage) -> None: ...


class PoisonMessage(ValueError):
    """A message that can never be processed: ``reason`` is a short code (docs/reliability.md), the text
    names the problem. The trigger dead-letters it at its first delivery with both (functions/settlement.py)."""

    def __init__(self, description: str, reason: str = "PoisonMessage") -> None:
        super().__init__(description)
        self.reason = reason
