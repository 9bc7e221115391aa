"""The agent with its remote's rate limit (``shared.agent.limiter``), two instances on one
MemoryStore and a scripted HTTP remote: the instances together hand out one slot per interval;
a call whose slot is near waits for it here, a later one is reserved and the step waits as on an
open breaker (a ``waiting`` reply claiming the wake-up at the slot, nothing registered); the
request sent again at its slot calls without taking another; a 429 pauses every instance."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.agent import AgentRuntime
from shared.agent.limiter import RateGate
from shared.agent.parsing import parse_request
from shared.core.breaker.waiting import probe_tag
from shared.core.messages import ReplyMessage
from shared.core.ratelimit.bucket import SLOT_LATENESS, WAKE_LEAD, wake_time
from shared.core.workflows.ratelimits import RateLimit
from shared.storage.memory import MemoryStore
from shared.storage.ratelimits import read_rate
from shared.storage.waiting import waiting_steps
from tests.unit.agent import test_runtime
from tests.unit.agent.test_runtime import FAST, Replies, Scripted, make_request, mid_for
from tests.unit.agent.test_runtime import request_body as _request_body

remote = test_runtime.remote  # the scripted HTTP remote (a fixture)
EIGHT = RateLimit(8)


class Clock:
    """The limiter's clock. A sleep is recorded and does not move it: the requests of a test
    arrive at once, as a burst does on many threads."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)
        self.slept: list[float] = []

    def __call__(self) -> datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def instances(remote: Scripted, store: MemoryStore, bus: Replies, clock: Clock, n: int = 2) -> list[AgentRuntime]:
    out = []
    for _ in range(n):
        gate = RateGate(store, "inventory", EIGHT, now=clock)
        out.append(AgentRuntime("inventory", remote.base, bus, policy=FAST, rate=gate, sleep=clock.sleep))
    return out


def request_body(**kw: Any) -> dict[str, Any]:
    return _request_body(order_id=uuid.uuid4().hex, seconds=30, **kw)


def test_two_instances_share_one_slot_per_interval_and_the_rest_wait_without_failing(remote: Scripted) -> None:
    store, bus, clock = MemoryStore(), Replies(), Clock()
    a, b = instances(remote, store, bus, clock)
    results = [(a if i % 2 else b).handle(make_request(request_body())) for i in range(20)]
    outcomes = [r.outcome for r in results]
    # the first call goes at once, 7 more within the hold (1 s: slept here), the other 12 are reserved
    assert outcomes.count("success") == 8 and outcomes.count("waiting") == 12
    assert len(remote.requests) == 8 and clock.slept == [(k * EIGHT.interval).total_seconds() for k in range(1, 8)]
    sent = [json.loads(m.encoded()) for m in bus.take("replies")]
    waits = [ReplyMessage.model_validate(r) for r in sent if r["outcome"] == "waiting"]
    assert all(w.breaker == "inventory" and w.wake and w.until is not None for w in waits)  # each wakes itself
    untils = sorted(w.until for w in waits if w.until is not None)
    assert all(y - x == EIGHT.interval for x, y in zip(untils, untils[1:], strict=False))  # own slots
    assert waiting_steps(store, "inventory") == []  # no closer to resume them: nothing registered
    # each wakes WAKE_LEAD before its slot; the row's next slot follows the last one reserved
    assert read_rate(store, "inventory").tat == untils[-1] + WAKE_LEAD + EIGHT.interval


def test_the_request_sent_again_at_its_slot_calls_in_it_without_taking_another(remote: Scripted) -> None:
    store, bus, clock = MemoryStore(), Replies(), Clock()
    [a] = instances(remote, store, bus, clock, n=1)
    for _ in range(10):
        a.handle(make_request(request_body()))
    before = read_rate(store, "inventory")
    body = request_body()
    slot = clock.now + timedelta(seconds=3)
    again = parse_request(json.dumps(body).encode(), message_id=f"{mid_for(body)}:{probe_tag(wake_time(slot))}",
                          reply_to="replies", application_properties={}, agent="inventory")
    clock.now = wake_time(slot) + timedelta(seconds=0.25)  # woken before its slot, the bus's delay after
    result = a.handle(again)
    assert result.outcome == "success" and result.calls == 1
    assert clock.slept[-1] == 1.25  # it waited here for its slot itself
    assert read_rate(store, "inventory") == before  # no slot taken: it had its own


def test_a_request_sent_again_that_comes_after_its_slot_takes_a_new_one(remote: Scripted) -> None:
    """Its slot is gone: called now, it would bunch up with the calls in the slots after it (a
    remote counting in a sliding second answers the last of them 429). Within SLOT_LATENESS it
    still calls in its own slot; later, it takes the next free slot, which is here far off (40
    slots reserved from the start): the step waits again, with no call and no failure."""
    store, bus, clock = MemoryStore(), Replies(), Clock()
    [a] = instances(remote, store, bus, clock, n=1)
    for _ in range(40):
        a.handle(make_request(request_body()))
    calls = len(remote.requests)

    def sent_again(late: timedelta) -> Any:
        before = read_rate(store, "inventory")
        body = request_body()
        slot = clock.now + timedelta(seconds=0.1)  # a slot of a wait that began before the 40
        again = parse_request(json.dumps(body).encode(), message_id=f"{mid_for(body)}:{probe_tag(wake_time(slot))}",
                              reply_to="replies", application_properties={}, agent="inventory")
        clock.now = slot + late
        return a.handle(again), before

    on_time, before = sent_again(SLOT_LATENESS)
    assert on_time.outcome == "success" and read_rate(store, "inventory") == before  # its own slot
    late, before = sent_again(SLOT_LATENESS + timedelta(milliseconds=1))
    assert late.outcome == "waiting" and late.calls == 0 and late.reply is not None
    assert before.tat is not None and before.tat > clock.now + timedelta(seconds=1)  # the next free slot is far
    assert read_rate(store, "inventory").tat == before.tat + EIGHT.interval  # it took it
    assert late.reply.until == wake_time(before.tat)
    assert len(remote.requests) == calls + 1  # the late one made no call


def test_a_429_pauses_every_instance_for_its_retry_after(remote: Scripted) -> None:
    store, bus, clock = MemoryStore(), Replies(), Clock()
    a, b = instances(remote, store, bus, clock)
    remote.script = [(429, {"error": "slow down"}, {"Retry-After": "5"}), (200, {"ok": True})]
    first = a.handle(make_request(request_body()))
    # the retry takes a slot after the pause: far, so the step waits (no FailureCount: a waiting reply)
    assert first.outcome == "waiting" and first.statuses == (429,)
    row = read_rate(store, "inventory")
    assert row.throttled == 1 and row.paused_until is not None
    other = b.handle(make_request(request_body()))
    assert other.outcome == "waiting" and other.calls == 0  # the other instance honours it too
    assert other.reply is not None and other.reply.until is not None
    assert other.reply.until + WAKE_LEAD >= row.paused_until  # its slot is after the pause
    assert len(remote.requests) == 1


def test_without_a_limit_there_is_no_table_request(remote: Scripted) -> None:
    store, bus = MemoryStore(), Replies()
    rt = AgentRuntime("inventory", remote.base, bus, policy=FAST)
    assert rt.handle(make_request(request_body())).outcome == "success"
    assert store.writes == 0 and read_rate(store, "inventory").tat is None
