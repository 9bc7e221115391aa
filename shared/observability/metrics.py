"""The app's metrics (OpenTelemetry API meter ``orders``): recorded at the boundaries.

* ``orders.submitted``: orders accepted by the submission;
* ``orders.processed`` / ``orders.failed`` / ``orders.compensated``: orders that ended so;
* ``orders.step.duration`` (s): a step's or a compensation's run, from its start to its reply,
  by ``step``, ``kind`` (step, compensation) and ``outcome`` (done, failed);
* ``orders.redrives`` (by ``step``) and ``orders.alerts`` (by ``step``);
* ``orders.supervisor.sweep.duration`` (s) and ``orders.supervisor.due_rows`` (rows per sweep);
* ``orders.webhooks``: webhook tries, by ``outcome`` (delivered, retry, failed: gave up).

Order outcomes and step durations are read from the history events of a committed transaction
(``record_committed``): an event exists if and only if its change committed, so a lost race or a
replayed message never counts twice. Without an SDK the API meter is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from opentelemetry import metrics

from shared.core.rows import HISTORY_PREFIX, STATE_ROW, Op

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

webhooks = _meter.create_counter("orders.webhooks", unit="{try}",
                                 description="Webhook tries, by outcome (delivered, retry, failed)")

_ORDER_ENDS = {"processed": processed, "failed": failed, "compensated": compensated}
_STEP_ENDS = {"stepDone": ("step", "done"), "stepFailed": ("step", "failed"),
              "compensationDone": ("compensation", "done"), "compensationFailed": ("compensation", "failed")}
_REDRIVES = {"redriven", "compensationRedriven"}


@dataclass(frozen=True)
class Committed:
    """What a committed transaction recorded: its history events (entities), the step rows it
    wrote (by step name) and the state row it wrote (None if it did not)."""

    events: tuple[dict[str, Any], ...]
    steps: dict[str, dict[str, Any]]
    state: dict[str, Any] | None

    def submitted_at(self) -> datetime | None:
        """When the order was submitted (the state row's ``CreatedAt``), if this wrote it."""
        return parse_time(self.state.get("CreatedAt")) if self.state is not None else None


def parse_committed(ops: Iterable[Op]) -> Committed:
    """The events, step rows and state row written by a transaction's ``ops``."""
    rows = [op.row for op in ops if op.kind != "delete"]
    keys = [str(r.get("RowKey", "")) for r in rows]
    return Committed(events=tuple(r for r, k in zip(rows, keys, strict=True) if k.startswith(HISTORY_PREFIX)),
                     steps={str(r.get("Name")): r for r, k in zip(rows, keys, strict=True) if k.startswith("step-")},
                     state=next((r for r, k in zip(rows, keys, strict=True) if k == STATE_ROW), None))


def record_committed(ops: Iterable[Op]) -> Committed:
    """Count what a committed transaction recorded: order ends, step ends, redrives. Returns
    the parsed transaction (the console's figures are fed from it: ``shared.observability.figures``)."""
    committed = parse_committed(ops)
    for ev in committed.events:
        kind = ev.get("Event")
        if kind in _ORDER_ENDS:
            _ORDER_ENDS[kind].add(1)
        elif kind in _REDRIVES:
            redrives.add(1, {"step": str(ev.get("Step")), "kind": "compensation" if kind != "redriven" else "step"})
        elif kind in _STEP_ENDS:
            step_kind, outcome = _STEP_ENDS[kind]
            seconds = _duration(committed.steps.get(str(ev.get("Step"))), step_kind)
            if seconds is not None:
                step_duration.record(seconds, {"step": str(ev.get("Step")), "kind": step_kind, "outcome": outcome})
    return committed


def _duration(step: dict[str, Any] | None, kind: str) -> float | None:
    if step is None:
        return None
    prefix = "" if kind == "step" else "Compensation"
    started, finished = parse_time(step.get(f"{prefix}StartedAt")), parse_time(step.get(f"{prefix}FinishedAt"))
    if started is None or finished is None:
        return None
    return max((finished - started).total_seconds(), 0.0)


def parse_time(value: Any) -> datetime | None:
    """A stored time (ISO text or datetime) as a datetime; None if absent or not a time."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None
