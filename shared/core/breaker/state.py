"""A remote's circuit breaker, as pure functions: (row, event, now, policy) -> decision.

Nothing here does I/O (like ``shared.core.statemachine``). A :class:`BreakerRow` is the breaker of one
remote as stored (``shared.storage.breakers``: state table, partition ``breakers``, RowKey = the
agent's name, every write ETag-conditioned). Each ``decide_*`` function returns a
:class:`BreakerDecision`: the verdict, the row to write (``None``: write nothing) and the effects
to run ONLY once that write has won (so that racing instances alert once).

States: ``closed`` -> ``open`` after ``threshold`` failures within ``window`` with no success
between them (a success resets the count: a remote that answers most calls is not down) -> after
``cool_down``, ONE instance takes a probe lease (``half-open``) and calls -> its success closes,
its failure opens again; a probe that dies is replaced once its lease expires.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from shared.core.rows import ETAG, Entity
from shared.core.times import iso, parse_iso


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class Effect(StrEnum):
    OPENED = "opened"  # alert + metric
    CLOSED = "closed"  # alert + metric + re-dispatch the steps waiting on this remote
    REOPENED = "reopened"  # the probe failed: metric, log


Admission = Literal["call", "probe", "wait"]
DEFAULT_CACHE = timedelta(seconds=1)  # BreakerCacheSeconds' default (shared/settings.py)


@dataclass(frozen=True)
class BreakerPolicy:
    """The breaker's settings (``shared/settings.py``: ``Breaker*``)."""

    threshold: int = 5  # failures within ``window`` that open the breaker
    window: timedelta = timedelta(seconds=10)
    cool_down: timedelta = timedelta(seconds=5)  # open -> the first probe
    probe_lease: timedelta = timedelta(seconds=10)  # a probe that has not reported by then is replaced
    max_wait: timedelta = timedelta(seconds=300)  # longest a step waits on an open breaker
    # how long a gate serves a row it read closed with nothing counted (shared.agent.cache);
    # 0: every admission reads the row
    cache: timedelta = DEFAULT_CACHE

    def __post_init__(self) -> None:
        if self.threshold < 1:
            raise ValueError("the breaker's threshold must be at least 1")
        if self.cache < timedelta(0):
            raise ValueError("the breaker's cache must not be negative")
        for name in ("window", "cool_down", "probe_lease", "max_wait"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"the breaker's {name} must be positive")

    @classmethod
    def from_settings(cls, settings: Any) -> BreakerPolicy:
        """From ``shared.settings.Settings`` (anything with ``.int(name)`` and ``[name]``). Settings
        built by hand without ``BreakerCacheSeconds`` get its default (``Settings.from_env`` fills
        in the same declared default)."""
        try:
            cache = timedelta(seconds=float(settings["BreakerCacheSeconds"]))
        except KeyError:
            cache = DEFAULT_CACHE
        return cls(threshold=settings.int("BreakerFailureThreshold"),
                   window=timedelta(seconds=settings.int("BreakerWindowSeconds")),
                   cool_down=timedelta(seconds=settings.int("BreakerCoolDownSeconds")),
                   probe_lease=timedelta(seconds=settings.int("BreakerProbeLeaseSeconds")),
                   max_wait=timedelta(seconds=settings.int("BreakerMaxWaitSeconds")),
                   cache=cache)


@dataclass(frozen=True)
class BreakerRow:
    """One remote's breaker. ``etag`` None: not stored yet (a closed breaker, created on write)."""

    remote: str
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0  # failures counted in the window that starts at ``window_start``
    window_start: datetime | None = None
    opened_at: datetime | None = None
    retry_at: datetime | None = None  # open: the end of the cool-down
    probe_id: str = ""  # half-open: the probe lease
    probe_by: str = ""
    probe_until: datetime | None = None
    opens: int = 0  # how many times it opened
    last_fault: str = ""
    changed_at: datetime | None = None
    wake_at: datetime | None = None  # a waiting step is due to be re-dispatched then (see decide_wake)
    etag: str | None = None

    def to_props(self) -> Entity:
        """Properties to store (RowKey included; absent values left out)."""
        props: Entity = {"RowKey": self.remote, "State": self.state.value, "Failures": self.failures,
                                 "Opens": self.opens, "ProbeId": self.probe_id, "ProbeBy": self.probe_by,
                                 "LastFault": self.last_fault}
        for name, value in (("WindowStart", self.window_start), ("OpenedAt", self.opened_at),
                            ("RetryAt", self.retry_at), ("ProbeUntil", self.probe_until),
                            ("ChangedAt", self.changed_at), ("WakeAt", self.wake_at)):
            if value is not None:
                props[name] = iso(value)
        return props

    @classmethod
    def from_props(cls, remote: str, props: Entity | None) -> BreakerRow:
        """The stored row (``None``: never written -> closed)."""
        if props is None:
            return cls(remote)
        return cls(remote=remote, state=BreakerState(props.get("State", "closed")),
                   failures=int(props.get("Failures", 0)), window_start=_time(props.get("WindowStart")),
                   opened_at=_time(props.get("OpenedAt")), retry_at=_time(props.get("RetryAt")),
                   probe_id=str(props.get("ProbeId", "")), probe_by=str(props.get("ProbeBy", "")),
                   probe_until=_time(props.get("ProbeUntil")), opens=int(props.get("Opens", 0)),
                   last_fault=str(props.get("LastFault", "")), changed_at=_time(props.get("ChangedAt")),
                   wake_at=_time(props.get("WakeAt")), etag=props.get(ETAG))


