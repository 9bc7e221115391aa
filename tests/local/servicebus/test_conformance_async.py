"""Conformance: the async client (azure.servicebus.aio) against the emulator. Each test runs its own event loop."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Coroutine
from typing import Any

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import MessagingEntityNotFoundError

from tests.conftest import Endpoint
from tests.local.servicebus.support import CLIENT_OPTIONS, ScenarioRun, Scenarios, body_of, utcnow

pytestmark = pytest.mark.integration

# Each scenario runs its own event loop on its own thread; they run concurrently (see support.Scenarios).
SCENARIOS = Scenarios(arg="endpoint")


def run(coro: Coroutine[Any, Any, None], timeout: float = 45) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout))


async def receive_exactly(r: ServiceBusReceiver, n: int, timeout: float = 10) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        left = deadline - time.monotonic()
        got.extend(await r.receive_messages(max_message_count=n - len(got), max_wait_time=min(2.0, max(left, 0.1))))
    assert len(got) == n, f"expected {n} messages, received {len(got)}"
    return got


async def assert_nothing(r: ServiceBusReceiver, wait: float = 1.0) -> None:
    got = await r.receive_messages(max_message_count=10, max_wait_time=wait)
    assert got == [], f"expected no message, got {[m.message_id for m in got]}"


@SCENARIOS
def async_send_receive_complete(sb: Endpoint) -> None:
    async def main() -> None:
        async with ServiceBusClient.from_connection_string(sb.connection_string, **CLIENT_OPTIONS) as c:
            async with c.get_queue_sender("async-basic") as s:
                await s.send_messages(ServiceBusMessage("single", message_id="as-0"))
                await s.send_messages([ServiceBusMessage(f"m-{i}", message_id=f"as-{i}") for i in range(1, 6)])
                batch = await s.create_message_batch()
                for i in range(6, 10):
                    batch.add_message(ServiceBusMessage(f"m-{i}", message_id=f"as-{i}"))
                await s.send_messages(batch)
            async with c.get_queue_receiver("async-basic", prefetch_count=5) as r:
                got = await receive_exactly(r, 10)
                assert sorted(m.message_id for m in got) == sorted(f"as-{i}" for i in range(10))
                assert body_of(next(m for m in got if m.message_id == "as-0")) == b"single"
                for m in got:
                    await r.complete_message(m)
                await assert_nothing(r, 0.5)
                assert await r.peek_messages(max_message_count=10) == []

    run(main())


def test_async_send_receive_complete(scenarios: ScenarioRun) -> None:
    scenarios.check(async_send_receive_complete)


@SCENARIOS
def async_settlement_scheduling_and_renewal(sb: Endpoint) -> None:
    async def main() -> None:
        q = "async-settle"
        async with ServiceBusClient.from_connection_string(sb.connection_string, **CLIENT_OPTIONS) as c:
            async with c.get_queue_sender(q) as s:
                await s.send_messages([ServiceBusMessage(x, message_id=x) for x in ("ab", "dl", "df")])
            async with c.get_queue_receiver(q) as r:
                got = {m.message_id: m for m in await receive_exactly(r, 3)}
                await r.abandon_message(got["ab"])
                await r.dead_letter_message(got["dl"], reason="AsyncReason", error_description="async description")
                seq = got["df"].sequence_number
                await r.defer_message(got["df"])
                (again,) = await receive_exactly(r, 1, timeout=5)
                assert again.message_id == "ab" and again.delivery_count == 1
                old = again.locked_until_utc
                new = await r.renew_message_lock(again)
                assert old is not None and new >= old
                await r.complete_message(again)
                (d,) = await r.receive_deferred_messages([seq])
                assert d.message_id == "df"
                await r.complete_message(d)
                await assert_nothing(r, 0.5)
            async with c.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
                (x,) = await receive_exactly(dlq, 1)
                assert (x.message_id, x.dead_letter_reason, x.dead_letter_error_description) == \
                    ("dl", "AsyncReason", "async description")
                await dlq.complete_message(x)
            when = utcnow() + dt.timedelta(seconds=1.5)
            async with c.get_queue_sender(q) as s:
                seqs = await s.schedule_messages(
                    [ServiceBusMessage("keep", message_id="keep"), ServiceBusMessage("cancel", message_id="cancel")],
                    when,
                )
                await s.cancel_scheduled_messages(seqs[1])
            async with c.get_queue_receiver(q) as r:
                (k,) = await receive_exactly(r, 1, timeout=6)
                assert k.message_id == "keep" and utcnow() >= when - dt.timedelta(milliseconds=250)
                await r.complete_message(k)
                await assert_nothing(r, 0.5)

    run(main())


def test_async_settlement_scheduling_and_renewal(scenarios: ScenarioRun) -> None:
    scenarios.check(async_settlement_scheduling_and_renewal)


@SCENARIOS
def async_session(sb: Endpoint) -> None:
    async def main() -> None:
        q = "async-session"
        async with ServiceBusClient.from_connection_string(sb.connection_string, **CLIENT_OPTIONS) as c:
            async with c.get_queue_sender(q) as s:
                await s.send_messages(
                    [ServiceBusMessage(f"x-{i}", message_id=f"x-{i}", session_id="as") for i in range(3)]
                )
            async with c.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as r:
                got = await receive_exactly(r, 3)
                assert r.session.session_id == "as"
                assert [m.message_id for m in got] == ["x-0", "x-1", "x-2"]
                await r.session.set_state(b"async-state")
                assert await r.session.get_state() == b"async-state"
                before = r.session.locked_until_utc
                after = await r.session.renew_lock()
                assert before is not None and after >= before
                for m in got:
                    await r.complete_message(m)

    run(main())


def test_async_session(scenarios: ScenarioRun) -> None:
    scenarios.check(async_session)


@SCENARIOS
def async_unknown_entity_fails_fast(sb: Endpoint) -> None:
    async def main() -> None:
        async with ServiceBusClient.from_connection_string(sb.connection_string) as c:  # default options
            t0 = time.monotonic()
            with pytest.raises(MessagingEntityNotFoundError):
                async with c.get_queue_sender("no-such-queue") as s:
                    await asyncio.wait_for(s.send_messages(ServiceBusMessage("x")), 20)
            with pytest.raises(MessagingEntityNotFoundError):
                async with c.get_queue_receiver("no-such-queue") as r:
                    await asyncio.wait_for(r.receive_messages(max_wait_time=5), 20)
            assert time.monotonic() - t0 < 15

    run(main())


def test_async_unknown_entity_fails_fast(scenarios: ScenarioRun) -> None:
    scenarios.check(async_unknown_entity_fails_fast)
