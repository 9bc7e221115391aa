"""Read the official Service Bus emulator's Config.json (UserConfig → Namespaces → Queues).

Only queues are served. Topics may be present in the file; they are ignored.
Durations are ISO-8601 (``PT1M``, ``P1D``, ``P10675199DT2H48M5.4775807S``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_DURATION = re.compile(
    r"^P(?:(?P<weeks>\d+(?:\.\d+)?)W)?(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)

# TimeSpan.MaxValue, the "never" of Service Bus; anything this long means no expiry.
NEVER_MS = 922337203685477


def parse_duration_ms(text: str | int | float | None, default_ms: int) -> int:
    """ISO-8601 duration → milliseconds. Also accepts .NET "d.hh:mm:ss" and plain seconds."""
    if text is None or text == "":
        return default_ms
    if isinstance(text, (int, float)):
        return int(float(text) * 1000)
    s = str(text).strip().upper()
    m = _DURATION.match(s)
    if m and s not in ("P", "PT"):
        parts = {k: float(v) for k, v in m.groupdict().items() if v}
        secs = (parts.get("weeks", 0) * 7 * 86400 + parts.get("days", 0) * 86400 + parts.get("hours", 0) * 3600
                + parts.get("minutes", 0) * 60 + parts.get("seconds", 0))
        return min(int(round(secs * 1000)), NEVER_MS)
    # .NET TimeSpan form: [d.]hh:mm:ss[.fff]
    m2 = re.match(r"^(?:(\d+)\.)?(\d+):(\d+):(\d+(?:\.\d+)?)$", s)
    if m2:
        d, h, mi, se = m2.groups()
        secs = int(d or 0) * 86400 + int(h) * 3600 + int(mi) * 60 + float(se)
        return min(int(round(secs * 1000)), NEVER_MS)
    raise ValueError(f"not an ISO-8601 duration: {text!r}")


def _bool(v: Any, default: bool) -> bool:
    if v is None:
        return default
    if isinstance(v, str):
        return v.strip().lower() == "true"
    return bool(v)


@dataclass(frozen=True)
class QueueConfig:
    name: str
    max_delivery_count: int = 10
    lock_duration_ms: int = 60_000
    default_ttl_ms: int = NEVER_MS
    duplicate_window_ms: int = 10 * 60_000
    requires_duplicate_detection: bool = False
    requires_session: bool = False
    dead_lettering_on_expiration: bool = False

    @classmethod
    def from_json(cls, q: dict[str, Any]) -> QueueConfig:
        p = q.get("Properties") or {}
        return cls(
            name=str(q["Name"]),
            max_delivery_count=int(p.get("MaxDeliveryCount", 10) or 10),
            lock_duration_ms=parse_duration_ms(p.get("LockDuration"), 60_000),
            default_ttl_ms=parse_duration_ms(p.get("DefaultMessageTimeToLive"), NEVER_MS),
            duplicate_window_ms=parse_duration_ms(p.get("DuplicateDetectionHistoryTimeWindow"), 10 * 60_000),
            requires_duplicate_detection=_bool(p.get("RequiresDuplicateDetection"), False),
            requires_session=_bool(p.get("RequiresSession"), False),
            dead_lettering_on_expiration=_bool(p.get("DeadLetteringOnMessageExpiration"), False),
        )


@dataclass(frozen=True)
class EmulatorConfig:
    namespace: str
    queues: tuple[QueueConfig, ...]


def load_config(path: str | Path) -> EmulatorConfig:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    user = data.get("UserConfig", data)
    namespaces = user.get("Namespaces") or []
    if not namespaces:
        raise ValueError(f"{path}: no UserConfig.Namespaces")
    queues: list[QueueConfig] = []
    seen: set[str] = set()
    for ns in namespaces:
        for q in ns.get("Queues") or []:
            qc = QueueConfig.from_json(q)
            if qc.name.lower() in seen:
                raise ValueError(f"{path}: queue {qc.name!r} declared twice")
            seen.add(qc.name.lower())
            queues.append(qc)
    return EmulatorConfig(namespace=str(namespaces[0].get("Name", "sbemulatorns")), queues=tuple(queues))
