"""What the impure drivers (scheduler, supervisor, submission) run against.

A ``Runtime`` bundles the store, the bus, the configuration, the token keys (``TokenKeys``: the
MAC of continuation and fencing tokens), the clock and this instance's id. In the Functions
worker, ``get_runtime()`` builds it once from the app settings and the shared SDK clients; tests
build one from ``MemoryStore``/``MemoryBus`` (with the tests' fixed key) or from real clients.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.core.effects import Effect
from shared.core.messages import Bus
from shared.core.once import once
from shared.core.sealed import Keys
from shared.core.statemachine import Config, Ctx
from shared.messaging import ServiceBusBus
from shared.runtime.executor import Outcome, execute
from shared.settings import Settings, WebhookTarget, instance_id
from shared.storage.store import Store
from shared.storage.table_store import TableStore


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Runtime:
    store: Store
    bus: Bus
    config: Config
    keys: Keys  # TokenKeys: MACs the continuation and fencing tokens (shared.core.sealed)
    instance_id: str = "local"
    clock: Callable[[], datetime] = field(default=utcnow)
    service_bus: Callable[[], Any] | None = None  # the ServiceBusClient the dead-letter routes peek with
    webhook: WebhookTarget | None = None  # where the webhooks go (WebhookUrl, WebhookSecret), or none

    def ctx(self, actor: str | None = None, operation: str | None = None) -> Ctx:
        """A decision's context; ``actor``: who asked (an operator route's caller), recorded as ``by``;
        ``operation``: the bulk operation that asked (``shared.runtime.bulk``)."""
        return Ctx(now=self.clock(), config=self.config, instance_id=self.instance_id, token=secrets.token_hex(8),
                   actor=actor, operation=operation)

    def run(self, effects: list[Effect], limit: int | None = None) -> Outcome:
        return execute(effects, self.store, self.bus, keys=self.keys, limit=limit)


def runtime_from_settings(settings: Settings, clients: object | None = None) -> Runtime:
    from shared.runtime.clients import Clients

    c = clients if isinstance(clients, Clients) else Clients(settings)
    store = TableStore.of(c.table("StateTable"), c.table("DeadlineTable"), c.table("OrderIndexTable"),
                          transport=c.transport)
    config = Config.from_settings(settings)
    return Runtime(store=store, bus=ServiceBusBus(c.sender), config=config, keys=settings.token_keys,
                   instance_id=instance_id(), service_bus=c.service_bus, webhook=settings.webhook)


@once
def get_runtime() -> Runtime:
    """The worker's runtime: built on first use (tables created then), shared by all threads."""
    from shared.runtime.clients import get_clients

    c = get_clients()
    return runtime_from_settings(c.settings, c)
