"""The chaos run's outage report (issue 14): what one remote's outage under load cost.

After the run, from the simulator's down window and call journal (``/_stats``, ``GET /_calls``),
every order's whole history and the host log's ``breaker.open``/``breaker.closed`` lines:

1. ``deadRemoteCalls``: the calls the dead remote received inside its down window, against the
   bound ``BreakerFailureThreshold + ceil(outage / BreakerCoolDownSeconds)``, before and after the
   breaker's first opening;
2. ``failureCountIncrements``: attempts of the remote's steps that overlapped the outage and ended
   in a FailureCount increment, each attributed by what the simulator saw for its key then:
   ``outage`` (a ``down``/``reset`` call), ``otherFault`` or ``noFaultSeen``;
3. ``heldForOperator``: orders held on the remote's step after failures that overlapped the
   outage (``attributable``: one of them met the dead service);
4. ``drain``: the orders the outage touched and the seconds from the remote's return until the last
   of them ended;
5. ``historyWhileWaiting``: the waits and events of the orders that waited, against the probe
   cycles (a wait is one state: neither grows with the outage's length).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.chaos_ledger import parse_time, view_effects
from shared.settings import SETTINGS

OUTAGE_FAULTS = ("down", "reset")  # the simulator's faults of a dead service
ENDS = ("processed", "held", "failed", "compensated")  # events after which an order no longer waits
FORWARD_ENDS = ("stepDone", "stepFailed", "redriven", "stepWaiting")
COMPENSATION_ENDS = ("compensationDone", "compensationFailed", "compensationRedriven")
PROCESS_FAULTS = ("kill", "restart-servicebus", "restart-azurite")  # the runner's fault events that lose replies
SLACK = timedelta(seconds=0.5)  # clock granularity between the simulator's and the app's timestamps


@dataclass(frozen=True)
class OutageWindow:
    """When ``service`` was down, by the simulator's clock."""

    service: str
    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    def overlaps(self, start: datetime | None, end: datetime | None) -> bool:
        """Whether [start, end] (an open end: still running) meets the window."""
        lo = start or end
        return lo is not None and lo <= self.end + SLACK and (end is None or end >= self.start - SLACK)


def outage_window(down_windows: Iterable[Mapping[str, Any]], service: str,
                  now: datetime | None = None) -> OutageWindow | None:
    """The first down window of ``service`` (one still open ends ``now``)."""
    for w in down_windows:
        start = parse_time(w.get("from"))
        if w.get("service") != service or start is None:
            continue
        return OutageWindow(service, start, parse_time(w.get("to")) or now or datetime.now(UTC))
    return None


@dataclass(frozen=True)
class BreakerSettings:
    threshold: int
    cool_down: float

    @classmethod
    def from_settings(cls, values: Mapping[str, str]) -> BreakerSettings:
        """The effective values: the stack's settings, else the declared defaults (shared/settings.py)."""
        defaults = {s.name: s.default for s in SETTINGS}

        def value(name: str) -> str:
            return str(values.get(name) or defaults.get(name) or "0")

        return cls(int(value("BreakerFailureThreshold")), float(value("BreakerCoolDownSeconds")))

    def bound(self, seconds: float) -> int:
        """The threshold, then one probe per cool-down for ``seconds``."""
        return self.threshold + (math.ceil(seconds / self.cool_down) if self.cool_down > 0 else 0)


def dead_remote_calls(calls: Iterable[Mapping[str, Any]], window: OutageWindow, breaker: BreakerSettings,
                      opened_at: datetime | None = None) -> dict[str, Any]:
    """The calls ``window.service`` received while down (the journal's ``down``/``reset`` calls)."""
    times = sorted(t for c in calls if c.get("service") == window.service and c.get("fault") in OUTAGE_FAULTS
                   and (t := parse_time(c.get("at"))) is not None
                   and window.start - SLACK <= t <= window.end + SLACK)
    n, first = len(times), breaker.threshold
    out: dict[str, Any] = {
        "calls": n, "bound": breaker.bound(window.seconds), "withinBound": n <= breaker.bound(window.seconds),
        "threshold": first, "coolDownSeconds": breaker.cool_down, "outageSeconds": round(window.seconds, 2),
        "firstThreshold": min(n, first), "afterFirstThreshold": max(0, n - first),
        "offsetsAfterFirstThreshold": [round((t - window.start).total_seconds(), 2) for t in times[first:]][:100],
    }
    if opened_at is not None:
        out["beforeOpen"] = sum(1 for t in times if t < opened_at)
        out["afterOpen"] = n - out["beforeOpen"]
        out["openedAfterSeconds"] = round((opened_at - window.start).total_seconds(), 2)
    return out


