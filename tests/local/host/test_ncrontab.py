from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local.host.ncrontab import CronError, CronSchedule, IntervalSchedule, parse


def nxt(expr: str, after: datetime) -> datetime:
    return parse(expr).next_after(after)


def test_every_15_seconds():
    assert nxt("*/15 * * * * *", datetime(2026, 1, 1, 0, 0, 14, 500000)) == datetime(2026, 1, 1, 0, 0, 15)
    assert nxt("*/15 * * * * *", datetime(2026, 1, 1, 0, 0, 15)) == datetime(2026, 1, 1, 0, 0, 30)
    assert nxt("*/15 * * * * *", datetime(2026, 1, 1, 0, 0, 45)) == datetime(2026, 1, 1, 0, 1, 0)


def test_keeps_timezone():
    t = datetime(2026, 1, 1, 23, 59, 59, tzinfo=UTC)
    assert nxt("0 0 0 * * *", t) == datetime(2026, 1, 2, tzinfo=UTC)


def test_ranges_lists_steps():
    s = parse("5,10 10-20/5 1-3 * * *")
    assert s.seconds == {5, 10}
    assert s.minutes == {10, 15, 20}
    assert s.hours == {1, 2, 3}
    assert parse("7/20 * * * * *").seconds == {7, 27, 47}
    assert nxt("5,10 10-20/5 1-3 * * *", datetime(2026, 1, 1, 3, 20, 10)) == datetime(2026, 1, 2, 1, 10, 5)


def test_names_and_weekdays():
    # 2026-11-21 is a Saturday
    assert nxt("0 30 9 * * MON-FRI", datetime(2026, 11, 21, 10)) == datetime(2026, 11, 23, 9, 30)
    assert nxt("0 0 12 * * 0", datetime(2026, 11, 21)) == datetime(2026, 11, 22, 12)
    assert parse("0 0 12 * * 7").weekdays == {0}  # 7 is Sunday too
    assert nxt("0 0 0 1 JAN *", datetime(2026, 3, 1)) == datetime(2027, 1, 1)
    assert nxt("0 0 0 1 jan,jul *", datetime(2026, 3, 1)) == datetime(2026, 7, 1)


def test_day_and_weekday_must_both_match():
    # the 13th that is a Friday: NCrontab needs both fields (2026-11-13 is a Friday)
    assert nxt("0 0 0 13 * FRI", datetime(2026, 3, 1)) == datetime(2026, 3, 13)
    assert nxt("0 0 0 13 * FRI", datetime(2026, 3, 14)) == datetime(2026, 11, 13)


def test_leap_day():
    assert nxt("0 0 0 29 2 *", datetime(2026, 3, 1)) == datetime(2028, 2, 29)


def test_five_fields_means_second_zero():
    assert nxt("*/5 * * * *", datetime(2026, 1, 1, 0, 0, 1)) == datetime(2026, 1, 1, 0, 5, 0)


def test_timespan_interval():
    s = parse("00:00:30")
    assert isinstance(s, IntervalSchedule)
    assert s.next_after(datetime(2026, 1, 1)) == datetime(2026, 1, 1, 0, 0, 30)
    assert parse("1.02:00:00").interval == timedelta(days=1, hours=2)


@pytest.mark.parametrize("bad", [
    "* * * *", "* * * * * * *", "60 * * * * *", "* 60 * * * *", "* * 24 * * *", "* * * 0 * *",
    "* * * * 13 *", "* * * * * 8", "*/0 * * * * *", "5-3 * * * * *", "a * * * * *", "1,,2 * * * * *",
    "* * * * FOO *", "00:00:00",
])
def test_rejects_bad_expressions(bad):
    with pytest.raises(CronError):
        parse(bad)


def test_impossible_date_raises():
    with pytest.raises(CronError):
        nxt("0 0 0 31 2 *", datetime(2026, 1, 1))


def test_min_interval():
    assert parse("*/15 * * * * *").min_interval() == timedelta(seconds=15)
    assert parse("0 */5 * * * *").min_interval() == timedelta(minutes=5)
    assert parse("0,1 * * * * *").min_interval() == timedelta(seconds=1)


def _field(lo: int, hi: int) -> st.SearchStrategy[str]:
    value = st.integers(lo, hi).map(str)
    rng = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(lambda t: f"{min(t)}-{max(t)}")
    step = st.tuples(st.sampled_from(["*", str(lo)]), st.integers(1, hi - lo + 1)).map(lambda t: f"{t[0]}/{t[1]}")
    item = st.one_of(st.just("*"), value, rng, step)
    return st.lists(item, min_size=1, max_size=3).map(",".join)


@settings(max_examples=150, deadline=None)
@given(sec=_field(0, 59), minute=_field(0, 59), hour=_field(0, 23), dow=_field(0, 6),
       start=st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2030, 12, 31)))
def test_next_after_agrees_with_brute_force(sec, minute, hour, dow, start):
    expr = f"{sec} {minute} {hour} * * {dow}"
    s = parse(expr)
    assert isinstance(s, CronSchedule)
    got = s.next_after(start)
    assert got > start and s.matches(got)
    # nothing matches in between: walk minute by minute, checking every second of matching minutes
    t = start.replace(microsecond=0) + timedelta(seconds=1)
    while t < got:
        if t.minute in s.minutes and t.hour in s.hours and (t.weekday() + 1) % 7 in s.weekdays:
            assert not s.matches(t), (expr, start, got, t)
            t += timedelta(seconds=1)
        else:
            t = t.replace(second=0) + timedelta(minutes=1)

