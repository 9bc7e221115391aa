"""NCRONTAB schedules as the Functions timer trigger reads them.

Six fields, seconds first: ``{second} {minute} {hour} {day} {month} {day-of-week}``; each
field takes ``*``, values, ranges ``a-b``, lists ``a,b``, steps ``*/n`` / ``a-b/n`` / ``a/n``,
and month / day names (``JAN``, ``MON``). Day of week 0-6 from Sunday (7 is Sunday too).
Five-field expressions (no seconds) are accepted with second 0, as NCrontab does.
As in NCrontab, day-of-month and day-of-week must BOTH match (not the cron "or").
A TimeSpan (``hh:mm:ss``) is an interval schedule, as on dedicated plans.

Times are UTC (the host's default on Linux without WEBSITE_TIME_ZONE).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

_MONTHS = {n: i + 1 for i, n in enumerate(
    ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"])}
_DAYS = {n: i for i, n in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}

# (name, low, high, names)
_FIELDS = [
    ("second", 0, 59, None),
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day", 1, 31, None),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
]


class CronError(ValueError):
    pass


def _value(token: str, low: int, high: int, names: dict[str, int] | None, field: str) -> int:
    t = token.strip().upper()
    if names and t in names:
        return names[t]
    if not t.isdigit():
        raise CronError(f"{field}: bad value {token!r}")
    v = int(t)
    if not low <= v <= high:
        raise CronError(f"{field}: {v} out of range {low}-{high}")
    return v


def parse_field(text: str, low: int, high: int, names: dict[str, int] | None = None,
                field: str = "field") -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{field}: empty list item in {text!r}")
        rng, _, step_s = part.partition("/")
        step = 1
        if step_s:
            if not step_s.isdigit() or int(step_s) == 0:
                raise CronError(f"{field}: bad step in {part!r}")
            step = int(step_s)
        if rng == "*":
            a, b = low, high
        elif "-" in rng:
            a_s, b_s = rng.split("-", 1)
            a, b = _value(a_s, low, high, names, field), _value(b_s, low, high, names, field)
            if a > b:
                raise CronError(f"{field}: range {rng!r} is backwards")
        else:
            a = _value(rng, low, high, names, field)
            b = high if step_s else a  # "a/n" means from a to the end, every n
        values.update(range(a, b + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronSchedule:
    expression: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday

    def matches(self, t: datetime) -> bool:
        return (t.second in self.seconds and t.minute in self.minutes and t.hour in self.hours
                and t.day in self.days and t.month in self.months
                and (t.weekday() + 1) % 7 in self.weekdays)

    def next_after(self, after: datetime) -> datetime:
        """The first occurrence strictly after ``after`` (tz kept, microseconds dropped)."""
        t = after.replace(microsecond=0) + timedelta(seconds=1)
        limit = t.replace(year=t.year + 8) if not (t.month == 2 and t.day == 29) else t + timedelta(days=8 * 366)
        while t < limit:
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0, second=0) + timedelta(days=32)).replace(day=1)
                continue
            if t.day not in self.days or (t.weekday() + 1) % 7 not in self.weekdays:
                t = t.replace(hour=0, minute=0, second=0) + timedelta(days=1)
                continue
            if t.hour not in self.hours:
                t = t.replace(minute=0, second=0) + timedelta(hours=1)
                continue
            if t.minute not in self.minutes:
                t = t.replace(second=0) + timedelta(minutes=1)
                continue
            later = [s for s in self.seconds if s >= t.second]
            if not later:
                t = t.replace(second=0) + timedelta(minutes=1)
                continue
            return t.replace(second=min(later))
        raise CronError(f"{self.expression!r} has no occurrence after {after.isoformat()}")

    def min_interval(self, samples: int = 64) -> timedelta:
        """Smallest gap between the next few occurrences (for the useMonitor default)."""
        t = self.next_after(datetime(2026, 1, 1))
        gaps = []
        for _ in range(samples):
            n = self.next_after(t)
            gaps.append(n - t)
            t = n
        return min(gaps)


@dataclass(frozen=True)
class IntervalSchedule:
    expression: str
    interval: timedelta

    def next_after(self, after: datetime) -> datetime:
        return after + self.interval

    def min_interval(self) -> timedelta:
        return self.interval


Schedule = CronSchedule | IntervalSchedule


def parse(expression: str) -> Schedule:
    expr = expression.strip()
    m = re.fullmatch(r"(?:(\d+)\.)?(\d{1,2}):(\d{1,2})(?::(\d{1,2}))?", expr)
    if m:
        d, h, mi, s = m.groups()
        interval = timedelta(days=int(d or 0), hours=int(h), minutes=int(mi), seconds=int(s or 0))
        if interval <= timedelta(0):
            raise CronError(f"interval {expr!r} must be positive")
        return IntervalSchedule(expr, interval)
    parts = expr.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    if len(parts) != 6:
        raise CronError(f"{expression!r}: expected 6 fields (second minute hour day month day-of-week)")
    sets = [parse_field(p, lo, hi, names, name) for p, (name, lo, hi, names) in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in sets[5])
    return CronSchedule(expr, sets[0], sets[1], sets[2], sets[3], sets[4], weekdays)