@dataclass
class Attempt:
    """One attempt of a step (or of its compensation), from an order's history."""

    order_id: str
    step: str
    attempt: int
    compensation: bool
    started: datetime | None
    ended: datetime | None = None
    end_event: str | None = None
    increments: bool = False  # its end added one to FailureCount (or the compensation's count)

    @property
    def key_step(self) -> tuple[str, str, bool]:
        return (self.order_id, self.step, self.compensation)


def _increments(kind: str, detail: Mapping[str, Any]) -> bool:
    if kind in ("redriven", "compensationRedriven"):
        return True
    if kind == "stepFailed":
        return bool(detail.get("outcomeUnknown"))  # a timeout; a rejection adds nothing
    return kind == "compensationFailed" and "timed out" in str(detail.get("reason") or "")


def attempts_of(order_id: str, history: Iterable[Mapping[str, Any]], steps: set[str]) -> list[Attempt]:
    """The attempts of ``steps`` in one order's history, in order, with how each ended."""
    found: dict[tuple[str, int, bool], Attempt] = {}
    out: list[Attempt] = []
    for ev in history:
        kind, step, at = str(ev.get("event") or ""), ev.get("step"), parse_time(ev.get("at"))
        if step not in steps or ev.get("attempt") is None:
            continue
        detail = ev.get("detail") or {}
        comp = kind.startswith("compensation") or (kind == "stepWaiting" and bool(detail.get("compensation")))
        slot = (step, int(ev["attempt"]), comp)
        if kind in ("dispatched", "compensationDispatched"):
            found[slot] = Attempt(order_id, step, slot[1], comp, at)
            out.append(found[slot])
        elif kind in FORWARD_ENDS or kind in COMPENSATION_ENDS:
            a = found.get(slot)
            if a is None:  # its dispatch is not in the history read (or a redelivered end)
                a = found[slot] = Attempt(order_id, step, slot[1], comp, None)
                out.append(a)
            if a.end_event is None:
                a.ended, a.end_event, a.increments = at, kind, _increments(kind, detail)
    return out


def outage_steps(view: Mapping[str, Any] | None, service: str) -> set[str]:
    """The steps of the order's workflow that call ``service``."""
    return {name for name, (svc, _, _) in view_effects(view).items() if svc == service}


def key_parts(key: str) -> tuple[str, str, bool]:
    """(order id, step, compensation) of an idempotency key ``{orderId}[:g{n}]:{step}[:compensate]``."""
    parts = key.split(":")
    compensation = len(parts) > 2 and parts[-1] == "compensate"
    return parts[0], parts[-2] if compensation else parts[-1], compensation


def index_calls(calls: Iterable[Mapping[str, Any]], service: str) -> dict[tuple[str, str, bool], list[Any]]:
    """The journal's calls to ``service`` by (order, step, compensation): [(time, fault)]."""
    index: dict[tuple[str, str, bool], list[Any]] = {}
    for c in calls:
        at = parse_time(c.get("at"))
        if c.get("service") == service and at is not None and c.get("idempotencyKey"):
            index.setdefault(key_parts(str(c["idempotencyKey"])), []).append((at, c.get("fault")))
    return index


