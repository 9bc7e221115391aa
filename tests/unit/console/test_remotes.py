"""``GET /api/overview``'s ``remotes`` (``shared.console.remotes``): each remote's circuit breaker
as stored (partition ``breakers``) and the steps waiting on it (partition ``waiting-{remote}``),
two requests per remote, and a failure to read them that leaves the rest of the overview whole."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from shared.console.overview import get_overview
from shared.console.remotes import WAITING_COUNT_CAP, breaker_json
from shared.core.breaker.state import BreakerPolicy, BreakerRow, BreakerState, decide_admit, decide_failure
from shared.core.breaker.waiting import WaitingStep, waiting_partition
from shared.core.ratelimit.bucket import RATE_PARTITION, decide_take, decide_throttled
from shared.core.workflows.catalog import AGENTS
from shared.core.workflows.ratelimits import RateLimit
from shared.observability.figures import minute_stamp
from shared.storage.breakers import BREAKER_PARTITION, read_breaker, write_breaker
from shared.storage.memory import MemoryStore
from shared.storage.ratelimits import apply
from shared.storage.waiting import register_waiting
from tests.unit.console.test_overview import NOW, no_queues, put
from tests.unit.harness import Clock, make_runtime

POLICY = BreakerPolicy()
NAMES = [agent.name for agent in AGENTS]
CLOSED = {"state": "closed", "failures": 0, "windowStart": None, "openedAt": None, "retryAt": None,
          "probeUntil": None, "opens": 0, "lastFault": None, "changedAt": None, "waiting": 0, "waitingCapped": False,
          "rateLimit": None}


def overview(rt: Any) -> dict[str, Any]:
    result = get_overview(rt, queue_depths=no_queues)
    assert result.status == 200
    return result.body  # type: ignore[no-any-return]


def by_name(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {remote["name"]: remote for remote in body["remotes"]}


def open_breaker(store: MemoryStore, remote: str) -> BreakerRow:
    """``remote``'s breaker opened by ``threshold`` failures, the last one at NOW - 1 s."""
    for i in range(POLICY.threshold):
        at = NOW - timedelta(seconds=POLICY.threshold - i)
        decision = decide_failure(read_breaker(store, remote), at, POLICY, f"503 from {remote} #{i}")
        assert decision.row is not None
        write_breaker(store, decision.row)
    row = read_breaker(store, remote)
    assert row.state is BreakerState.OPEN
    return row


def wait_on(store: MemoryStore, remote: str, steps: int) -> None:
    for i in range(steps):
        register_waiting(store, remote, WaitingStep(f"{i:032x}", 1, "create-shipment"), NOW)


def test_every_agent_has_a_closed_breaker_when_nothing_was_written() -> None:
    body = overview(make_runtime(clock=Clock(NOW)))
    assert [remote["name"] for remote in body["remotes"]] == NAMES  # agents.json's order
    assert all(remote == {"name": remote["name"], **CLOSED} for remote in body["remotes"])
    assert body["remotesError"] is None


def test_an_open_breaker_and_its_waiting_steps() -> None:
    rt = make_runtime(clock=Clock(NOW))
    open_breaker(rt.store, "shipping")
    wait_on(rt.store, "shipping", 3)
    shipping = by_name(overview(rt))["shipping"]
    assert shipping == {"name": "shipping", "state": "open", "failures": POLICY.threshold,
                        "windowStart": "2026-11-22T08:30:15.000000Z", "openedAt": "2026-11-22T08:30:19.000000Z",
                        "retryAt": "2026-11-22T08:30:24.000000Z", "probeUntil": None, "opens": 1,
                        "lastFault": "503 from shipping #4", "changedAt": "2026-11-22T08:30:19.000000Z",
                        "waiting": 3, "waitingCapped": False, "rateLimit": None}
    others = {name: remote for name, remote in by_name(overview(rt)).items() if name != "shipping"}
    assert all(remote["state"] == "closed" and remote["waiting"] == 0 for remote in others.values())


def test_a_half_open_breaker_shows_its_probe_lease() -> None:
    rt = make_runtime(clock=Clock(NOW))
    opened = open_breaker(rt.store, "payment")
    assert opened.retry_at is not None
    probe = decide_admit(opened, opened.retry_at, POLICY, "instance-b")
    assert probe.admission == "probe" and probe.row is not None
    write_breaker(rt.store, probe.row)
    payment = by_name(overview(rt))["payment"]
    assert payment["state"] == "half-open" and payment["opens"] == 1
    assert payment["probeUntil"] == "2026-11-22T08:30:34.000000Z"  # retryAt + the probe lease (10 s)


