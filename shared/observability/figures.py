"""The console's figures (``GET /api/overview``), kept per process without scanning any table.

Each process (host instance + pid) counts, per minute and per hour, what its committed
transactions recorded (``shared.observability.metrics.parse_committed``: an event exists iff its change
committed, so a lost race or a replayed message never counts) and its Supervisor sweeps:

* ``Submitted`` (``accepted`` events), ``Processed``, ``Failed`` (orders that ended failed:
  ``failed``, or ``compensated`` with outcome failed), ``Compensated``;
* ``Latency``: a histogram of submit -> Processed seconds (the processed event's ``At`` minus
  the state row's ``CreatedAt``, written in the same transaction), in fixed log-spaced buckets
  (:class:`Histogram`), so that rows of different processes and minutes merge by adding;
* ``Sweeps``, ``LastSweepAt``, ``LastDueRows``.

They are rows of partition ``stats`` of ``OrderIndexTable``: RowKey ``m-{yyyymmddHHMM}-{proc}``
and ``h-{yyyymmddHH}-{proc}``. A process owns its rows: it replaces them with its running
totals, the rows that changed in ONE transaction every ``interval`` (5 s) while anything
changed, from a daemon thread. A sweep with no due row changes only the sweep
figures: those go with the next rows sent, or at the latest :data:`IDLE_SWEEP_HEARTBEAT` (60 s)
after the last send, so an idle app writes one stats transaction a minute, not one per sweep.
A flush that fails keeps everything for the next one; a killed process loses at most its last
5 s (and its idle sweeps of the last minute): telemetry, not the ledger. Figures are put in the
minute and hour of the process's clock when recorded. Retention deletes rows after 48 h
(``shared.supervisor.retention``).

Only a store with a ``stats`` attribute holding a :class:`ConsoleStats` records (the Table
store); the in-memory store of the unit tests does not unless a test gives it one.
"""

from __future__ import annotations

import bisect
import copy
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.observability.logs import log_event
from shared.observability.metrics import Committed, parse_time
from shared.observability.periodic import Periodic
from shared.settings import instance_id

FLUSH_SECONDS = 5.0
MAX_ROWS_PER_FLUSH = 100  # the rows one flush sends: one transaction of the store holds at most 100
# An idle sweep (no due row) changes only the sweep count and time: its figures are sent with the
# next rows that change anyway, or at the latest this long after the last send (the console warns
# after 180 s without a sweep), not 5 s after each sweep.
IDLE_SWEEP_HEARTBEAT = timedelta(seconds=60)
# Latency buckets: 10 per decade from 10 ms to 100,000 s (a bucket is 26 % wide: a percentile
# is its bucket's geometric middle, within 13 % of the truth). Index 0 is below 10 ms, the last
# one at or above 100,000 s. Never change them: stored rows are counts per index.
LATENCY_BOUNDS: tuple[float, ...] = tuple(10 ** (i / 10 - 2) for i in range(71))
MINUTE_FORMAT, HOUR_FORMAT = "%Y%m%d%H%M", "%Y%m%d%H"
KEEP_IN_MEMORY = {"m": timedelta(minutes=5), "h": timedelta(hours=2)}  # rows older than this are not recorded into
MAX_UNSENT_AGE = timedelta(hours=48)  # figures a failing store never took are dropped after this (retention's age)
_COUNTED = {"accepted": "submitted", "processed": "processed", "failed": "failed", "compensated": "compensated"}


class Histogram:
    """Counts per latency bucket (:data:`LATENCY_BOUNDS`); text ``index:count,...``."""

    __slots__ = ("counts",)

    def __init__(self, counts: dict[int, int] | None = None) -> None:
        self.counts: dict[int, int] = dict(counts or {})

    def add(self, seconds: float, n: int = 1) -> None:
        i = bisect.bisect_right(LATENCY_BOUNDS, max(seconds, 0.0))
        self.counts[i] = self.counts.get(i, 0) + n

    def merge(self, other: Histogram) -> None:
        for i, n in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def encode(self) -> str:
        return ",".join(f"{i}:{n}" for i, n in sorted(self.counts.items()) if n)

    @classmethod
    def decode(cls, text: Any) -> Histogram:
        """A histogram from its text; malformed pairs are skipped."""
        counts: dict[int, int] = {}
        for pair in str(text or "").split(","):
            index, _, count = pair.partition(":")
            if index.isdigit() and count.isdigit() and int(index) <= len(LATENCY_BOUNDS):
                counts[int(index)] = counts.get(int(index), 0) + int(count)
        return cls(counts)

    def percentile(self, q: float) -> float | None:
        """The ``q`` quantile (0 < q <= 1, nearest rank) as its bucket's middle; None if empty."""
        total = self.total
        if not total:
            return None
        rank = max(1, math.ceil(q * total))
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                return bucket_middle(i)
        return bucket_middle(max(self.counts))  # pragma: no cover - rank <= total