def cause_of(attempt: Attempt, calls: Mapping[tuple[str, str, bool], list[Any]]) -> str:
    """What the simulator saw during the attempt: ``outage``, ``otherFault`` or ``noFaultSeen``."""
    # No slack (one clock): the next attempt's first call may follow the redrive by 0.2 s.
    lo = attempt.started or attempt.ended or datetime.min.replace(tzinfo=UTC)
    hi = attempt.ended or datetime.max.replace(tzinfo=UTC)
    faults = {f for at, f in calls.get(attempt.key_step, []) if lo <= at <= hi and f}
    if faults & set(OUTAGE_FAULTS):
        return "outage"
    return "otherFault" if faults else "noFaultSeen"


Histories = Mapping[str, tuple[Mapping[str, Any] | None, list[dict[str, Any]]]]  # order id -> (view, history)


def failure_increments(histories: Histories, window: OutageWindow,
                       calls: Mapping[tuple[str, str, bool], list[Any]],
                       process_faults: Iterable[datetime] = ()) -> dict[str, Any]:
    """The FailureCount increments of the outage service's attempts that overlapped the outage;
    ``alsoProcessFault``: the attributable ones during which a process fault (a SIGKILL of an
    instance, a restart of the emulator or Azurite) happened too, and may have lost the reply."""
    faults_at = sorted(process_faults)
    also = 0
    causes: Counter[str] = Counter()
    by_event: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    for oid, (view, history) in sorted(histories.items()):
        for a in attempts_of(oid, history, outage_steps(view, window.service)):
            if not a.increments or not window.overlaps(a.started, a.ended):
                continue
            cause = cause_of(a, calls)
            causes[cause] += 1
            lo, hi = a.started or a.ended, a.ended or window.end
            also += cause == "outage" and any(lo is not None and lo <= t <= hi for t in faults_at)
            by_event[str(a.end_event)] += 1
            if len(examples) < 20:
                examples.append({"orderId": oid, "step": a.step, "attempt": a.attempt, "compensation": a.compensation,
                                 "event": a.end_event, "cause": cause})
    return {"overlapping": sum(causes.values()), "attributable": causes["outage"], "alsoProcessFault": also,
            "otherFault": causes["otherFault"], "noFaultSeen": causes["noFaultSeen"],
            "byEvent": dict(by_event), "examples": examples}


def _held_cause(attempts: list[Attempt], step: str, held_at: datetime | None, window: OutageWindow,
                calls: Mapping[tuple[str, str, bool], list[Any]]) -> str | None:
    """Why an order was held on ``step``: ``outage`` if its failing attempt, or an earlier attempt
    of the step whose failure counted toward the hold, met the outage; else the failing attempt's
    cause if it overlapped the outage; None: the hold has nothing to do with the outage."""
    before = [a for a in attempts if a.step == step and not a.compensation and a.increments
              and (held_at is None or a.ended is None or a.ended <= held_at)]
    failed = [a for a in before if a.end_event == "stepFailed"]
    if not failed:
        return None
    touching = [a for a in before if window.overlaps(a.started, a.ended)]
    if any(cause_of(a, calls) == "outage" for a in touching):
        return "outage"
    return cause_of(failed[-1], calls) if failed[-1] in touching else None


def held_for_operator(histories: Histories, window: OutageWindow,
                      calls: Mapping[tuple[str, str, bool], list[Any]]) -> dict[str, Any]:
    """Orders held (``held`` event) on the outage service's step after failures that overlapped the
    outage (``attributable``: one of them met the dead service)."""
    causes: dict[str, str] = {}
    for oid, (view, history) in sorted(histories.items()):
        steps = outage_steps(view, window.service)
        attempts = attempts_of(oid, history, steps)
        for ev in history:
            if ev.get("event") == "held" and ev.get("step") in steps:
                cause = _held_cause(attempts, str(ev["step"]), parse_time(ev.get("at")), window, calls)
                if cause is not None:
                    causes[oid] = cause
    counted = Counter(causes.values())
    return {"count": len(causes), "attributable": counted["outage"], "otherFault": counted["otherFault"],
            "noFaultSeen": counted["noFaultSeen"], "orders": sorted(causes)[:20]}


