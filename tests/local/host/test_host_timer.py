"""Timer triggers across instances: one runner at a time, taken over when the holder dies."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from .conftest import start_host, wait_for

pytestmark = pytest.mark.integration


def _starts(h):
    return sorted(h.read("tick-start"), key=lambda r: r["at"])


def _assert_one_at_a_time(h, dead_pid: int | None = None) -> None:
    events = sorted([(r["at"], "start", r["pid"]) for r in h.read("tick-start")]
                    + [(r["at"], "end", r["pid"]) for r in h.read("tick-end")])
    running: int | None = None
    for _at, kind, pid in events:
        if kind == "start":
            assert running is None or running == dead_pid, f"tick started on {pid} while {running} ran"
            running = pid
        else:
            assert running == pid
            running = None
    starts = _starts(h)
    gaps = [b["at"] - a["at"] for a, b in zip(starts, starts[1:], strict=False)]
    assert all(g > 0.5 for g in gaps), f"an occurrence ran twice: gaps {gaps}"


def test_timer_runs_on_one_instance_at_a_time(tmp_path: Path):
    h = start_host(tmp_path, instances=2, values={"TimerSchedule": "* * * * * *", "TickSeconds": "0.4"})
    try:
        wait_for(lambda: len(_starts(h)) >= 4, 15, what="4 ticks")
        _assert_one_at_a_time(h)
        holders = {r["pid"] for r in _starts(h)}
        assert len(holders) == 1, "both instances ran the timer"
        holder = holders.pop()
        assert holder in h.instance_pids().values()

        # Kill the lease holder: the other instance takes over, the dead one is restarted.
        os.kill(holder, signal.SIGKILL)
        t_kill = time.time()
        wait_for(lambda: [r for r in _starts(h) if r["at"] > t_kill and r["pid"] != holder], 10,
                 what="a tick on another instance")
        wait_for(lambda: holder not in h.instance_pids().values(), 10, what="the killed instance restarted")
        wait_for(lambda: len([r for r in _starts(h) if r["at"] > t_kill]) >= 3, 10, what="ticks after the kill")
        _assert_one_at_a_time(h, dead_pid=holder)
        after = {r["pid"] for r in _starts(h) if r["at"] > t_kill}
        assert len(after) == 1 and holder not in after
        assert all(r["past_due"] is False for r in _starts(h))
    finally:
        h.proc.stop()
