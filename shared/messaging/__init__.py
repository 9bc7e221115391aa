"""Messaging: the Service Bus the roles send on (``bus``: ``ServiceBusBus``, and ``MemoryBus`` for
tests). What a message is (``OutMessage``) and its bodies are the core's (``shared.core.messages``)."""

from shared.messaging.bus import MemoryBus, QueueNotFound, ServiceBusBus

__all__ = ["MemoryBus", "QueueNotFound", "ServiceBusBus"]