def _touched(view: Mapping[str, Any] | None, history: list[dict[str, Any]], window: OutageWindow) -> str | None:
    """``waited`` (a stepWaiting on the outage service's step during the outage), ``inFlight`` (an
    attempt of that step overlapped it) or None."""
    steps = outage_steps(view, window.service)
    for ev in history:
        at = parse_time(ev.get("at"))
        if (ev.get("event") == "stepWaiting" and ev.get("step") in steps and at is not None
                and window.start - SLACK <= at <= window.end + SLACK):
            return "waited"
    oid = str((view or {}).get("orderId") or "")
    if any(window.overlaps(a.started, a.ended) for a in attempts_of(oid, history, steps)):
        return "inFlight"
    return None


def drain(histories: Histories, window: OutageWindow) -> dict[str, Any]:
    """The orders the outage touched, and how long after the remote's return the last one ended."""
    touched: Counter[str] = Counter()
    ended_as: Counter[str] = Counter()
    after: list[float] = []
    not_ended: list[str] = []
    for oid, (view, history) in sorted(histories.items()):
        how = _touched(view, history, window)
        if how is None:
            continue
        touched[how] += 1
        end = next((ev for ev in history if ev.get("event") in ENDS and (t := parse_time(ev.get("at"))) is not None
                    and t >= window.start - SLACK), None)
        if end is None:
            not_ended.append(oid)
            continue
        ended_as[str(end["event"])] += 1
        ended_at = parse_time(end["at"])
        assert ended_at is not None
        after.append(max(0.0, (ended_at - window.end).total_seconds()))
    return {"orders": sum(touched.values()), "waited": touched["waited"], "inFlight": touched["inFlight"],
            "endedAs": dict(ended_as), "notEnded": len(not_ended), "notEndedOrders": not_ended[:20],
            "seconds": round(max(after), 2) if after else None,
            "p50Seconds": round(statistics.median(after), 2) if after else None}


def history_while_waiting(histories: Histories, window: OutageWindow, breaker: BreakerSettings) -> dict[str, Any]:
    """What the orders that waited on the remote wrote to their history during the outage: events
    and waits (``stepWaiting`` on the remote's steps) per order, against the number of probe cycles
    the outage lasted. A wait is one state, so neither grows with the outage's length: one wait per
    opening of the breaker (or per attempt a timeout started), whatever the number of probes."""
    waits: list[int] = []
    events: list[int] = []
    for _oid, (view, history) in sorted(histories.items()):
        if _touched(view, history, window) != "waited":
            continue
        steps = outage_steps(view, window.service)
        inside = [ev for ev in history if (t := parse_time(ev.get("at"))) is not None
                  and window.start - SLACK <= t <= window.end + SLACK]
        waits.append(sum(1 for ev in inside if ev.get("event") == "stepWaiting" and ev.get("step") in steps))
        events.append(len(inside))
    cycles = math.ceil(window.seconds / breaker.cool_down) if breaker.cool_down > 0 else 0
    return {"orders": len(waits), "probeCycles": cycles,
            "waitsMax": max(waits, default=0), "waitsP50": statistics.median(waits) if waits else 0,
            "eventsMax": max(events, default=0), "eventsP50": statistics.median(events) if events else 0}


def breaker_alerts(log_lines: Iterable[str], service: str) -> dict[str, Any]:
    """The breaker alerts the host log shows for ``service`` (one ``breaker.open``/``breaker.closed``
    line per alert the gate sent to the AlertsQueue)."""
    seen: list[dict[str, Any]] = []
    every: Counter[str] = Counter()  # "remote state" of every remote: transient faults open breakers too
    for line in log_lines:
        if '"breaker.open"' not in line and '"breaker.closed"' not in line:
            continue
        try:
            record = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        every[f"{record.get('remote')} {str(record.get('event', '')).removeprefix('breaker.')}"] += 1
        if record.get("remote") == service:
            seen.append({"state": str(record.get("event", "")).removeprefix("breaker."), "at": record.get("at"),
                         "opens": record.get("opens")})
    states = Counter(a["state"] for a in seen)
    return {"source": "host log", "open": states["open"], "closed": states["closed"],
            "openedDuringOutage": None, "alerts": seen[:50],
            "everyRemote": dict(sorted(every.items()))}


