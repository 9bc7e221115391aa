"""ISO 8601 durations as a ``delay`` step writes them (``PT1H``, ``P1DT12H``, ``PT90S``, ``P2W``).

A small, strict reader: days, hours, minutes and seconds (whole or decimal seconds), or weeks
alone. Years and months are refused: their length depends on the calendar.
"""

from __future__ import annotations

import re
from datetime import timedelta

MAX_DELAY = timedelta(days=30)  # the longest delay a workflow may declare

_DURATION = re.compile(r"^P(?:(?P<weeks>\d+)W|(?:(?P<days>\d+)D)?(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?"
                       r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?)$")


class DurationError(ValueError):
    pass


def parse_duration(text: str) -> timedelta:
    """``text`` as a timedelta; raises :class:`DurationError` naming what is wrong."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None or text in ("P", "PT") or text.endswith("T"):
        raise DurationError(f"{text!r} is not an ISO 8601 duration such as PT1H, PT30M, P1DT12H or P2W "
                            f"(years and months are not accepted)")
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    value = timedelta(**parts)
    if value <= timedelta(0):
        raise DurationError(f"{text!r} is zero: a delay must last")
    if value > MAX_DELAY:
        raise DurationError(f"{text!r} is longer than the longest delay, {MAX_DELAY.days} days")
    return value


def to_iso(value: timedelta) -> str:
    """A timedelta as an ISO 8601 duration (``PT1H30M``), as ``GET /api/workflows`` shows it."""
    total = value.total_seconds()
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    out = "P" + (f"{int(days)}D" if days else "")
    time = (f"{int(hours)}H" if hours else "") + (f"{int(minutes)}M" if minutes else "") + \
        (f"{seconds:g}S" if seconds else "")
    return out + ("T" + time if time else "")
