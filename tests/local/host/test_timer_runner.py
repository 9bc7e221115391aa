"""TimerRunner in-process with a recording invoker: lease, runOnStartup, past due (useMonitor)."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from local.host.app import FunctionSpec
from local.host.timers import TimerRunner


class RecordingInvoker:
    def __init__(self) -> None:
        self.calls: list[tuple[object, str]] = []

    def invoke_blocking(self, spec, value, reason, trace_parent=None):
        self.calls.append((value, reason))


def _spec(**trigger) -> FunctionSpec:
    return FunctionSpec("tick", lambda timer: None, False, {"type": "timerTrigger", "name": "timer", **trigger})


def _run(runner: TimerRunner, stop: threading.Event, seconds: float) -> None:
    runner.start()
    time.sleep(seconds)
    stop.set()
    runner.join(5)
    assert not runner.thread.is_alive()


def test_run_on_startup(tmp_path: Path):
    inv, stop = RecordingInvoker(), threading.Event()
    runner = TimerRunner(_spec(schedule="0 0 0 1 1 *", runOnStartup=True), inv, tmp_path, "i1", stop)
    _run(runner, stop, 0.5)
    assert len(inv.calls) == 1
    req, reason = inv.calls[0]
    assert req.past_due is False and "startup" in reason


def test_missed_occurrence_runs_past_due(tmp_path: Path):
    missed = datetime.now(UTC) - timedelta(minutes=3)
    (tmp_path / "timer-tick.status.json").write_text(json.dumps(
        {"Last": (missed - timedelta(minutes=5)).isoformat(), "Next": missed.isoformat()}))
    inv, stop = RecordingInvoker(), threading.Event()
    # Yearly, so no regular occurrence falls inside the half second this test runs (CI once ran it at
    # hh:39:59.6 with "every 5 minutes" and saw the hh:40 occurrence too).
    runner = TimerRunner(_spec(schedule="0 0 0 1 1 *"), inv, tmp_path, "i1", stop)
    assert runner.use_monitor  # default for schedules of a minute or more
    _run(runner, stop, 0.5)
    assert len(inv.calls) == 1 and inv.calls[0][0].past_due is True
    status = json.loads((tmp_path / "timer-tick.status.json").read_text())
    assert datetime.fromisoformat(status["Next"]) > datetime.now(UTC)


def test_sub_minute_schedule_has_no_monitor(tmp_path: Path):
    runner = TimerRunner(_spec(schedule="*/10 * * * * *"), RecordingInvoker(), tmp_path, "i1", threading.Event())
    assert not runner.use_monitor
    runner2 = TimerRunner(_spec(schedule="*/10 * * * * *", useMonitor=True), RecordingInvoker(), tmp_path, "i1",
                          threading.Event())
    assert runner2.use_monitor


def test_second_runner_waits_for_the_lease(tmp_path: Path):
    stop1, stop2 = threading.Event(), threading.Event()
    inv1, inv2 = RecordingInvoker(), RecordingInvoker()
    r1 = TimerRunner(_spec(schedule="* * * * * *"), inv1, tmp_path, "i1", stop1)
    r2 = TimerRunner(_spec(schedule="* * * * * *"), inv2, tmp_path, "i2", stop2)
    r1.start()
    time.sleep(0.2)
    r2.start()
    time.sleep(2.2)
    assert len(inv1.calls) >= 2 and inv2.calls == []
    stop1.set()  # the holder goes away: the other takes the lease
    r1.join(5)
    time.sleep(2.5)
    stop2.set()
    r2.join(5)
    assert len(inv2.calls) >= 1
