"""A remote's rate limit: ``perSecond`` and ``burst``, declared in ``workflows/agents.json`` and
overridden by the app setting ``RemoteRateLimits`` (``shared.core.ratelimit`` has the design)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta


class RateLimitError(ValueError):
    """A rate limit that cannot be used: ``where`` (a file's field, or a setting) and ``reason``."""

    def __init__(self, where: str, reason: str) -> None:
        self.where, self.reason = where, reason
        super().__init__(f"{where}: {reason}")


# The app paces its calls this much under the rate it is told: a remote counting in a sliding
# window of one second refuses the (N+1)th call that arrives within a second of the first, and
# the calls' travel times vary by some milliseconds (measured: without it, 13 of 163 charges got
# 429 at 8/s, tests/e2e/test_rate_limit.py). 5% is 6 ms an interval at 8/s, 50 ms over a window.
MARGIN = 0.05


@dataclass(frozen=True)
class RateLimit:
    """``per_second`` calls, of which ``burst`` may go at once after a quiet spell."""

    per_second: float
    burst: int = 1

    def __post_init__(self) -> None:
        if not self.per_second > 0 or self.per_second != self.per_second:
            raise ValueError(f"perSecond must be > 0, not {self.per_second!r}")
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, not {self.burst!r}")

    @property
    def interval(self) -> timedelta:
        """The spacing of the calls: one per ``1/per_second``, ``MARGIN`` more."""
        return timedelta(seconds=(1 + MARGIN) / self.per_second)

    @property
    def tolerance(self) -> timedelta:
        return (self.burst - 1) * self.interval


_ITEM = re.compile(r"^\s*([a-z][a-z0-9-]*)\s*=\s*(?:(off)|(\d+(?:\.\d+)?)\s*/\s*s)\s*$")


def parse_limits(text: str, agents: tuple[str, ...], setting: str = "RemoteRateLimits") -> dict[str, RateLimit | None]:
    """``payment=8/s,shipping=20/s`` -> {remote: limit}; ``remote=off`` -> None (no limit). Raises
    :class:`RateLimitError` naming the setting, the item and what is wrong with it."""
    limits: dict[str, RateLimit | None] = {}
    for item in (part for part in text.split(",") if part.strip()):
        match = _ITEM.match(item)
        if match is None:
            raise RateLimitError(f"app setting {setting}", f"{item.strip()!r} is not NAME=N/s or NAME=off "
                                 "(e.g. payment=8/s,shipping=20/s)")
        name, off, rate = match.groups()
        if name not in agents:
            raise RateLimitError(f"app setting {setting}", f"{name!r} is not an agent of workflows/agents.json "
                                 f"(known: {', '.join(agents)})")
        if name in limits:
            raise RateLimitError(f"app setting {setting}", f"{name!r} is given twice")
        if off:
            limits[name] = None
            continue
        if float(rate) <= 0:
            raise RateLimitError(f"app setting {setting}", f"{item.strip()!r}: the rate must be > 0 (or off)")
        limits[name] = RateLimit(float(rate))
    return limits


def effective_limits(declared: dict[str, RateLimit | None], setting: str,
                     setting_name: str = "RemoteRateLimits") -> dict[str, RateLimit]:
    """The limit of each remote: the setting's rate over the declared one (keeping the declared
    burst); only the remotes that end up limited."""
    overrides = parse_limits(setting, tuple(declared), setting_name)
    out: dict[str, RateLimit] = {}
    for remote, limit in declared.items():
        if remote in overrides:
            new = overrides[remote]
            limit = None if new is None else RateLimit(new.per_second, limit.burst if limit else 1)
        if limit is not None:
            out[remote] = limit
    return out