def first_open(alerts: Mapping[str, Any], window: OutageWindow) -> datetime | None:
    """When the breaker first opened during the outage (from its alerts), if it did."""
    opened = [t for a in alerts.get("alerts") or [] if a.get("state") == "open"
              and (t := parse_time(a.get("at"))) is not None and window.start - SLACK <= t <= window.end + SLACK]
    return min(opened, default=None)


def outage_report(window: OutageWindow | None, calls: list[dict[str, Any]], histories: Histories,
                  breaker: BreakerSettings, log_lines: Iterable[str],
                  process_faults: Iterable[str] = ()) -> dict[str, Any]:
    """The chaos JSON's ``outage`` section (the module docstring)."""
    if window is None:
        return {"service": None, "window": None}
    alerts = breaker_alerts(log_lines, window.service)
    alerts["openedDuringOutage"] = sum(1 for a in alerts["alerts"] if a["state"] == "open" and (
        t := parse_time(a.get("at"))) is not None and window.start - SLACK <= t <= window.end + SLACK)
    index = index_calls(calls, window.service)
    return {
        "service": window.service,
        "window": {"from": window.start.isoformat(), "to": window.end.isoformat(), "seconds": round(window.seconds, 2)},
        "breaker": {"failureThreshold": breaker.threshold, "coolDownSeconds": breaker.cool_down},
        "deadRemoteCalls": dead_remote_calls(calls, window, breaker, first_open(alerts, window)),
        "failureCountIncrements": failure_increments(
            histories, window, index, [t for at in process_faults if (t := parse_time(at)) is not None]),
        "heldForOperator": held_for_operator(histories, window, index),
        "drain": drain(histories, window),
        "historyWhileWaiting": history_while_waiting(histories, window, breaker),
        "breakerAlerts": alerts,
    }


def render_outage(outage: Mapping[str, Any]) -> list[str]:
    """The summary's lines about the outage."""
    if not outage.get("window"):
        return ["  outage: none"]
    c, f, h, d, a = (outage[k] for k in ("deadRemoteCalls", "failureCountIncrements", "heldForOperator", "drain",
                                         "breakerAlerts"))
    opened = (f", {c['beforeOpen']} before the breaker opened at +{c['openedAfterSeconds']}s"
              if "beforeOpen" in c else ", the breaker never opened")
    return [
        f"  outage of {outage['service']} ({outage['window']['seconds']}s; breaker threshold "
        f"{outage['breaker']['failureThreshold']}, cool-down {outage['breaker']['coolDownSeconds']:g}s):",
        f"    calls to the dead remote: {c['calls']} (bound {c['bound']}): first {c['firstThreshold']}, "
        f"then {c['afterFirstThreshold']}{opened}",
        f"    FailureCount increments caused by the outage: {f['attributable']} "
        f"({f.get('alsoProcessFault', 0)} of them also met a process fault; {f['overlapping']} attempts that "
        f"overlapped it failed: {f['otherFault']} met another fault only, {f['noFaultSeen']} met no fault)",
        f"    orders held for an operator because of the outage: {h['attributable']} ({h['count']} held on an "
        f"attempt that overlapped it)",
        f"    waiting orders drained {d['seconds']}s after the remote's return (p50 {d['p50Seconds']}s): "
        f"{d['orders']} orders ({d['waited']} waited, {d['inFlight']} in flight), ended {d['endedAs']}, "
        f"not ended {d['notEnded']}",
        *([f"    history of the {w['orders']} orders that waited, during the outage ({w['probeCycles']} probe "
           f"cycles): at most {w['waitsMax']} waits (p50 {w['waitsP50']:g}) and {w['eventsMax']} events "
           f"(p50 {w['eventsP50']:g}) per order"] if (w := outage.get("historyWhileWaiting")) else []),
        f"    breaker alerts ({a['source']}): open {a['open']} ({a['openedDuringOutage']} during the outage), "
        f"closed {a['closed']}; every remote's: "
        f"{a.get('everyRemote', {})}",
    ]
