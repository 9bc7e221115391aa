"""The agent with its remote's circuit breaker (``shared.agent.guard``), against a scripted
HTTP remote and a MemoryStore shared by several agent instances: an outage is called at most
``threshold`` times, then every request waits (no call, a ``waiting`` reply, registered for its
resume), one probe per cool-down, and the close resumes every waiting step."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.agent import AgentRuntime
from shared.agent.guard import breaker_for
from shared.core.breaker.state import BreakerState
from shared.core.breaker.waiting import WaitingStep
from shared.core.messages import ReplyMessage
from shared.messaging import MemoryBus
from shared.settings import Settings
from shared.storage.breakers import read_breaker
from shared.storage.memory import MemoryStore
from shared.storage.waiting import waiting_steps
from tests.unit.agent import test_runtime
from tests.unit.agent.test_runtime import FAST, Replies, Scripted, make_request
from tests.unit.agent.test_runtime import request_body as _request_body

remote = test_runtime.remote  # the scripted HTTP remote (a fixture)

SETTINGS = Settings({"BreakerFailureThreshold": "3", "BreakerWindowSeconds": "10", "BreakerCoolDownSeconds": "5",
                     "BreakerProbeLeaseSeconds": "10", "BreakerMaxWaitSeconds": "300",
                     "SchedulerQueue": "scheduler", "AlertsQueue": "alerts"})


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def agents(remote: Scripted, store: MemoryStore, bus: MemoryBus, clock: Clock, n: int = 2) -> list[AgentRuntime]:
    """``n`` agent instances of one remote, each with its own gate on the shared breaker row."""
    out = []
    for i in range(n):
        gate = breaker_for("inventory", store, bus, SETTINGS, f"instance-{i}")
        gate._now = clock  # the breaker's clock; the requests' deadlines run on wall time
        out.append(AgentRuntime("inventory", remote.base, bus, policy=FAST, breaker=gate))
    return out


def request_body(**kw: Any) -> dict[str, Any]:
    """A request of a real order id (the scheduler's contract checks it)."""
    return _request_body(order_id=uuid.uuid4().hex, **kw)


def replies(bus: MemoryBus) -> list[dict[str, Any]]:
    return [json.loads(m.encoded()) for m in bus.take("replies")]


def test_an_outage_is_called_threshold_times_then_every_request_waits(remote: Scripted) -> None:
    remote.script = [(503, {"error": "down"})]
    store, bus, clock = MemoryStore(), Replies(), Clock()
    a, b = agents(remote, store, bus, clock)
    first = a.handle(make_request(request_body(seconds=1.5)))  # retries until the breaker opens
    assert len(remote.requests) == 3 and first.outcome == "waiting" and first.calls == 3
    assert read_breaker(store, "inventory").state is BreakerState.OPEN
    bodies = [request_body(seconds=1.5) for _ in range(5)]
    results = [(a if i % 2 else b).handle(make_request(body)) for i, body in enumerate(bodies)]
    assert len(remote.requests) == 3  # no call while it is open
    assert [r.outcome for r in results] == ["waiting"] * 5 and all(r.calls == 0 for r in results)
    sent = replies(bus)
    assert len(sent) == 6
    assert all("fence" not in r for r in sent)  # none asked: none echoed
    for reply in sent:
        parsed = ReplyMessage.model_validate(reply)  # the scheduler's contract
        assert parsed.outcome == "waiting" and parsed.breaker == "inventory" and parsed.until is not None
        assert parsed.opening == 1  # the opening read: a reply from before a close is told from a new wait
    assert sum(r["wake"] for r in sent) == 1  # one step per cool-down drives the probe
    waiting = waiting_steps(store, "inventory")
    assert {w.order_id for w in waiting} == {r["orderId"] for r in sent}
    [alert] = bus.take("alerts")
    assert alert.body["state"] == "open"


def test_one_probe_after_the_cool_down_closes_it_and_resumes_every_waiting_step(remote: Scripted) -> None:
    remote.script = [(503, {"error": "down"})]
    store, bus, clock = MemoryStore(), Replies(), Clock()
    a, b = agents(remote, store, bus, clock)
    for body in [request_body(seconds=1.5) for _ in range(4)]:
        a.handle(make_request(body))
    waiting = waiting_steps(store, "inventory")
    assert len(waiting) == 4 and len(remote.requests) == 3
    bus.take("replies")
    remote.script = [(200, {"reservationId": "r-1"})]
    clock.now += timedelta(seconds=5)
    probe = b.handle(make_request(request_body(seconds=1.5)))
    assert probe.outcome == "success" and len(remote.requests) == 4
    assert read_breaker(store, "inventory").state is BreakerState.CLOSED
    resumes = bus.take("scheduler")
    assert sorted((m.body["orderId"], m.body["attempt"]) for m in resumes) == sorted(
        (w.order_id, w.attempt) for w in waiting)
    assert all(m.body["kind"] == "resume" and m.body["for"] == "step" for m in resumes)
    assert waiting_steps(store, "inventory") == []  # forgotten once resumed
    assert [m.body["state"] for m in bus.take("alerts")] == ["open", "closed"]


def test_a_failed_probe_opens_it_again_and_its_step_waits(remote: Scripted) -> None:
    remote.script = [(503, {"error": "down"})]
    store, bus, clock = MemoryStore(), Replies(), Clock()
    [a] = agents(remote, store, bus, clock, n=1)
    a.handle(make_request(request_body(seconds=1.5)))
    clock.now += timedelta(seconds=5)
    probe = a.handle(make_request(request_body(seconds=1.5)))
    assert len(remote.requests) == 4  # the threshold, then the one probe
    assert probe.outcome == "waiting"
    row = read_breaker(store, "inventory")
    assert row.state is BreakerState.OPEN and row.opens == 1  # reopened, not a second opening


def test_a_compensation_waits_too_and_is_resumed_as_one(remote: Scripted) -> None:
    remote.script = [(503, {"error": "down"})]
    store, bus, clock = MemoryStore(), Replies(), Clock()
    [a] = agents(remote, store, bus, clock, n=1)
    a.handle(make_request(request_body(seconds=1.5)))
    body = request_body(seconds=1.5, kind="compensation", operation="release", attempt=2,
                        compensates={"step": "reserve-inventory", "idempotencyKey": "k"})
    result = a.handle(make_request(body))
    assert result.outcome == "waiting" and result.reply is not None and result.reply.kind == "compensation"
    assert WaitingStep(body["orderId"], 2, "reserve-inventory", "compensation") in waiting_steps(store, "inventory")


def test_rejections_and_throttling_do_not_open_it(remote: Scripted) -> None:
    remote.script = [(422, {"error": "no stock"})]
    store, bus, clock = MemoryStore(), Replies(), Clock()
    [a] = agents(remote, store, bus, clock, n=1)
    for _ in range(5):
        assert a.handle(make_request(request_body())).outcome == "error"
    assert read_breaker(store, "inventory").state is BreakerState.CLOSED
    assert store.read_row("breakers", "inventory") is None  # nothing written while it is closed and well


def test_a_breaker_it_cannot_read_never_stops_the_agent(remote: Scripted) -> None:
    class Broken(MemoryStore):
        def read_row(self, partition: str, row_key: str) -> Any:
            if partition == "breakers":
                raise OSError("table storage unreachable")
            return super().read_row(partition, row_key)

    store, bus, clock = Broken(), Replies(), Clock()
    [a] = agents(remote, store, bus, clock, n=1)
    assert a.handle(make_request(request_body())).outcome == "success"


def test_a_waiting_reply_echoes_the_requests_fencing_token(remote: Scripted) -> None:
    remote.script = [(503, {"error": "down"})]
    store, bus, clock = MemoryStore(), Replies(), Clock()
    [a] = agents(remote, store, bus, clock, n=1)
    a.handle(make_request(request_body(seconds=1.5)))  # opens the breaker
    bus.take("replies")
    result = a.handle(make_request(request_body(seconds=1.5, fence="tok_en-1")))
    assert result.outcome == "waiting"
    [reply] = replies(bus)
    assert reply["fence"] == "tok_en-1" and ReplyMessage.model_validate(reply).fence == "tok_en-1"
