"""The local host's receivers run without the SDK's keep-alive reads (``local.host.receiving``).

azure-servicebus gives an aio receiver with prefetch 0 a keep-alive task that, every 5 s, reads
the connection while holding its socket lock, stalling the receiver's settlements and flow
frames. The host switches those reads off; a receiver it opens then has no task left running."""

from __future__ import annotations

import asyncio

import pytest
from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus._pyamqp.aio._client_async import AMQPClientAsync
from azure.servicebus.aio import ServiceBusClient

from local.host.receiving import SDK_KEEP_ALIVE, without_keep_alive_reads
from tests.conftest import Endpoint

pytestmark = pytest.mark.integration


async def _keep_alive_after_open(connection_string: str) -> asyncio.Future[None] | None:
    async with ServiceBusClient.from_connection_string(connection_string) as client:
        receiver = client.get_queue_receiver("scheduler", receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                                             prefetch_count=0)
        async with receiver:
            await receiver.receive_messages(max_message_count=1, max_wait_time=0.2)  # opens the link
            await asyncio.sleep(0.05)
            task: asyncio.Future[None] | None = receiver._handler._keep_alive_thread  # type: ignore[union-attr]
            return task if task is None or not task.done() else None


def test_a_prefetch_0_receiver_keeps_no_keep_alive_task_running(servicebus: Endpoint,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    without_keep_alive_reads()  # (another test's host may have done it already in this process)
    monkeypatch.setattr(AMQPClientAsync, "_keep_alive_async", SDK_KEEP_ALIVE[0])  # the SDK's own, until the end
    assert asyncio.run(_keep_alive_after_open(servicebus.connection_string)) is not None  # the SDK's own: running
    assert without_keep_alive_reads()
    assert asyncio.run(_keep_alive_after_open(servicebus.connection_string)) is None
