"""Times as the app stores and sends them: ISO-8601 text with microseconds (it sorts as text)."""

from __future__ import annotations

from datetime import datetime


def iso(dt: datetime) -> str:
    return dt.isoformat(timespec="microseconds")


def parse_iso(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value)
