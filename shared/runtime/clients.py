"""SDK clients: created once per worker process, lazily, safe under the sync thread pool.

The Python worker runs sync functions on a thread pool, so everything here is built once
under a lock and then shared:

* Table Storage: one ``TableServiceClient`` (and one ``TableClient`` per table) on azure-core's
  ``RequestsTransport`` (``shared.storage.tables.requests_transport``: one pooled session sized for the
  thread pool, no proxy settings read from the environment per call). Tables are created once per
  worker (``create_table_if_not_exists``) on first use. The store reaches them through
  ``shared.storage.tables`` (the REST path over azure-core's public pipeline) on the worker's one
  ``Urllib3Transport`` (``transport``), pooled for the thread pool too.
* Service Bus: one ``ServiceBusClient``; one sender per queue, each behind its own lock
  (senders are not thread-safe). A sender that fails is closed and rebuilt on next use. Each
  sender is built with a short ``socket_timeout`` (``SEND_SOCKET_TIMEOUT``, below).

Connections, read from the settings (``shared.settings``): a connection string is used as
is; identity-based settings (``<Name>__fullyQualifiedNamespace`` / ``__tableServiceUri`` +
``__credential``, ``__clientId``) use azure-identity: ``ManagedIdentityCredential(client_id=...)``
when ``__credential`` is ``managedidentity``, else ``DefaultAzureCredential`` (with the client
id as its managed identity, if given).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from shared.core.once import once
from shared.settings import Connection, Settings
from shared.storage.tables import POOL_SIZE, requests_transport
from shared.storage.transport import Urllib3Transport


def credential_for(conn: Connection) -> Any:
    """The azure-identity credential an identity-based connection asks for."""
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

    if (conn.credential or "").lower() == "managedidentity":
        if conn.client_id:
            return ManagedIdentityCredential(client_id=conn.client_id)
        return ManagedIdentityCredential()
    if conn.client_id:
        return DefaultAzureCredential(managed_identity_client_id=conn.client_id)
    return DefaultAzureCredential()


def table_service_client(conn: Connection, transport: Any | None = None) -> Any:
    from azure.data.tables import TableServiceClient

    transport = transport if transport is not None else requests_transport()
    if conn.connection_string:
        return TableServiceClient.from_connection_string(conn.connection_string, transport=transport)
    endpoint = conn.endpoint or ""
    if not endpoint.startswith(("https://", "http://")):
        endpoint = f"https://{endpoint}"
    return TableServiceClient(endpoint=endpoint, credential=credential_for(conn), transport=transport)


def service_bus_client(conn: Connection) -> Any:
    from azure.servicebus import ServiceBusClient

    if conn.connection_string:
        return ServiceBusClient.from_connection_string(conn.connection_string)
    namespace = (conn.endpoint or "").removeprefix("sb://").rstrip("/")
    return ServiceBusClient(fully_qualified_namespace=namespace, credential=credential_for(conn))


# A sender's keep-alive (the SDK's default, every 30 s) reads its idle connection for up to the
# socket timeout while holding the socket, and a send that comes then waits for that read to end:
# up to 0.2 s at the SDK's default for AMQP over TCP. That wait was the latency tail at a fixed
# rate (measured in issue 31). ``socket_timeout`` is ``get_queue_sender``'s documented
# keyword; it also bounds a write that cannot go out, which for a message of a few KB means a
# link stalled for 50 ms (the send then fails and is retried like any other failed send).
SEND_SOCKET_TIMEOUT = 0.05


@dataclass
class LockedSender:
    """A Service Bus sender used by one thread at a time; rebuilt after a failure."""

    client: Any
    queue: str

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._sender: Any = None

    def send(self, message: Any) -> None:
        with self._lock:
            if self._sender is None:
                self._sender = self.client.get_queue_sender(self.queue, socket_timeout=SEND_SOCKET_TIMEOUT)
            try:
                self._sender.send_messages(message)
            except Exception:
                try:
                    self._sender.close()
                except Exception:  # pragma: no cover - best effort
                    pass
                self._sender = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._sender is not None:
                self._sender.close()
                self._sender = None


class Clients:
    """The worker's clients, built on first use from ``settings`` (the store's transport, which
    connects on its first request, at once)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._tables: dict[str, Any] = {}
        self._table_service: Any = None
        self.transport = Urllib3Transport(POOL_SIZE)  # the store's table requests (the REST path)
        self._sb: Any = None
        self._senders: dict[str, LockedSender] = {}

    # Table Storage ----------------------------------------------------------------------------
    def table_service(self) -> Any:
        if self._table_service is None:
            with self._lock:
                if self._table_service is None:
                    if self.settings.state_storage is None:
                        raise KeyError("StateStorage (or StateStorage__tableServiceUri) is not set")
                    self._table_service = table_service_client(self.settings.state_storage)
        return self._table_service

    def table(self, setting: str) -> Any:
        """TableClient for the table named by ``setting``; the table is created once per worker."""
        name = self.settings[setting]
        client = self._tables.get(name)
        if client is not None:
            return client
        service = self.table_service()
        with self._lock:
            client = self._tables.get(name)
            if client is None:
                service.create_table_if_not_exists(name)
                client = service.get_table_client(name)
                self._tables[name] = client
        return client

    # Service Bus ------------------------------------------------------------------------------
    def service_bus(self) -> Any:
        if self._sb is None:
            with self._lock:
                if self._sb is None:
                    if self.settings.service_bus is None:
                        raise KeyError("ServiceBusConnection (or __fullyQualifiedNamespace) is not set")
                    self._sb = service_bus_client(self.settings.service_bus)
        return self._sb

    def sender(self, queue: str) -> LockedSender:
        s = self._senders.get(queue)
        if s is not None:
            return s
        client = self.service_bus()
        with self._lock:
            s = self._senders.get(queue)
            if s is None:
                s = LockedSender(client, queue)
                self._senders[queue] = s
        return s

    def close(self) -> None:
        for s in list(self._senders.values()):
            try:
                s.close()
            except Exception:  # pragma: no cover
                pass
        if self._sb is not None:
            self._sb.close()
        self.transport.close()


@once
def get_clients() -> Clients:
    """The worker's one ``Clients`` (settings read from the environment on first use)."""
    return Clients(Settings.from_env())
