"""Random interleavings of instances sharing one breaker: each instance reads the row, then
(after other instances may have moved it) writes what it decided on that read, and on a lost race
reads again. Whatever the interleaving: one alert per opening, closes alternate with opens, never
two live probe leases, and no call admitted during a cool-down."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from shared.core.breaker.state import (
    BreakerDecision,
    BreakerPolicy,
    BreakerRow,
    BreakerState,
    Effect,
    decide_admit,
    decide_failure,
    decide_success,
)
from shared.storage.breakers import read_breaker, write_breaker
from shared.storage.memory import MemoryStore
from shared.storage.store import Conflict

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
POLICY = BreakerPolicy(threshold=3, window=timedelta(seconds=4), cool_down=timedelta(seconds=2),
                       probe_lease=timedelta(seconds=3))


@dataclass
class Instance:
    name: str
    seen: BreakerRow | None = None  # read, not yet written
    event: str = ""
    probe_id: str = ""  # the probe lease this instance holds, if any


def decide(inst: Instance, row: BreakerRow, now: datetime, rng: random.Random) -> BreakerDecision:
    if inst.event == "admit":
        return decide_admit(row, now, POLICY, inst.name)
    if inst.event == "failure":
        return decide_failure(row, now, POLICY, "HTTP 503", inst.probe_id)
    return decide_success(row, now, inst.probe_id)


@pytest.mark.parametrize("seed", range(40))
def test_random_interleavings_keep_the_breakers_promises(seed: int) -> None:
    run(seed)


def run(seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    store = MemoryStore()
    instances = [Instance(f"i{n}") for n in range(4)]
    now = T0
    committed: list[Effect] = []
    live_probe: tuple[str, datetime] | None = None  # (probe id, lease end) granted last
    remote_up = False
    probes = 0
    for _ in range(400):
        now += timedelta(milliseconds=rng.choice([0, 0, 50, 200, 700]))
        if rng.random() < 0.02:
            remote_up = not remote_up
        inst = rng.choice(instances)
        if inst.seen is None:  # read, and pick what to report
            inst.seen = read_breaker(store, "shipping")
            if inst.probe_id:
                inst.event = "success" if remote_up else "failure"
            else:
                inst.event = rng.choice(["admit", "admit", "failure", "success"])
            continue
        decision = decide(inst, inst.seen, now, rng)
        stale, inst.seen = inst.seen, None
        if decision.row is not None:
            try:
                write_breaker(store, decision.row)
            except Conflict:
                continue  # lost: it reads again next time
        committed.extend(decision.effects)
        if Effect.REOPENED in decision.effects or Effect.CLOSED in decision.effects:
            live_probe = None  # the probe's lease ended with the state it was taken in
        if inst.event != "admit":
            inst.probe_id = ""  # reported
            continue
        if decision.admission == "probe":
            assert live_probe is None or now >= live_probe[1], "two live probe leases"
            live_probe = (decision.probe_id, now + POLICY.probe_lease)
            probes += 1
            inst.probe_id = decision.probe_id
        if stale.state is BreakerState.OPEN and stale.retry_at is not None and now < stale.retry_at:
            assert decision.admission == "wait", "a call admitted during the cool-down"
    row = read_breaker(store, "shipping")
    opens_closes = [e for e in committed if e in (Effect.OPENED, Effect.CLOSED)]
    assert opens_closes.count(Effect.OPENED) == row.opens, "one alert per opening"
    assert all(a != b for a, b in zip(opens_closes, opens_closes[1:], strict=False)), "opens and closes alternate"
    if opens_closes:
        assert opens_closes[0] is Effect.OPENED
    return row.opens, probes