def bucket_middle(index: int) -> float:
    """A bucket's representative seconds: its geometric middle (the edge for the two open ends)."""
    if index <= 0:
        return LATENCY_BOUNDS[0]
    if index >= len(LATENCY_BOUNDS):
        return LATENCY_BOUNDS[-1]
    return math.sqrt(LATENCY_BOUNDS[index - 1] * LATENCY_BOUNDS[index])


@dataclass
class Figures:
    """One process's figures of one minute or hour (one stats row)."""

    submitted: int = 0
    processed: int = 0
    failed: int = 0
    compensated: int = 0
    latency: Histogram = field(default_factory=Histogram)
    sweeps: int = 0
    last_sweep_at: datetime | None = None
    last_due_rows: int | None = None

    def to_row(self, row_key: str) -> dict[str, Any]:
        row: dict[str, Any] = {"RowKey": row_key, "Submitted": self.submitted, "Processed": self.processed,
                               "Failed": self.failed, "Compensated": self.compensated,
                               "Latency": self.latency.encode(), "Sweeps": self.sweeps}
        if self.last_sweep_at is not None:
            row["LastSweepAt"] = self.last_sweep_at.isoformat(timespec="microseconds")
            row["LastDueRows"] = self.last_due_rows
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Figures:
        due = row.get("LastDueRows")
        return cls(submitted=_int(row.get("Submitted")), processed=_int(row.get("Processed")),
                   failed=_int(row.get("Failed")), compensated=_int(row.get("Compensated")),
                   latency=Histogram.decode(row.get("Latency")), sweeps=_int(row.get("Sweeps")),
                   last_sweep_at=parse_time(row.get("LastSweepAt")), last_due_rows=None if due is None else _int(due))

    def merge(self, other: Figures) -> None:
        """Add ``other`` (another process, or another period) to these figures."""
        self.submitted += other.submitted
        self.processed += other.processed
        self.failed += other.failed
        self.compensated += other.compensated
        self.latency.merge(other.latency)
        self.sweeps += other.sweeps
        if other.last_sweep_at is not None and (self.last_sweep_at is None or other.last_sweep_at > self.last_sweep_at):
            self.last_sweep_at, self.last_due_rows = other.last_sweep_at, other.last_due_rows


def _counted(committed: Committed) -> list[str]:
    """The figures a transaction adds one to. ``failed``: an order that ended failed, with
    nothing to undo (event ``failed``) or compensated (event ``compensated`` with the state's
    ``Outcome`` failed; a cancelled order's compensation is not a failure)."""
    names = [_COUNTED[str(ev.get("Event"))] for ev in committed.events if ev.get("Event") in _COUNTED]
    if "compensated" in names and committed.state is not None and committed.state.get("Outcome") == "failed":
        names.append("failed")
    return names


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


# ---- row keys ----------------------------------------------------------------------------------
def minute_stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime(MINUTE_FORMAT)


def hour_stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime(HOUR_FORMAT)


def row_key(kind: str, stamp: str, proc: str) -> str:
    """``m-{yyyymmddHHMM}-{proc}`` or ``h-{yyyymmddHH}-{proc}``."""
    return f"{kind}-{stamp}-{proc}"


def stamp_of(key: str) -> str:
    """The minute or hour stamp of a stats row key."""
    return key.split("-", 2)[1] if key.count("-") >= 2 else ""


def process_id(instance: str | None = None, pid: int | None = None) -> str:
    """This process in a RowKey: the host instance id and the pid, only ``[A-Za-z0-9_.-]``
    (RowKeys forbid ``/ \\ # ?`` and control characters), at most 80 characters."""
    instance = instance_id() if instance is None else instance
    pid = os.getpid() if pid is None else pid
    name = instance if instance.endswith(f"-{pid}") else f"{instance}-{pid}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[-80:]


# ---- the recorder ------------------------------------------------------------------------------
Put = Callable[[Mapping[str, Figures]], None]  # one transaction of upserts (``Store.put_stats``): row key -> figures


