"""A receiver's helpers in the local host: its lock renewal, and its turns between receive calls
and settlements (``local.host.servicebus`` runs the receive loops)."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("local.host.servicebus")

RECEIVE_WAIT = 2.0  # seconds one receive call waits for messages
SDK_KEEP_ALIVE: list[Any] = []  # the SDK's keep-alive method, once replaced


def without_keep_alive_reads() -> bool:
    """Stop the aio AMQP clients' keep-alive task from reading (process-wide, idempotent);
    False when this azure-servicebus has no such task (nothing is changed then).

    azure-servicebus starts a keep-alive task for every aio receiver: every 5 s when its prefetch
    is 0 (hard-wired, ``ServiceBusReceiver._create_handler``), every 30 s otherwise. Each round
    calls ``connection.listen(wait=...)``, which holds the connection's socket lock while its
    read waits; with no credit out nothing arrives to end that wait. A settlement or the next
    receive call's flow frame needs the same lock, so every 5 s a host receiver stalled for up
    to ~160 ms. A hop benchmark measured hops p99 80-100 ms with the task and 4 ms
    without. The host's receive loop never lets a connection idle (a receive call every
    ``RECEIVE_WAIT`` at most sends a flow frame, and settlements and lock renewals write), so
    the task keeps nothing alive here. The .NET host, which this one stands in for, has no
    such task. The SDK's private method is replaced in the local host's processes and in the
    benchmark's (its status consumer, ``bench.load.StatusWatcher``, which
    calls receive without pause too), never in the app's code.
    """
    try:
        from azure.servicebus._pyamqp.aio._client_async import AMQPClientAsync
    except ImportError:  # pragma: no cover - another SDK layout: leave it as it is
        return False
    if "_keep_alive_async" not in AMQPClientAsync.__dict__:  # pragma: no cover
        return False

    current = AMQPClientAsync.__dict__["_keep_alive_async"]
    if not getattr(current, "local_host", False):
        SDK_KEEP_ALIVE.append(current)  # the SDK's own, for the test that shows what it does

        async def _keep_alive_async(self: Any) -> None:
            return None

        _keep_alive_async.local_host = True  # type: ignore[attr-defined]
        AMQPClientAsync._keep_alive_async = _keep_alive_async  # type: ignore[method-assign]
    return True


class Turns:
    """Receive calls and settlements on one receiver take turns.

    With prefetch 0 the SDK grants one credit per receive call, and a message that arrives while
    no receive call is active is released at once (``enhanced_message_received_async``). A
    settlement made while a receive call of the same receiver waits on its socket read takes the
    message that arrives meanwhile into the SDK's buffer, and the receive call sees it only when
    its read times out: 5-10% of the hops took 0.1-0.4 s instead of ~2 ms (measured: docs/design.md,
    "Decisions and their measurements"). So a settlement waits for the receive call in progress
    to end: when the next message arrives, or after ``RECEIVE_WAIT`` in a lull, well within the
    lock's duration. (Shorter receive calls while invocations run, tried first, end empty so
    often that messages arriving just after them are released and delivered again: 71 extra
    deliveries for 1,116 orders at saturation.) Prefetching instead would hold messages in the
    buffer with their locks running, which the real host's processor does not do with
    prefetchCount 0.
    """

    def __init__(self) -> None:
        self.lock = asyncio.Lock()

    async def receive(self, receiver: Any, n: int) -> list[Any]:
        """One receive call of ``n`` messages, in its turn."""
        async with self.lock:
            msgs: list[Any] = await receiver.receive_messages(max_message_count=n, max_wait_time=RECEIVE_WAIT)
        return msgs


class LockRenewer:
    """Renews the locks of the messages (or the session) a receiver's invocations hold.

    One task per receiver renews them one after the other: the SDK's AutoLockRenewer renews
    each message from its own task, and concurrent first management calls on a receiver race
    while its management link opens (the SDK fails them with "Management Operation error").
    A lock is renewed when less than half its duration (at most 10 s) is left, for up to
    ``maxAutoLockRenewalDuration``.
    """

    TICK = 0.5

    def __init__(self, receiver: Any, max_duration: float, what: str) -> None:
        self.receiver = receiver
        self.max_duration = max_duration
        self.what = what
        self.entries: dict[int, tuple[Any, float, bool, float]] = {}
        self.task: asyncio.Task[None] | None = None

    def register(self, obj: Any, is_session: bool = False) -> None:
        locked_until = obj.locked_until_utc
        period = (locked_until - datetime.now(UTC)).total_seconds() if locked_until else 60.0
        self.entries[id(obj)] = (obj, time.monotonic(), is_session, max(period, 1.0))
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())

    def unregister(self, obj: Any) -> None:
        self.entries.pop(id(obj), None)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.TICK)
            for key, (obj, started, is_session, period) in list(self.entries.items()):
                if key not in self.entries:
                    continue
                if time.monotonic() - started > self.max_duration:
                    self.entries.pop(key, None)
                    continue
                locked_until = obj.locked_until_utc
                if locked_until is None:
                    continue
                remaining = (locked_until - datetime.now(UTC)).total_seconds()
                if remaining > min(10.0, period / 2):
                    continue
                try:
                    if is_session:
                        await obj.renew_lock()
                    else:
                        await self.receiver.renew_message_lock(obj)
                except Exception as e:  # noqa: BLE001 - lock lost: the broker will redeliver
                    if key in self.entries:
                        self.entries.pop(key, None)
                        log.warning("could not renew the lock of %s on %s: %s: %s",
                                    "the session" if is_session else f"message {obj.message_id}", self.what,
                                    type(e).__name__, e)

    async def close(self) -> None:
        self.entries.clear()
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001,S110
                pass
            self.task = None
