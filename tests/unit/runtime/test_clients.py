"""Settings -> clients: connection strings vs identity-based settings, thread safety, no Azure call."""

from __future__ import annotations

import threading
from typing import Any
from unittest import mock

import pytest

from shared.core.statemachine import Config
from shared.runtime import clients as C
from shared.settings import Settings, instance_id
from shared.storage.table_store import TableStore
from tests.unit.harness import REQUIRED_VALUES

AZURITE = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
           "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
           "TableEndpoint=http://127.0.0.1:1/devstoreaccount1;")
SB = ("Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;"
      "UseDevelopmentEmulator=true;")
URLS = REQUIRED_VALUES  # required (the service URLs: never called here; the tests' token key)


def test_connection_strings_are_used_as_is() -> None:
    s = Settings.from_env({**URLS, "StateStorage": AZURITE, "ServiceBusConnection": SB})
    assert s.state_storage.connection_string == AZURITE and not s.state_storage.uses_identity
    svc = C.table_service_client(s.state_storage)
    assert svc.url.startswith("http://127.0.0.1:1")
    sb = C.service_bus_client(s.service_bus)
    assert sb.fully_qualified_namespace.startswith("127.0.0.1")
    sb.close()


def test_identity_settings_use_managed_identity_with_client_id() -> None:
    from azure.identity import ManagedIdentityCredential

    env = {"StateStorage__tableServiceUri": "https://acct.table.core.windows.net",
           "StateStorage__credential": "managedidentity",
           "StateStorage__clientId": "11111111-2222-3333-4444-555555555555",
           "ServiceBusConnection__fullyQualifiedNamespace": "ns.servicebus.windows.net",
           "ServiceBusConnection__credential": "managedidentity"}
    s = Settings.from_env({**URLS, **env})
    assert s.state_storage.uses_identity and s.state_storage.client_id.startswith("1111")
    with mock.patch("azure.identity.ManagedIdentityCredential", wraps=ManagedIdentityCredential) as mic:
        svc = C.table_service_client(s.state_storage)
        assert mic.call_args.kwargs == {"client_id": "11111111-2222-3333-4444-555555555555"}
        sb = C.service_bus_client(s.service_bus)
        assert mic.call_args.kwargs == {}
    assert svc.url.startswith("https://acct.table.core.windows.net")
    assert sb.fully_qualified_namespace == "ns.servicebus.windows.net"


def test_identity_without_managedidentity_uses_default_credential() -> None:
    from azure.identity import DefaultAzureCredential

    s = Settings.from_env({**URLS, "StateStorage__tableServiceUri": "https://acct.table.core.windows.net",
                           "StateStorage__clientId": "cid"})
    with mock.patch("azure.identity.DefaultAzureCredential", wraps=DefaultAzureCredential) as dac:
        C.table_service_client(s.state_storage)
    assert dac.call_args.kwargs == {"managed_identity_client_id": "cid"}


def test_missing_connection_is_reported_on_use() -> None:
    clients = C.Clients(Settings.from_env(URLS))
    with pytest.raises(KeyError, match="StateStorage"):
        clients.table_service()
    with pytest.raises(KeyError, match="ServiceBusConnection"):
        clients.service_bus()


def test_the_store_sends_on_one_pooled_transport_and_the_sdk_clients_read_no_proxy_env() -> None:
    """The store's REST path sends on the worker's one Urllib3Transport, pooled for the thread pool;
    the SDK clients (table creation) on a pooled RequestsTransport that reads no proxies from the
    env and verifies TLS."""
    from azure.core.pipeline.transport import RequestsTransport

    from shared.storage.tables import POOL_SIZE, RestTable, requests_transport
    from shared.storage.transport import Urllib3Transport

    clients = C.Clients(Settings.from_env({**URLS, "StateStorage": AZURITE}))
    t = clients.transport
    assert isinstance(t, Urllib3Transport) and t.maxsize == POOL_SIZE >= 32
    assert t.pool("https://account.table.core.windows.net").pool.maxsize == POOL_SIZE
    svc = clients.table_service()
    store = TableStore.of(svc.get_table_client("orders"), svc.get_table_client("deadlines"), transport=t)
    assert isinstance(store.state, RestTable) and store.path == "rest"
    sdk = requests_transport()
    assert isinstance(sdk, RequestsTransport) and sdk.session.trust_env is False
    assert sdk.session.get_adapter("https://x").poolmanager.connection_pool_kw["maxsize"] == POOL_SIZE
    assert sdk.connection_config.verify is True


