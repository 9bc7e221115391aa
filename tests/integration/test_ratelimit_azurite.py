"""The rate limiter's row on real Table Storage (Azurite): two instances (two ``RateGate``s, each
with its own threads) taking slots at once hand out every slot once, one interval apart, and a
429's pause written by one is honoured by the other. Counted, not timed: the gates' clock is fixed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from shared.agent.limiter import RateGate
from shared.core.workflows.ratelimits import RateLimit
from shared.storage.ratelimits import read_rate
from shared.storage.table_store import TableStore

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
EIGHT = RateLimit(8)


def test_two_instances_racing_take_every_slot_once(path_store: TableStore) -> None:
    gates = [RateGate(path_store, "payment", EIGHT, now=lambda: T0) for _ in range(2)]
    takes = 40
    with ThreadPoolExecutor(max_workers=8) as pool:  # 4 threads per instance
        decisions = list(pool.map(lambda i: gates[i % 2].take(), range(takes)))
    slots = sorted(d.slot for d in decisions if d.slot is not None)
    unknown = [d for d in decisions if d.slot is None]
    assert len(slots) + len(unknown) == takes
    assert unknown == []  # none lost MAX_ROUNDS races in a row (it would call unlimited: fail open)
    # every slot handed out once, one interval apart: the instances together keep the rate
    assert slots == [T0 + k * EIGHT.interval for k in range(len(slots))]
    assert read_rate(path_store, "payment").tat == T0 + len(slots) * EIGHT.interval
    admissions = [d.admission for d in decisions if d.slot is not None]
    assert admissions.count("call") == 1 and admissions.count("sleep") == 7  # 7 slots within the 1 s hold


def test_a_pause_written_by_one_instance_holds_the_other(path_store: TableStore) -> None:
    a = RateGate(path_store, "payment", EIGHT, now=lambda: T0)
    b = RateGate(path_store, "payment", EIGHT, now=lambda: T0)
    assert b.take().admission == "call"  # b keeps the row it wrote: its next take starts from it
    a.throttled(5.0)
    after = b.take()  # b's kept row is stale: its write loses, it reads the pause and decides again
    assert after.admission == "wait" and after.slot == T0 + timedelta(seconds=5)
    row = read_rate(path_store, "payment")
    assert row.throttled == 1 and row.paused_until == T0 + timedelta(seconds=5)