@pytest.mark.parametrize(("rows", "expected"),
                         [(WAITING_COUNT_CAP, (100, False)), (WAITING_COUNT_CAP + 1, (100, True))])
def test_the_waiting_count_is_capped(rows: int, expected: tuple[int, bool]) -> None:
    rt = make_runtime(clock=Clock(NOW))
    wait_on(rt.store, "delivery", rows)
    delivery = by_name(overview(rt))["delivery"]
    assert (delivery["waiting"], delivery["waitingCapped"]) == expected


def test_two_requests_per_remote_and_no_order_partition() -> None:
    rt = make_runtime(clock=Clock(NOW))
    open_breaker(rt.store, "shipping")
    wait_on(rt.store, "shipping", 2)
    rt.store.reads.clear()
    overview(rt)
    state_reads = sorted(partition for table, partition in rt.store.reads if table == "state")
    assert state_reads == sorted([BREAKER_PARTITION] * len(NAMES) + [waiting_partition(n) for n in NAMES])


def test_a_limited_remote_shows_its_rate_its_pause_and_its_next_slot_for_one_request_more() -> None:
    """Only a remote with a rate limit (``Config.rate_limits``) has ``rateLimit``, read from its
    limiter row (partition ``ratelimits``): one point read more, for it alone."""
    limit = RateLimit(8, burst=2)
    rt = make_runtime(clock=Clock(NOW), rate_limits={"payment": limit})
    assert by_name(overview(rt))["payment"]["rateLimit"] == {
        "perSecond": 8, "burst": 2, "pausedUntil": None, "throttled": 0, "nextSlotAt": None}  # never taken
    apply(rt.store, "payment", lambda row: decide_take(row, NOW, limit))
    apply(rt.store, "payment", lambda row: decide_throttled(row, NOW, timedelta(seconds=3), limit))
    rt.store.reads.clear()
    remotes = by_name(overview(rt))
    assert remotes["payment"]["rateLimit"] == {
        "perSecond": 8, "burst": 2, "pausedUntil": "2026-11-22T08:30:23.000000Z", "throttled": 1,
        "nextSlotAt": "2026-11-22T08:30:20.131250Z"}  # NOW + 1.05/8 s
    assert all(remote["rateLimit"] is None for name, remote in remotes.items() if name != "payment")
    state_reads = sorted(partition for table, partition in rt.store.reads if table == "state")
    assert state_reads == sorted([BREAKER_PARTITION] * len(NAMES) + [waiting_partition(n) for n in NAMES]
                                 + [RATE_PARTITION])


class BreakersDown(MemoryStore):
    """A state table that fails on the breakers' partition only."""

    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None:
        if order_id == BREAKER_PARTITION:
            raise ConnectionError("state table unreachable")
        return super().read_row(order_id, row_key)


def test_a_breaker_read_failure_empties_the_remotes_only() -> None:
    rt = make_runtime(store=BreakersDown(), clock=Clock(NOW))
    put(rt.store, f"m-{minute_stamp(NOW)}-a", submitted=4)
    body = overview(rt)
    assert body["remotes"] == [] and body["remotesError"] == "state table unreachable"
    assert body["finished"]["lastHour"]["submitted"] == 4 and body["queues"] and body["queuesError"] is None


def test_a_waiting_count_failure_is_shown_the_same_way() -> None:
    class WaitingDown(MemoryStore):
        def partition_keys(self, order_id: str, limit: int) -> list[tuple[str, str]]:
            raise TimeoutError()

    body = overview(make_runtime(store=WaitingDown(), clock=Clock(NOW)))
    assert body["remotes"] == [] and body["remotesError"] == "TimeoutError"


def test_the_remotes_can_be_named() -> None:
    rt = make_runtime(clock=Clock(NOW))
    body = get_overview(rt, queue_depths=no_queues, remotes=["shipping"]).body
    assert [remote["name"] for remote in body["remotes"]] == ["shipping"]


def test_times_are_utc_with_a_z() -> None:
    from datetime import datetime, timezone

    east = timezone(timedelta(hours=2))
    row = BreakerRow("x", BreakerState.OPEN, retry_at=datetime(2026, 11, 22, 10, 0, tzinfo=east),
                     opened_at=datetime(2026, 11, 22, 8, 0))  # naive: taken as UTC
    shown = breaker_json(row)
    assert shown["retryAt"] == "2026-11-22T08:00:00.000000Z" and shown["openedAt"] == "2026-11-22T08:00:00.000000Z"
