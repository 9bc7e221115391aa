"""The app's metrics (OpenTelemetry API meter ``orders``): recorded at the boundaries.

* ``orders.submitted``: orders accepted by the submission;
* ``orders.processed`` / ``orders.failed`` / ``orders.compensated``: orders that ended so;
* ``orders.step.duration`` (s): a step's or a compensation's run, from its start to its reply,
  by ``step``, ``kind`` (step, compensation) and ``outcome`` (done, failed);
* ``orders.redrives`` (by ``step``) and ``orders.alerts`` (by ``step``);
* ``orders.supervisor.sweep.duration`` (s) and ``orders.supervisor.due_rows`` (rows per sweep).

Order outcomes and step durations are read from the history events of a committed transaction
(``record_committed``): an event exists if and only if its change committed, so a lost race or a
replayed message never counts twice. Without an SDK the API meter is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from opentelemetry import metrics

from shared.store import HISTORY_PREFIX, Op

_meter = metrics.get_meter("orders")

submitted = _meter.create_counter("orders.submitted", unit="{order}", description="Orders accepted")
processed = _meter.create_counter("orders.processed", unit="{order}", description="Orders processed")
failed = _meter.create_counter("orders.failed", unit="{order}", description="Orders failed")
compensated = _meter.create_counter("orders.compensated", unit="{order}", description="Orders compensated")
step_duration = _meter.create_histogram("orders.step.duration", unit="s",
                                        description="A step's or compensation's run, start to reply")
redrives = _meter.create_counter("orders.redrives", unit="{redrive}", description="Steps redriven by the Supervisor")
alerts = _meter.create_counter("orders.alerts", unit="{alert}", description="Operator alerts raised")
sweep_duration = _meter.create_histogram("orders.supervisor.sweep.duration", unit="s",
                                         description="One Supervisor sweep")
due_rows = _meter.create_histogram("orders.supervisor.due_rows", unit="{row}",
                                   description="Due deadline rows a sweep read")

_ORDER_ENDS = {"processed": processed, "failed": failed, "compensated": compensated}
_STEP_ENDS = {"stepDone": ("step", "done"), "stepFailed": ("step", "failed"),
              "compensationDone": ("compensation", "done"), "compensationFailed": ("compensation", "failed")}
_REDRIVES = {"redriven", "compensationRedriven"}


def record_committed(ops: Iterable[Op]) -> None:
    """Count what a committed transaction recorded: order ends, step ends, redrives."""
    rows = [op.row for op in ops if op.kind != "delete"]
    events = [r for r in rows if str(r.get("RowKey", "")).startswith(HISTORY_PREFIX)]
    steps = {r.get("Name"): r for r in rows if str(r.get("RowKey", "")).startswith("step-")}
    for ev in events:
        kind = ev.get("Event")
        if kind in _ORDER_ENDS:
            _ORDER_ENDS[kind].add(1)
        elif kind in _REDRIVES:
            redrives.add(1, {"step": str(ev.get("Step")), "kind": "compensation" if kind != "redriven" else "step"})
        elif kind in _STEP_ENDS:
            step_kind, outcome = _STEP_ENDS[kind]
            seconds = _duration(steps.get(ev.get("Step")), step_kind)
            if seconds is not None:
                step_duration.record(seconds, {"step": str(ev.get("Step")), "kind": step_kind, "outcome": outcome})


def _duration(step: dict[str, Any] | None, kind: str) -> float | None:
    if step is None:
        return None
    prefix = "" if kind == "step" else "Compensation"
    started, finished = _time(step.get(f"{prefix}StartedAt")), _time(step.get(f"{prefix}FinishedAt"))
    if started is None or finished is None:
        return None
    return max((finished - started).total_seconds(), 0.0)


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None
