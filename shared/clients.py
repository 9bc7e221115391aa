"""SDK clients: created once per worker process, lazily, safe under the sync thread pool.

The Python worker runs sync functions on a thread pool, so everything here is built once
under a lock and then shared:

* Table Storage: one ``TableServiceClient`` (and one ``TableClient`` per table), whose
  transport is a ``RequestsTransport`` over one ``requests.Session`` with ``trust_env=False``
  (the default transport re-reads proxy settings from the environment on every call, a few
  ms of CPU each) and a connection pool sized for the thread pool. Tables are created once
  per worker (``create_table_if_not_exists``) on first use.
* Service Bus: one ``ServiceBusClient``; one sender per queue, each behind its own lock
  (senders are not thread-safe). A sender that fails is closed and rebuilt on next use.

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

from shared.settings import Connection, Settings

POOL_SIZE = 64


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


def http_transport() -> Any:
    """A requests transport with one pooled session that does not read proxy env per call."""
    import requests
    from azure.core.pipeline.transport import RequestsTransport

    session = requests.Session()
    session.trust_env = False
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return RequestsTransport(session=session, session_owner=False, use_env_settings=False)


_multipart_patched = False


def sequential_multipart() -> None:
    """Run azure-core's per-part policies of a multipart (``$batch``) request in the calling
    thread instead of a new ``ThreadPoolExecutor`` per request and per response.

    azure-core applies the sub-requests' policies "concurrently": it creates a thread pool for
    the batch, another for its changeset and a third for the response's parts, i.e. it starts
    and joins several threads for every entity-group transaction. The policies are a header
    policy on a handful of in-memory requests (no I/O), so the threads only cost: profiled at
    saturation, thread start/join was the largest single item of the workers' CPU. Same
    policies, same order of effects, same errors; only without the threads. Applied once per
    process; left alone if azure-core's internals are not the expected ones.
    """
    global _multipart_patched
    if _multipart_patched:
        return
    _multipart_patched = True
    try:
        from azure.core.pipeline import PipelineContext, PipelineRequest, PipelineResponse
        from azure.core.pipeline import _base as pipeline_base
        from azure.core.rest import _http_response_impl as rest_impl
        from azure.core.utils import _pipeline_transport_rest_shared as rest_shared
    except ImportError:  # pragma: no cover - another azure-core layout: keep its behaviour
        return
    await_result = getattr(pipeline_base, "_await_result", None)
    if (await_result is None or not hasattr(pipeline_base.Pipeline, "_prepare_multipart_mixed_request")
            or getattr(rest_impl, "_parts_helper", None) is not rest_shared._parts_helper):
        return

    def prepare(request: Any) -> None:
        info = request.multipart_mixed_info
        if not info:
            return
        requests, policies, pipeline_options = info[0], info[1], info[3]
        for req in requests:
            if req.multipart_mixed_info:
                prepare(req)  # the changeset's sub-requests
            pipeline_request = PipelineRequest(req, PipelineContext(None, **pipeline_options))
            for policy in policies:
                await_result(policy.on_request, pipeline_request)

    def parts(response: Any) -> Any:
        if not response.content_type or not response.content_type.startswith("multipart/mixed"):
            raise ValueError("You can't get parts if the response is not multipart/mixed")
        responses = response._get_raw_parts()
        if response.request.multipart_mixed_info:
            policies = response.request.multipart_mixed_info[1]
            for part in responses:
                context = PipelineContext(None)
                pipeline_request = PipelineRequest(part.request, context)
                pipeline_response = PipelineResponse(part.request, part, context=context)
                for policy in policies:
                    await_result(policy.on_response, pipeline_request, pipeline_response)
        return responses

    pipeline_base.Pipeline._prepare_multipart_mixed_request = staticmethod(prepare)  # type: ignore[method-assign]
    rest_impl._parts_helper = parts


def table_service_client(conn: Connection, transport: Any | None = None) -> Any:
    from azure.data.tables import TableServiceClient

    sequential_multipart()

    transport = transport if transport is not None else http_transport()
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
                self._sender = self.client.get_queue_sender(self.queue)
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
    """The worker's clients, built on first use from ``settings``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._tables: dict[str, Any] = {}
        self._table_service: Any = None
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


_clients: Clients | None = None
_clients_lock = threading.Lock()


def get_clients() -> Clients:
    """The worker's one ``Clients`` (settings read from the environment on first use)."""
    global _clients
    if _clients is None:
        with _clients_lock:
            if _clients is None:
                _clients = Clients(Settings.from_env())
    return _clients
