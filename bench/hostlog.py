"""The local Functions host's invocation log, read incrementally.

Every invocation prints ``[instance K] 2026-11-22 07:53:35,401 INFO local.host: Executed
'Functions.NAME' (Succeeded, Id=..., Duration=12ms)``. Work items (scheduler plus agent
invocations) and supervisor sweep durations are counted from these lines.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from shared.core.workflows.lanes import LANES

_EXECUTED = re.compile(
    r"^\[instance (\d+)\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ local\.host: Executed 'Functions\.([\w-]+)' "
    r"\((\w+), Id=[^,]*, Duration=(\d+)ms\)")
_EXECUTING = re.compile(
    r"^\[instance (\d+)\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ local\.host: Executing 'Functions\.([\w-]+)' ")

_BASE_WORK_FUNCTIONS = ("scheduler", "scheduler_replies", "agent_inventory", "agent_payment", "agent_shipping")
# and each priority lane's copy of them (shared/core/workflows/lanes.py: scheduler_high, agent_payment_high...)
WORK_FUNCTIONS = tuple(lane.function(f) for lane in LANES for f in _BASE_WORK_FUNCTIONS)


@dataclass
class Invocation:
    instance: int
    at: float  # epoch seconds (host's local clock; same machine)
    function: str
    status: str
    duration_ms: int


@dataclass
class HostLog:
    path: Path
    _offset: int = 0
    _partial: str = ""
    invocations: list[Invocation] = field(default_factory=list)
    executing: list[tuple[int, float, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def poll(self) -> int:
        """Read what was appended since the last call; returns the number of new invocations."""
        with self._lock:
            try:
                with open(self.path, encoding="utf-8", errors="replace") as f:
                    f.seek(self._offset)
                    data = f.read()
                    self._offset = f.tell()
            except OSError:
                return 0
            text = self._partial + data
            lines = text.split("\n")
            self._partial = lines.pop()
            n = 0
            for line in lines:
                if "Execut" not in line:
                    continue
                m = _EXECUTED.match(line)
                if m:
                    self.invocations.append(Invocation(int(m.group(1)), _ts(m.group(2)), m.group(3), m.group(4),
                                                       int(m.group(5))))
                    n += 1
                    continue
                m = _EXECUTING.match(line)
                if m:
                    self.executing.append((int(m.group(1)), _ts(m.group(2)), m.group(3)))
            return n

    def counts(self, since: float = 0.0, until: float = float("inf")) -> Counter[str]:
        """Invocations by function that STARTED in [since, until) (the Executed line's time less its
        duration): a function that settles its message itself logs Executed only after its settlement,
        which the local host makes wait for the receiver's turn (up to its receive wait in a lull), so
        the last replies of a window end after it although their work was in it."""
        with self._lock:
            return Counter(i.function for i in self.invocations if since <= i.at - i.duration_ms / 1000 < until)

    def work_items(self, since: float = 0.0, until: float = float("inf")) -> int:
        c = self.counts(since, until)
        return sum(c[f] for f in WORK_FUNCTIONS)

    def of(self, function: str, since: float = 0.0) -> list[Invocation]:
        with self._lock:
            return [i for i in self.invocations if i.function == function and i.at >= since]

    def ended_since(self, since: float) -> list[Invocation]:
        """Every invocation whose Executed line is at or after ``since``."""
        with self._lock:
            return [i for i in self.invocations if i.at >= since]

    def executing_of(self, function: str, since: float = 0.0) -> list[tuple[int, float, str]]:
        with self._lock:
            return [e for e in self.executing if e[2] == function and e[1] >= since]


def _ts(text: str) -> float:
    # the host logs local time (logging's default asctime); the bench runs on the same machine
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()