def test_clients_are_created_once_under_concurrency() -> None:
    s = Settings.from_env({**URLS, "StateStorage": AZURITE, "ServiceBusConnection": SB, "StateTable": "t1"})
    clients = C.Clients(s)
    created = []

    class FakeService:
        def create_table_if_not_exists(self, name: str) -> None:
            created.append(name)

        def get_table_client(self, name: str) -> object:
            return object()

    clients._table_service = FakeService()
    results: list[tuple[object, object]] = []  # one (table, sender) per thread: two appends would interleave
    barrier = threading.Barrier(16)

    def worker() -> None:
        barrier.wait()
        results.append((clients.table("StateTable"), clients.sender("q1")))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert created == ["t1"]
    assert len(results) == 16
    assert len({id(table) for table, _ in results}) == 1
    assert len({id(sender) for _, sender in results}) == 1
    clients.close()


def test_sender_is_rebuilt_after_failure_and_serialised() -> None:
    class FakeSender:
        def __init__(self) -> None:
            self.active = 0
            self.sent = 0
            self.closed = False

        def send_messages(self, m: object) -> None:
            self.active += 1
            assert self.active == 1, "concurrent use of one sender"
            if m == "boom":
                self.active -= 1
                raise ConnectionError("link detached")
            self.sent += 1
            self.active -= 1

        def close(self) -> None:
            self.closed = True

    made: list[FakeSender] = []
    asked: list[dict[str, Any]] = []

    class FakeClient:
        def get_queue_sender(self, queue: str, **kwargs: Any) -> FakeSender:
            asked.append(kwargs)
            made.append(FakeSender())
            return made[-1]

    ls = C.LockedSender(FakeClient(), "q")
    threads = [threading.Thread(target=lambda: [ls.send(i) for i in range(50)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and made[0].sent == 400
    with pytest.raises(ConnectionError):
        ls.send("boom")
    assert made[0].closed
    ls.send("ok")
    assert len(made) == 2
    # every sender is built with the short socket timeout: the keep-alive's idle read holds a send that long
    assert asked == [{"socket_timeout": C.SEND_SOCKET_TIMEOUT}] * 2


def test_config_reads_settings() -> None:
    s = Settings.from_env({**URLS, "MaxFailureCount": "5", "StepTimeoutSeconds": "2", "UnclaimedGraceSeconds": "7",
                           "SchedulerQueue": "sched-x", "BackoffThreshold": "2", "BackoffBaseSeconds": "1.5"})
    c = Config.from_settings(s)
    assert (c.max_failures, c.step_timeout_override, c.grace_seconds) == (5, 2.0, 7.0)
    assert c.queues["SchedulerQueue"] == "sched-x" and c.queues["RepliesQueue"] == "replies"
    assert c.backoff(2).total_seconds() == 0 and c.backoff(3).total_seconds() == 1.5
    assert Config.from_settings(Settings.from_env(URLS)).step_timeout_override is None


def test_instance_id() -> None:
    assert instance_id({"WEBSITE_INSTANCE_ID": "abc"}) == "abc"
    assert instance_id({})


def test_missing_queue_is_remembered_and_not_retried() -> None:
    from azure.servicebus.exceptions import MessagingEntityNotFoundError

    from shared.core.messages import OutMessage
    from shared.messaging import QueueNotFound, ServiceBusBus

    attempts: list[str] = []

    class Sender:
        def __init__(self, queue: str) -> None:
            self.queue = queue

        def send(self, message: object) -> None:
            attempts.append(self.queue)
            if self.queue == "missing":
                raise MessagingEntityNotFoundError(message="not found")

    bus = ServiceBusBus(Sender, missing_ttl=60)
    msg = OutMessage(queue="missing", body={"orderId": "x"}, message_id="m")
    for _ in range(3):
        with pytest.raises(QueueNotFound):
            bus.send(msg)
    bus.send(OutMessage(queue="ok", body={}, message_id="n", application_properties={"traceparent": "t"}))
    assert attempts == ["missing", "ok"]
