"""``bench.sdk_cpu``'s Service Bus cases: client CPU per send (sync and aio) and per receive+complete.

A send is what ``shared.messaging.ServiceBusBus.send`` does: build a ``ServiceBusMessage`` of
the app's shape (JSON body, message id, correlation id, content type, application properties)
and ``send_messages`` it alone, which returns when the broker has accepted it. The threaded case
shares one ``shared.runtime.clients.LockedSender`` per queue between the threads, as the app does.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

from bench.sdk_cpu_measure import Result, in_threads, sequential, timed, timed_async

QUEUES = ("bench-a", "bench-b", "bench-c", "bench-d")  # the threaded/concurrent cases spread over these
RECEIVE_QUEUE = "bench-recv"
BODY = json.dumps({"orderId": "o-0000000000", "step": "charge", "attempt": 1, "operation": "charge",
                   "payload": {"customerId": "c-1", "currency": "EUR", "amount": "38.98",
                               "items": [{"sku": "SKU-1", "quantity": 2}, {"sku": "SKU-3", "quantity": 1}]},
                   "fence": "x" * 120}).encode()
WARMUP = 20


def message() -> Any:
    """One message of the app's shape (``shared.messaging.ServiceBusBus.send``)."""
    from azure.servicebus import ServiceBusMessage

    mid = str(uuid.uuid4())
    return ServiceBusMessage(BODY, message_id=mid, correlation_id="o-0000000000", content_type="application/json",
                             application_properties={"kind": "step", "traceparent": f"00-{mid.replace('-', '')}-"
                                                                                   "0123456789abcdef-01"})


def sync_send_sequential(conn: str, ops: int) -> Result:
    from azure.servicebus import ServiceBusClient

    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_sender(QUEUES[0]) as sender:
        for _ in range(WARMUP):
            sender.send_messages(message())
        return timed("sb sync send, sequential", ops, sequential(ops, lambda _i: sender.send_messages(message())))


def sync_send_threaded(conn: str, ops: int, threads: int) -> Result:
    """``threads`` threads, one ``LockedSender`` per queue (the app's ``shared.runtime.clients``)."""
    from azure.servicebus import ServiceBusClient

    from shared.runtime.clients import LockedSender

    with ServiceBusClient.from_connection_string(conn) as client:
        senders = [LockedSender(client, q) for q in QUEUES]
        try:
            for s in senders:
                for _ in range(WARMUP // 4):
                    s.send(message())
            body = in_threads(threads, ops, lambda i: senders[i % len(senders)].send(message()))
            return timed(f"sb sync send, {threads} threads / {len(QUEUES)} locked senders", ops, body,
                         concurrency=threads)
        finally:
            for s in senders:
                s.close()


async def _aio_send_sequential(conn: str, ops: int) -> Result:
    from azure.servicebus.aio import ServiceBusClient

    async with ServiceBusClient.from_connection_string(conn) as client:
        async with client.get_queue_sender(QUEUES[0]) as sender:
            for _ in range(WARMUP):
                await sender.send_messages(message())

            async def body() -> int:
                errors = 0
                for _ in range(ops):
                    try:
                        await sender.send_messages(message())
                    except Exception:
                        errors += 1
                return errors

            return await timed_async("sb aio send, sequential", ops, body)


async def _aio_send_concurrent(conn: str, ops: int, tasks: int, per_task: bool) -> Result:
    """``tasks`` tasks on one loop. ``per_task``: each task its own aio sender (queues taken in
    turn), so ``tasks`` sends are in flight; else one aio sender per queue shared by the tasks behind
    an ``asyncio.Lock`` (as ``LockedSender``). Without a lock, 32 tasks sharing 4 senders broke the
    SDK (after one failed send its handler shut down under the other tasks: AttributeErrors)."""
    from azure.servicebus.aio import ServiceBusClient

    async with ServiceBusClient.from_connection_string(conn) as client:
        count = tasks if per_task else len(QUEUES)
        senders = [client.get_queue_sender(QUEUES[i % len(QUEUES)]) for i in range(count)]
        locks = [asyncio.Lock() for _ in senders]
        try:
            for s in senders:
                for _ in range(2):
                    await s.send_messages(message())

            async def worker(t: int) -> int:
                errors = 0
                for i in range(t, ops, tasks):
                    which = t if per_task else i % count
                    try:
                        async with locks[which]:
                            await senders[which].send_messages(message())
                    except Exception:
                        errors += 1
                return errors

            async def body() -> int:
                return sum(await asyncio.gather(*(worker(t) for t in range(tasks))))

            how = "one sender per task" if per_task else f"{count} locked senders"
            return await timed_async(f"sb aio send, {tasks} tasks / {how}, one loop", ops, body, concurrency=tasks)
        finally:
            for s in senders:
                await s.close()


def aio_send_sequential(conn: str, ops: int) -> Result:
    return asyncio.run(_aio_send_sequential(conn, ops))


def aio_send_concurrent(conn: str, ops: int, tasks: int, per_task: bool = False) -> Result:
    return asyncio.run(_aio_send_concurrent(conn, ops, tasks, per_task))


def _fill(conn: str, ops: int) -> None:
    """Put ``ops`` messages on the receive queue (in batches; not timed)."""
    from azure.servicebus import ServiceBusClient

    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_sender(RECEIVE_QUEUE) as sender:
        left = ops
        while left:
            batch = sender.create_message_batch()
            while left:
                try:
                    batch.add_message(message())
                except ValueError:
                    break
                left -= 1
            sender.send_messages(batch)


async def _aio_receive(conn: str, ops: int, prefetch: int) -> Result:
    from azure.servicebus.aio import ServiceBusClient

    async with ServiceBusClient.from_connection_string(conn) as client:
        async with client.get_queue_receiver(RECEIVE_QUEUE, prefetch_count=prefetch) as receiver:

            async def body() -> int:
                done = misses = 0
                while done < ops and misses < 5:
                    got = await receiver.receive_messages(max_message_count=prefetch, max_wait_time=2)
                    misses = 0 if got else misses + 1
                    for m in got:
                        await receiver.complete_message(m)
                    done += len(got)
                return ops - done

            return await timed_async(f"sb aio receive+complete (prefetch {prefetch})", ops, body,
                                     note="errors = messages not received")


def aio_receive(conn: str, ops: int, prefetch: int = 32) -> Result:
    _fill(conn, ops)
    return asyncio.run(_aio_receive(conn, ops, prefetch))


def cases(conn: str, threads: list[int]) -> list[tuple[str, Callable[[int], Result]]]:
    """(key, run(ops)) for every Service Bus case."""
    out: list[tuple[str, Callable[[int], Result]]] = [
        ("sb_sync_seq", lambda n: sync_send_sequential(conn, n)),
        ("sb_aio_seq", lambda n: aio_send_sequential(conn, n)),
    ]
    for k in threads:
        out.append((f"sb_sync_threads_{k}", lambda n, k=k: sync_send_threaded(conn, n, k)))  # type: ignore[misc]
        out.append((f"sb_aio_tasks_{k}", lambda n, k=k: aio_send_concurrent(conn, n, k)))  # type: ignore[misc]
        out.append((f"sb_aio_tasks_{k}_own", lambda n, k=k: aio_send_concurrent(conn, n, k, True)))  # type: ignore[misc]
    out.append(("sb_aio_receive_complete", lambda n: aio_receive(conn, n)))
    return out
