"""The host's receive loop: settlements and receive calls on one receiver take turns.

A settlement made while a receive call of the same receiver is in progress made some hops stall
for 0.1-0.4 s (docs/design.md, "Decisions and their measurements"). These fakes record every
overlap, so a loop that lets them overlap fails here, whatever the timing."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from local.host import servicebus as sbhost
from local.host.app import FunctionSpec
from local.host.receiving import RECEIVE_WAIT
from local.host.settings import ConnectionInfo, ServiceBusOptions


@dataclass
class FakeMessage:
    message_id: str
    body: bytes = b"x"
    lock_token: None = None  # no lock renewal in these tests
    application_properties: dict[str, Any] = field(default_factory=dict)


class FakeReceiver:
    def __init__(self, messages: list[FakeMessage]) -> None:
        self.queue = list(messages)
        self.receiving = False
        self.overlaps: list[str] = []
        self.waits: list[float] = []
        self.completed: list[str] = []

    async def __aenter__(self) -> FakeReceiver:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    async def receive_messages(self, max_message_count: int, max_wait_time: float) -> list[FakeMessage]:
        self.receiving = True
        self.waits.append(max_wait_time)
        try:
            await asyncio.sleep(0.002)  # the broker's answer, or the wait when there is none
            return [self.queue.pop(0)] if self.queue else []
        finally:
            self.receiving = False

    async def complete_message(self, msg: FakeMessage) -> None:
        if self.receiving:
            self.overlaps.append(msg.message_id)
        await asyncio.sleep(0.001)
        self.completed.append(msg.message_id)

    abandon_message = complete_message


class FakeClient:
    def __init__(self, receiver: FakeReceiver) -> None:
        self.receiver = receiver

    async def __aenter__(self) -> FakeClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    def get_queue_receiver(self, queue: str, **kw: Any) -> FakeReceiver:
        return self.receiver


class FakeInvoker:
    def __init__(self) -> None:
        self.invoked: list[bytes] = []
        self.output_handlers: dict[str, Any] = {}

    async def invoke(self, spec: FunctionSpec, arg: Any, reason: str, trace_parent: str | None = None) -> None:
        self.invoked.append(arg)
        await asyncio.sleep(0.005)  # the function runs while the loop receives again


def test_settlements_wait_for_the_receive_call_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = [FakeMessage(f"m{i}") for i in range(12)]
    receiver = FakeReceiver(messages)
    monkeypatch.setattr(sbhost, "make_client", lambda conn: FakeClient(receiver))
    invoker = FakeInvoker()
    spec = FunctionSpec("f", lambda: None, True, {"type": "serviceBusTrigger", "queueName": "q"},
                        trigger_annotation=bytes)

    async def run() -> None:
        host = sbhost.ServiceBusHost(asyncio.get_running_loop(), invoker,  # type: ignore[arg-type]
                                     ServiceBusOptions(max_concurrent_calls=4), {})
        listener = asyncio.get_running_loop().create_task(host._listen(spec, ConnectionInfo("cs")))
        for _ in range(400):
            if len(receiver.completed) == len(messages):
                break
            await asyncio.sleep(0.005)
        host.stopping.set()
        await asyncio.wait_for(listener, 5)

    asyncio.run(run())
    assert sorted(receiver.completed) == sorted(m.message_id for m in messages)
    assert len(invoker.invoked) == len(messages)
    assert receiver.overlaps == []
    # no short calls: they would end empty, and a message arriving just after one is released
    assert set(receiver.waits) == {RECEIVE_WAIT}