class ConsoleStats:
    """This process's figures by minute and hour, flushed to the stats rows by a daemon thread."""

    def __init__(self, put: Put, *, proc: str | None = None, clock: Callable[[], datetime] | None = None,
                 interval: float = FLUSH_SECONDS, background: bool = True) -> None:
        self.put = put
        self.proc = proc or process_id()
        self.clock = clock or (lambda: datetime.now(UTC))
        self.interval = interval
        self.background = background  # False: only explicit flush() calls send (tests)
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._figures: dict[str, Figures] = {}  # row key -> running totals
        self._dirty: set[str] = set()
        self._idle: set[str] = set()  # rows changed by idle sweeps only: sent with the next, or by the heartbeat
        self._sent_at: datetime | None = None  # the clock at the last send
        self._periodic = Periodic(self.flush, interval, name="console-stats", event="stats.flush_failed")

    def record(self, committed: Committed) -> None:
        """Count a committed transaction's order events (and the latency of a processed one)."""
        counts = _counted(committed)
        if not counts:
            return
        latency = None
        if "processed" in counts:
            at = next(parse_time(ev.get("At")) for ev in committed.events if ev.get("Event") == "processed")
            submitted = committed.submitted_at()
            if at is not None and submitted is not None:
                latency = max((at - submitted).total_seconds(), 0.0)
        with self._lock:
            for figures in self._current():
                for name in counts:
                    setattr(figures, name, getattr(figures, name) + 1)
                if latency is not None:
                    figures.latency.add(latency)
        self._started()

    def record_sweep(self, due_rows: int) -> None:
        """Count one Supervisor sweep that read ``due_rows`` due rows. An idle one (none) is sent
        with the next change, or by the heartbeat (:data:`IDLE_SWEEP_HEARTBEAT`)."""
        with self._lock:
            now = self.clock()
            for figures in self._current(now, idle=due_rows == 0):
                figures.sweeps += 1
                figures.last_sweep_at, figures.last_due_rows = now, due_rows
        self._started()

    def _current(self, now: datetime | None = None, *, idle: bool = False) -> list[Figures]:
        """The figures of this minute and this hour (marked changed, or changed by an idle sweep);
        under ``_lock``."""
        now = now or self.clock()
        keys = (row_key("m", minute_stamp(now), self.proc), row_key("h", hour_stamp(now), self.proc))
        (self._idle if idle else self._dirty).update(keys)
        return [self._figures.setdefault(k, Figures()) for k in keys]

    def _started(self) -> None:
        if self.background:
            self._periodic.start()

    def flush(self, *, force: bool = False) -> int:
        """Replace the rows that changed since the last flush (at most 100, oldest first; the
        rest next time), in one transaction; the rows sent. Rows changed only by idle sweeps go
        too if anything else does, if the heartbeat is due, or if ``force``. If it raises, they
        stay changed."""
        with self._flushing:
            with self._lock:
                now = self.clock()
                heartbeat = self._sent_at is None or not self._sent_at <= now < self._sent_at + IDLE_SWEEP_HEARTBEAT
                if self._dirty or heartbeat or force:
                    self._dirty.update(self._idle)
                    self._idle.clear()
                keys = sorted(self._dirty, key=stamp_of)[:MAX_ROWS_PER_FLUSH]
                rows = {k: copy.deepcopy(self._figures[k]) for k in keys}
                self._dirty.difference_update(keys)
            if not rows:
                return 0
            try:
                self.put(rows)
            except BaseException:
                with self._lock:
                    self._dirty.update(keys)
                raise
            with self._lock:
                self._sent_at = now
            self._forget_old()
            return len(rows)

    def _forget_old(self) -> None:
        """Drop sent figures of periods that can get no more counts, and unsent ones older than
        retention keeps (a store failing for two days)."""
        now = self.clock()
        keep_from = {"m": minute_stamp(now - KEEP_IN_MEMORY["m"]), "h": hour_stamp(now - KEEP_IN_MEMORY["h"])}
        unsent_from = {"m": minute_stamp(now - MAX_UNSENT_AGE), "h": hour_stamp(now - MAX_UNSENT_AGE)}
        with self._lock:
            for key in list(self._figures):
                kind, stamp = key[0], stamp_of(key)
                unsent = key in self._dirty or key in self._idle
                if stamp < unsent_from[kind] or (stamp < keep_from[kind] and not unsent):
                    del self._figures[key]
                    self._dirty.discard(key)
                    self._idle.discard(key)

    def figures(self) -> dict[str, Figures]:
        """A copy of the running figures by row key (tests)."""
        with self._lock:
            return {k: Figures.from_row(f.to_row(k)) for k, f in self._figures.items()}


# ---- hooks -------------------------------------------------------------------------------------
def record_committed(store: object, committed: Committed) -> None:
    """Feed ``store``'s recorder (if it has one) with a committed transaction; never raises."""
    stats = getattr(store, "stats", None)
    if isinstance(stats, ConsoleStats):
        try:
            stats.record(committed)
        except Exception as exc:  # noqa: BLE001 - telemetry never fails the order's flow
            log_event(logging.WARNING, "stats.record_failed", error=repr(exc))


def record_sweep(store: object, due_rows: int) -> None:
    """Feed ``store``'s recorder (if it has one) with a Supervisor sweep; never raises."""
    stats = getattr(store, "stats", None)
    if isinstance(stats, ConsoleStats):
        try:
            stats.record_sweep(due_rows)
        except Exception as exc:  # noqa: BLE001 - telemetry never fails the sweep
            log_event(logging.WARNING, "stats.record_failed", error=repr(exc))
