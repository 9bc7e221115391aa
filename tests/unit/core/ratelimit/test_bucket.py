"""The shared rate limiter's decisions (``shared.core.ratelimit.bucket``): the next free slot,
the burst, the hold in the agent, the reserved wait, a 429's pause, and the slot a request was
sent again for. Counted in slots, no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from shared.core.breaker.waiting import probe_tag
from shared.core.ratelimit.bucket import (
    WAKE_LEAD,
    RateRow,
    decide_take,
    decide_throttled,
    reserved_slot,
    wake_time,
)
from shared.core.workflows.ratelimits import RateLimit

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
EIGHT = RateLimit(8)


def take_all(n: int, limit: RateLimit, now: datetime = T0) -> list[tuple[str, datetime]]:
    row, out = RateRow("payment"), list[tuple[str, datetime]]()
    for _ in range(n):
        d = decide_take(row, now, limit)
        assert d.row is not None and d.slot is not None  # every admission is written (a reserved slot too)
        row = d.row
        out.append((d.admission, d.slot))
    return out


def test_a_quiet_remote_calls_now_then_slots_are_one_interval_apart() -> None:
    taken = take_all(20, EIGHT)
    assert taken[0] == ("call", T0)
    slots = [slot for _, slot in taken]
    assert all(b - a == EIGHT.interval for a, b in zip(slots, slots[1:], strict=False))
    assert EIGHT.interval == timedelta(seconds=1.05 / 8)  # 5% under the rate told (MARGIN)
    # within the hold (1 s): wait here (7 slots of 131.25 ms); beyond it: reserved, the step waits on the bus
    assert [a for a, _ in taken] == ["call"] + ["sleep"] * 7 + ["wait"] * 12


def test_a_burst_goes_at_once_after_a_quiet_spell() -> None:
    taken = take_all(6, RateLimit(8, burst=4))
    assert [a for a, _ in taken[:4]] == ["call"] * 4 and taken[4] == ("sleep", T0 + EIGHT.interval)


def test_a_slot_past_the_step_deadline_is_not_slept_for() -> None:
    row = decide_take(RateRow("payment"), T0, EIGHT).row
    assert row is not None
    d = decide_take(row, T0, EIGHT, time_left=timedelta(seconds=0.1))
    assert d.admission == "wait" and d.slot == T0 + EIGHT.interval


def test_a_429_pauses_every_caller_and_only_a_longer_pause_is_written() -> None:
    row = RateRow("payment")
    d = decide_throttled(row, T0, timedelta(seconds=2), EIGHT)
    assert d.row is not None and d.row.paused_until == T0 + timedelta(seconds=2) and d.row.throttled == 1
    assert decide_throttled(d.row, T0, timedelta(seconds=1), EIGHT).row is None
    after = decide_take(d.row, T0 + timedelta(seconds=0.5), EIGHT)
    assert after.admission == "wait" and after.slot == T0 + timedelta(seconds=2)
    assert decide_take(d.row, T0 + timedelta(seconds=3), EIGHT).admission == "call"
    # no Retry-After: one interval
    assert decide_throttled(row, T0, None, EIGHT).slot == T0 + EIGHT.interval


def test_the_row_round_trips() -> None:
    row = RateRow("payment", T0, T0 + timedelta(seconds=1), 3)
    back = RateRow.from_props("payment", {**row.to_props(), "etag": "e1"} | {})
    assert (back.tat, back.paused_until, back.throttled) == (row.tat, row.paused_until, 3)
    assert RateRow.from_props("payment", None) == RateRow("payment")


def test_the_slot_a_request_was_sent_again_for() -> None:
    slot = T0 + timedelta(seconds=1.125)
    # woken WAKE_LEAD before its slot (the resume's tag is the wake time), the call still goes in it
    assert wake_time(slot) == slot - WAKE_LEAD
    assert reserved_slot(f"o1:charge-payment:1:{probe_tag(wake_time(slot))}") == slot
    assert reserved_slot("o1:charge-payment:1") is None and reserved_slot(None) is None
    assert reserved_slot("o1:charge-payment:1:o3") is None


@given(st.lists(st.floats(min_value=0, max_value=0.5), min_size=1, max_size=60),
       st.integers(min_value=1, max_value=5), st.sampled_from([2.0, 8.0, 20.0]))
def test_no_window_holds_more_than_rate_plus_burst(gaps: list[float], burst: int, rate: float) -> None:
    """Whatever the arrivals, the slots handed out put at most ``rate * w + burst`` calls in any
    window of ``w`` seconds (the GCRA's bound), so the remote's limit holds across instances."""
    limit, row, now, slots = RateLimit(rate, burst), RateRow("payment"), T0, []
    for gap in gaps:
        now += timedelta(seconds=gap)
        d = decide_take(row, now, limit)
        assert d.row is not None and d.slot is not None and d.slot >= now
        row = d.row
        slots.append(d.slot)
    slots.sort()
    for i, start in enumerate(slots):
        inside = sum(1 for s in slots[i:] if s - start <= timedelta(seconds=1))
        assert inside <= rate + burst - 1  # never more than the remote's N in a second, after the burst