@dataclass(frozen=True)
class BreakerDecision:
    """``row``: what to write (conditioned on the ETag it was decided on), None: nothing.
    ``effects`` run only after that write won. ``admission``/``until``/``probe_id``: for ``admit``."""

    verdict: str
    row: BreakerRow | None = None
    effects: tuple[Effect, ...] = field(default_factory=tuple)
    admission: Admission | None = None
    until: datetime | None = None  # wait: when to look again
    probe_id: str = ""  # probe: the lease to report the outcome under
    failures: int = 0  # call: the failures counted when it was admitted (a success then resets them)
    opening: int = 0  # wait: the opening (``Opens``) the breaker is in


def decide_admit(row: BreakerRow, now: datetime, policy: BreakerPolicy, instance: str,
                 new_probe_id: str | None = None) -> BreakerDecision:
    """May this instance call the remote now? ``call``, ``probe`` (after the lease write won) or ``wait``."""
    if row.state is BreakerState.CLOSED:
        return BreakerDecision("closed", admission="call", failures=row.failures)
    if row.state is BreakerState.OPEN and row.retry_at is not None and now < row.retry_at:
        return BreakerDecision("open: cooling down", admission="wait", until=row.retry_at, opening=row.opens)
    if row.state is BreakerState.HALF_OPEN and row.probe_until is not None and now < row.probe_until:
        return BreakerDecision("half-open: a probe is out", admission="wait", until=row.probe_until,
                               opening=row.opens)
    probe_id = new_probe_id or uuid.uuid4().hex
    taken = replace(row, state=BreakerState.HALF_OPEN, probe_id=probe_id, probe_by=instance,
                    probe_until=now + policy.probe_lease, changed_at=now)
    verdict = "probe: cool-down over" if row.state is BreakerState.OPEN else "probe: the last probe's lease expired"
    return BreakerDecision(verdict, row=taken, admission="probe", probe_id=probe_id)


def decide_failure(row: BreakerRow, now: datetime, policy: BreakerPolicy, fault: str,
                   probe_id: str = "") -> BreakerDecision:
    """A call failed (transport error, timeout, 408, 5xx): count it, open, or reopen after a probe."""
    if row.state is BreakerState.HALF_OPEN:
        if probe_id and probe_id == row.probe_id:
            return BreakerDecision("probe failed: open again", row=_opened(row, now, policy, fault, reopen=True),
                                   effects=(Effect.REOPENED,))
        return BreakerDecision("half-open: not the current probe, ignored")
    if row.state is BreakerState.OPEN:
        return BreakerDecision("open: ignored (a call from before the open)")
    in_window = row.window_start is not None and now - row.window_start < policy.window
    failures = row.failures + 1 if in_window else 1
    window_start = row.window_start if in_window else now
    if failures >= policy.threshold:
        opened = _opened(replace(row, failures=failures, window_start=window_start), now, policy, fault, reopen=False)
        return BreakerDecision(f"{failures} failures within the window: open", row=opened,
                               effects=(Effect.OPENED,))
    counted = replace(row, failures=failures, window_start=window_start, last_fault=fault, changed_at=now)
    return BreakerDecision(f"failure {failures} of {policy.threshold}", row=counted)


def decide_success(row: BreakerRow, now: datetime, probe_id: str = "") -> BreakerDecision:
    """A call got an answer (2xx or a rejection): a probe's closes a half-open breaker."""
    if row.state is BreakerState.HALF_OPEN and probe_id:
        closed = replace(row, state=BreakerState.CLOSED, failures=0, window_start=None, retry_at=None,
                         probe_id="", probe_by="", probe_until=None, changed_at=now)
        return BreakerDecision("probe succeeded: closed", row=closed, effects=(Effect.CLOSED,))
    return BreakerDecision(f"{row.state.value}: nothing to record")


def decide_reset(row: BreakerRow, now: datetime) -> BreakerDecision:
    """A call got an answer while failures were being counted: the count starts again (only a
    run of ``threshold`` failures with no answer between them opens the breaker)."""
    if row.state is BreakerState.CLOSED and row.failures > 0:
        return BreakerDecision("answered: failures reset",
                               row=replace(row, failures=0, window_start=None, changed_at=now))
    return BreakerDecision(f"{row.state.value}: nothing to reset")


def decide_wake(row: BreakerRow, until: datetime) -> BreakerDecision:
    """Should this waiting step be the one re-dispatched at ``until`` (the end of the cool-down or
    of the probe's lease)? Only one step per ``until``, across every instance: its re-dispatch
    drives the next probe when no other traffic does. ``wake`` (the write won) or ``no``."""
    if row.state is BreakerState.CLOSED:
        return BreakerDecision("closed: the closer resumes every waiting step")
    if row.wake_at is not None and row.wake_at >= until:
        return BreakerDecision("another waiting step wakes by then")
    return BreakerDecision("wake", row=replace(row, wake_at=until), admission="wait", until=until)


def _opened(row: BreakerRow, now: datetime, policy: BreakerPolicy, fault: str, *, reopen: bool) -> BreakerRow:
    return replace(row, state=BreakerState.OPEN, opened_at=row.opened_at if reopen else now,
                   retry_at=now + policy.cool_down, probe_id="", probe_by="", probe_until=None,
                   opens=row.opens if reopen else row.opens + 1, last_fault=fault, changed_at=now)


def _time(value: Any) -> datetime | None:
    return parse_iso(str(value)) if value else None
