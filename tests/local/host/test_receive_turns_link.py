"""The host's receive loop while invocations run: a receive call that must (re)open its link.

The SDK spends a receive call's wait on opening the receiver's link too, when it is not open (a
link the broker detached, or the receiver of a reconnect), and raises ``OperationTimeoutError``
when the open takes longer. A receive call made while invocations run (their settlements wait for
it) must leave the link time to open: a call too short for it would take the receiver down (its
invocations' settlements then fail and their messages come again) and keep it from receiving."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from azure.servicebus.exceptions import OperationTimeoutError

from local.host import servicebus as sbhost
from local.host.app import FunctionSpec
from local.host.settings import ConnectionInfo, ServiceBusOptions
from tests.local.host.test_receive_turns import FakeMessage

LINK_OPEN = 0.1  # seconds the broker takes to attach a receiver's link


class Broker:
    def __init__(self) -> None:
        self.queue: list[FakeMessage] = []
        self.receivers: list[LinkReceiver] = []
        self.completed: list[tuple[int, str]] = []  # (receiver, message id)
        self.detach = False  # the next receive call finds its link detached
        self.opens = 0  # link opens begun


class LinkReceiver:
    """A receiver whose link must be opened (``LINK_OPEN`` s) before it receives; the broker may
    detach it (``Broker.detach``), after which the next receive call opens it again."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.index = len(broker.receivers)
        broker.receivers.append(self)
        self.link_open = False
        self.closed = False

    async def __aenter__(self) -> LinkReceiver:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.closed = True

    async def receive_messages(self, max_message_count: int, max_wait_time: float) -> list[FakeMessage]:
        if self.broker.detach:
            self.broker.detach = self.link_open = False
        if not self.link_open:
            self.broker.opens += 1
            if max_wait_time < LINK_OPEN:
                await asyncio.sleep(max_wait_time)
                raise OperationTimeoutError(message="Timed out waiting for the AMQP link to open.")
            await asyncio.sleep(LINK_OPEN)
            self.link_open = True
        await asyncio.sleep(0.002)
        return [self.broker.queue.pop(0)] if self.broker.queue else []

    async def complete_message(self, msg: FakeMessage) -> None:
        if self.closed:
            raise RuntimeError("the receiver is closed: the lock is lost, the message comes again")
        self.broker.completed.append((self.index, msg.message_id))

    abandon_message = complete_message


class LinkClient:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def __aenter__(self) -> LinkClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    def get_queue_receiver(self, queue: str, **kw: Any) -> LinkReceiver:
        return LinkReceiver(self.broker)


class SlowInvoker:
    """``slow`` runs until ``release`` is set; the others return at once."""

    def __init__(self) -> None:
        self.invoked: list[bytes] = []
        self.release = asyncio.Event()
        self.output_handlers: dict[str, Any] = {}

    async def invoke(self, spec: FunctionSpec, arg: Any, reason: str, trace_parent: str | None = None) -> None:
        self.invoked.append(arg)
        if arg == b"slow":
            await self.release.wait()


def test_a_link_detached_while_an_invocation_runs_is_opened_again_and_the_invocation_settles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker()
    broker.queue.append(FakeMessage("m0", body=b"slow"))
    monkeypatch.setattr(sbhost, "make_client", lambda conn: LinkClient(broker))
    spec = FunctionSpec("f", lambda: None, True, {"type": "serviceBusTrigger", "queueName": "q"},
                        trigger_annotation=bytes)

    async def until(what: Any) -> bool:
        for _ in range(1000):  # a bound for a broken loop, not a timing assertion
            if what():
                return True
            await asyncio.sleep(0.005)
        return False

    async def run() -> tuple[bool, bool]:
        invoker = SlowInvoker()
        host = sbhost.ServiceBusHost(asyncio.get_running_loop(), invoker,  # type: ignore[arg-type]
                                     ServiceBusOptions(max_concurrent_calls=4), {})
        listener = asyncio.get_running_loop().create_task(host._listen(spec, ConnectionInfo("cs")))
        assert await until(lambda: invoker.invoked == [b"slow"])
        broker.detach = True  # the broker detaches the link; m0's invocation runs on
        assert await until(lambda: broker.opens >= 2)
        broker.queue.append(FakeMessage("m1", body=b"fast"))
        received = await until(lambda: b"fast" in invoker.invoked)
        invoker.release.set()
        settled = await until(lambda: ("m0" in {m for _, m in broker.completed}))
        host.stopping.set()
        await asyncio.wait_for(listener, 5)
        return received, settled

    received, settled = asyncio.run(run())
    assert received, "no message was received while an invocation ran on a receiver whose link had to open"
    assert settled, "the running invocation's message was not completed (it comes again)"
    assert len(broker.receivers) == 1, "the receiver was torn down and reconnected"
