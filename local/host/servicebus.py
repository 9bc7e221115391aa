"""Service Bus triggers and output bindings, on the azure-servicebus SDK (async flavour).

Each triggered function gets its own peek-lock receiver (its own client and connection), owned
by the worker's event loop: receiving, settling and lock renewal all happen on that loop, so the
SDK objects are never shared between threads. Up to ``maxConcurrentCalls`` invocations run at
once per function and instance. With ``autoCompleteMessages`` (the default) a message is
completed when the function returns; whatever that setting, one it raises on is abandoned (as the
.NET processor does, docs/local-stack.md cites it); the queue's max delivery count then moves it to
the dead-letter queue. A message the function settled itself is neither completed nor abandoned.
Locks are renewed while a call runs, for up to ``maxAutoLockRenewalDuration``. If the broker goes
away the receiver is rebuilt with backoff.

A function with ``autoCompleteMessages: false`` (its binding's, else host.json's) settles its
messages itself, through the SDK-type binding's settlement client (``local.host.settlement``): while
it runs, its message is held here by lock token, and ``settle_held`` settles it on the receiver that
holds it. Unsettled when the function returns, it stays locked until its lock expires (no more
renewal), then the broker delivers it again, as with the real host; unsettled when it raises, it is
abandoned (delivered again at once).

Session-enabled triggers (``isSessionsEnabled``) take the next available session, up to
``maxConcurrentSessions`` at a time, and process each session's messages one by one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from .app import FunctionSpec, Invoker
from .messages import to_sdk_message, traceparent_of, trigger_argument
from .receiving import LockRenewer, Turns, without_keep_alive_reads
from .settings import ConnectionInfo, ServiceBusOptions, make_async_credential, resolve_connection
from .settlement import UnknownLockToken

log = logging.getLogger("local.host.servicebus")

FURTHER_PULL_WAIT = 0.01  # seconds a receive call waits for more messages after the first
SETTLE_TIMEOUT = 30.0  # a broker that never answers a settlement must not hold a slot forever
BACKOFF_MAX = 15.0


def make_client(conn: ConnectionInfo) -> ServiceBusClient:
    if conn.connection_string:
        return ServiceBusClient.from_connection_string(conn.connection_string, retry_total=2, retry_backoff_max=5)
    assert conn.fully_qualified_namespace
    return ServiceBusClient(conn.fully_qualified_namespace, make_async_credential(conn),
                            retry_total=2, retry_backoff_max=5)


@dataclass
class Held:
    """A message whose function may settle it: where it came from, and whether it was settled."""

    receiver: Any
    msg: Any
    spec: FunctionSpec
    turns: Turns | None
    renewer: LockRenewer
    settled: bool = False


class ServiceBusHost:
    """Receivers for the Service Bus triggers of one instance, and senders for output bindings."""

    def __init__(self, loop: asyncio.AbstractEventLoop, invoker: Invoker, options: ServiceBusOptions,
                 settings: Mapping[str, str]) -> None:
        self.loop = loop
        self.invoker = invoker
        self.options = options
        self.settings = settings
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.in_flight: set[asyncio.Task[None]] = set()
        self._open: set[asyncio.Task[Any]] = set()
        self._out_clients: dict[str, ServiceBusClient] = {}
        self._senders: dict[tuple[str, str], Any] = {}
        self._sender_lock = asyncio.Lock()
        self.held: dict[str, Held] = {}  # lock token -> a message its function may settle (SDK-type bindings)
        invoker.output_handlers["serviceBus"] = self.send_output

    # ------------------------------------------------------------------ triggers

    def start(self, specs: list[FunctionSpec]) -> None:
        """Call on the loop."""
        without_keep_alive_reads()  # receivers would stall every 5 s (local.host.receiving)
        for spec in specs:
            conn = resolve_connection(str(spec.trigger.get("connection") or "ServiceBusConnection"), self.settings)
            if spec.trigger.get("isSessionsEnabled"):
                for i in range(max(1, self.options.max_concurrent_sessions)):
                    self.tasks.append(self.loop.create_task(self._session_loop(spec, conn, i)))
            else:
                self.tasks.append(self.loop.create_task(self._listen(spec, conn)))
        for spec in specs:
            if not self.auto_complete(spec) and not spec.settlement_param:
                log.warning("Functions.%s: autoCompleteMessages is false but the function takes no settlement "
                            "client (ServiceBusMessageActions): its messages are never settled and will be "
                            "redelivered", spec.name)

    def auto_complete(self, spec: FunctionSpec) -> bool:
        """The binding's ``autoCompleteMessages``, else host.json's (``extensions.serviceBus``)."""
        value = spec.trigger.get("autoCompleteMessages")
        if value is None:
            return self.options.auto_complete_messages
        return value if isinstance(value, bool) else str(value).strip().lower() == "true"

    def _entity(self, spec: FunctionSpec) -> str:
        t = spec.trigger
        if t.get("topicName"):
            return f"{t['topicName']}/Subscriptions/{t.get('subscriptionName')}"
        return str(t.get("queueName"))

    def _receiver(self, client: ServiceBusClient, spec: FunctionSpec, **kw: Any) -> Any:
        t = spec.trigger
        common = dict(receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=self.options.prefetch_count, **kw)
        if t.get("topicName"):
            receiver = client.get_subscription_receiver(t["topicName"], t["subscriptionName"], **common)
        else:
            receiver = client.get_queue_receiver(t["queueName"], **common)
        # After the first message of a receive call the SDK waits 0.2 s for more to fill the batch:
        # that would add 0.2 s to every hop of a message flow. The host's processor hands each
        # message on at once; wait only briefly. (A private attribute: ignored if it goes away.)
        if hasattr(receiver, "_further_pull_receive_timeout"):
            receiver._further_pull_receive_timeout = FURTHER_PULL_WAIT
        return receiver

    async def _listen(self, spec: FunctionSpec, conn: ConnectionInfo) -> None:
        entity = self._entity(spec)
        limit = max(1, self.options.max_concurrent_calls)
        slots = asyncio.Semaphore(limit)
        turns = Turns()
        backoff = 0.5
        while not self.stopping.is_set():
            client = make_client(conn)
            renewer: LockRenewer | None = None
            try:
                async with client:
                    receiver = self._receiver(client, spec)
                    renewer = LockRenewer(receiver, self._renewal_seconds(), f"'{entity}'")
                    async with receiver:
                        log.info("Listening on '%s' for 'Functions.%s' (maxConcurrentCalls=%d)",
                                 entity, spec.name, limit)
                        self._mark_open(True)
                        while not self.stopping.is_set():
                            await slots.acquire()
                            if self.stopping.is_set():
                                slots.release()
                                break
                            # One message per receive call: a call for n > 1 messages returns only
                            # after the first message plus one more socket read (the SDK's
                            # socket_timeout, 0.2 s), which would add 0.2 s to every hop of a
                            # message flow. The host's processor hands each message on at once.
                            # With prefetchCount > 0 the next calls are served from the buffer.
                            n = 1
                            try:
                                msgs = await turns.receive(receiver, n)
                            except BaseException:
                                for _ in range(n):
                                    slots.release()
                                raise
                            backoff = 0.5
                            for _ in range(n - len(msgs)):
                                slots.release()
                            for m in msgs:
                                self._spawn(self._handle(spec, receiver, renewer, m, slots, turns))
                        await self._drain()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - broker gone, entity missing...: retry with backoff
                if self.stopping.is_set():
                    break
                log.warning("receiver for '%s' (Functions.%s) failed: %s: %s; reconnecting in %.1fs",
                            entity, spec.name, type(e).__name__, e, backoff)
                await self._sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
            finally:
                self._mark_open(False)
                if renewer is not None:
                    await renewer.close()

    def _mark_open(self, is_open: bool) -> None:
        """Whether the current listener task holds an open receiver (stop lets those finish
        their receive and settle; the others, connecting or backing off, are cancelled)."""
        task = asyncio.current_task()
        if task is not None:
            (self._open.add if is_open else self._open.discard)(task)  # type: ignore[arg-type]

    async def _session_loop(self, spec: FunctionSpec, conn: ConnectionInfo, index: int) -> None:
        from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError

        entity = self._entity(spec)
        idle = self.options.session_idle_timeout.total_seconds() if self.options.session_idle_timeout else 5.0
        backoff = 0.5
        while not self.stopping.is_set():
            client = make_client(conn)
            try:
                async with client:
                    while not self.stopping.is_set():
                        try:
                            receiver = self._receiver(client, spec, session_id=NEXT_AVAILABLE_SESSION,
                                                      max_wait_time=idle)
                            await receiver.__aenter__()
                        except OperationTimeoutError:
                            try:
                                await receiver.close()
                            except Exception:  # noqa: BLE001,S110
                                pass
                            continue  # no session available right now
                        renewer = LockRenewer(receiver, self._renewal_seconds(), f"'{entity}'")
                        self._mark_open(True)
                        try:
                            renewer.register(receiver.session, is_session=True)
                            while not self.stopping.is_set():
                                msgs = await receiver.receive_messages(max_message_count=1, max_wait_time=idle)
                                backoff = 0.5
                                if not msgs:
                                    break  # session idle: release it, take the next one
                                for m in msgs:
                                    await self._handle(spec, receiver, renewer, m, None)
                        except ServiceBusError as e:
                            log.info("session %s on '%s' ended: %s", getattr(receiver.session, "session_id", "?"),
                                     entity, e)
                        finally:
                            self._mark_open(False)
                            await renewer.close()
                            await receiver.__aexit__(None, None, None)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001
                if self.stopping.is_set():
                    break
                log.warning("session receiver %d for '%s' failed: %s: %s; reconnecting in %.1fs",
                            index, entity, type(e).__name__, e, backoff)
                await self._sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    def _renewal_seconds(self) -> float:
        return self.options.max_auto_lock_renewal_duration.total_seconds()

    def _spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def _handle(self, spec: FunctionSpec, receiver: Any, renewer: LockRenewer, msg: Any,
                      slots: asyncio.Semaphore | None, turns: Turns | None = None) -> None:
        held: Held | None = None
        try:
            if msg.lock_token is not None and not spec.trigger.get("isSessionsEnabled"):
                renewer.register(msg)
            if spec.settlement_param and msg.lock_token is not None:
                held = self.held[str(msg.lock_token)] = Held(receiver, msg, spec, turns, renewer)
            auto = self.auto_complete(spec)
            try:
                arg = trigger_argument(spec, msg)
                await self.invoker.invoke(spec, arg, f"New ServiceBus message detected on '{self._entity(spec)}'.",
                                          traceparent_of(msg))
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - logged by the invoker
                # Abandoned unless settled, whatever autoCompleteMessages says: the .NET processor's
                # catch (ReceiverManager.ProcessOneMessage) skips only `message.IsSettled`.
                if not (held and held.settled):
                    await self._settle("abandon", receiver.abandon_message, msg, spec, turns, renewer)
            else:
                if auto and not (held and held.settled):
                    await self._settle("complete", receiver.complete_message, msg, spec, turns, renewer)
        finally:
            if held is not None:
                self.held.pop(str(msg.lock_token), None)
            renewer.unregister(msg)
            if slots is not None:
                slots.release()

    async def settle_held(self, action: str, token: str, kw: dict[str, Any]) -> None:
        """Settle the held message with lock token ``token`` (a settlement client's call, through
        ``local.host.settlement.SettlementServer``), on its receiver, in its turn. Raises
        ``UnknownLockToken``, or what the broker answered."""
        held = self.held.get(str(token))
        if held is None or (held.settled and action != "renew"):
            raise UnknownLockToken(f"no message with lock token {token} is held by this instance "
                                   "(settled already, or its function returned)")
        receiver, msg = held.receiver, held.msg
        if action == "renew":
            await receiver.renew_message_lock(msg)
            return
        op = {"complete": receiver.complete_message, "abandon": receiver.abandon_message,
              "defer": receiver.defer_message,
              "deadletter": lambda m: receiver.dead_letter_message(m, reason=kw.get("reason"),
                                                                   error_description=kw.get("error_description"))}[action]
        held.settled = True
        await self._settle(action, op, msg, held.spec, held.turns, held.renewer, raise_errors=True)

    async def _settle(self, what: str, op: Any, msg: Any, spec: FunctionSpec, turns: Turns | None,
                      renewer: LockRenewer, raise_errors: bool = False) -> None:
        """Settle ``msg``; its lock is renewed until its turn comes (a lull can make it wait up
        to ``RECEIVE_WAIT``, longer than a short LockDuration leaves). A failure is logged (the
        broker redelivers the message), and raised too with ``raise_errors``."""
        try:
            # after the receive call in progress, if any (a session receiver's handling is inline: no turns)
            async with turns.lock if turns is not None else contextlib.nullcontext():
                renewer.unregister(msg)
                async with asyncio.timeout(SETTLE_TIMEOUT):  # no task of its own, as wait_for makes
                    await op(msg)
        except Exception as e:  # noqa: BLE001 - lock lost or link gone: the broker redelivers
            log.warning("could not %s message %s of 'Functions.%s': %s: %s", what, msg.message_id, spec.name,
                        type(e).__name__, e)
            if raise_errors:
                raise

    async def _drain(self, timeout: float = 30.0) -> None:
        if self.in_flight:
            await asyncio.wait(set(self.in_flight), timeout=timeout)

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop receiving, let running invocations finish and settle, close everything."""
        self.stopping.set()
        # Each listener ends its current receive (at most RECEIVE_WAIT), lets its running
        # invocations finish and settle on its receiver, then closes it.
        for t in self.tasks:
            if t not in self._open:
                t.cancel()  # connecting or backing off: nothing to settle
        pending: set[asyncio.Task[None]] = set()
        if self.tasks:
            _done, pending = await asyncio.wait(self.tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
        await self._drain(5)
        for sender, _lock in list(self._senders.values()):
            try:
                await sender.close()
            except Exception:  # noqa: BLE001,S110
                pass
        for c in list(self._out_clients.values()):
            try:
                await c.close()
            except Exception:  # noqa: BLE001,S110
                pass

    # ------------------------------------------------------------------ output bindings

    async def send_output(self, binding: dict[str, Any], value: Any) -> None:
        conn_name = str(binding.get("connection") or "ServiceBusConnection")
        entity = str(binding.get("queueName") or binding.get("topicName"))
        key = (conn_name, entity)
        values = value if isinstance(value, list) and all(
            isinstance(v, (str, bytes, ServiceBusMessage)) for v in value) else [value]
        messages = [to_sdk_message(v) for v in values]
        async with self._sender_lock:
            entry = self._senders.get(key)
            if entry is None:
                client = self._out_clients.get(conn_name)
                if client is None:
                    client = self._out_clients[conn_name] = make_client(resolve_connection(conn_name, self.settings))
                sender = (client.get_topic_sender(entity) if binding.get("topicName")
                          else client.get_queue_sender(entity))
                entry = self._senders[key] = (sender, asyncio.Lock())
        sender, lock = entry
        # One send at a time per sender: the SDK's handlers are not safe for concurrent use
        # (two coroutines opening the same link race).
        async with lock:
            try:
                await sender.send_messages(messages)
            except Exception:
                if self._senders.get(key) is entry:
                    self._senders.pop(key, None)
                try:
                    await sender.close()
                except Exception:  # noqa: BLE001,S110
                    pass
                raise
