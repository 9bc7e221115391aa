"""Where the time goes: CPU seconds per process (from /proc) and py-spy profiles of the Python
processes of the stack (host instances, emulator), summarised as their top frames."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def stat_fields(path: str) -> list[str] | None:
    """The fields of a ``/proc/.../stat`` file after the command (which may hold spaces and ``)``):
    state, ppid, pgrp ..., utime and stime at 11 and 12. None: the process is gone."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    fields = stat_fields(f"/proc/{pid}/stat")
    return None if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_pids(pgid: int) -> list[int]:
    """The processes of process group ``pgid``."""
    return [int(d) for d in os.listdir("/proc")
            if d.isdigit() and (fields := stat_fields(f"/proc/{d}/stat")) and int(fields[2]) == pgid]


class CpuMeter:
    """CPU seconds consumed by named processes between start() and stop()."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self._t0: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        out = {}
        for name, pids in self.pids.items():
            out[name] = sum(c for c in (cpu_seconds(p) for p in pids) if c is not None)
        return out

    def start(self) -> None:
        self._t0 = self._now()

    def stop(self) -> dict[str, float]:
        now = self._now()
        return {k: round(now[k] - self._t0.get(k, 0.0), 2) for k in now}


def py_spy_path() -> str | None:
    """The venv's py-spy, else the one on PATH."""
    return shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def start_record(pid: int, seconds: float, out: Path, rate: int = 67,
                 gil: bool = False) -> subprocess.Popen[bytes] | None:
    """py-spy on ``pid`` into ``out`` (raw, per thread); ``gil``: only the thread holding the GIL is
    sampled (where the Python CPU goes, not the waits)."""
    exe = py_spy_path()
    if exe is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", str(rate),
                             "--format", "raw", "--nonblocking", "--threads", *(["--gil"] if gil else []),
                             "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _frame_name(frame: str) -> str:
    # "send_messages (azure/servicebus/_servicebus_sender.py:412)" -> "send_messages (azure/servicebus/...)"
    name, _, loc = frame.partition(" (")
    loc = loc.rstrip(")")
    path, _, _line = loc.rpartition(":")
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path})"


_IDLE = ("select (selectors.py)", "poll (selectors.py)", "wait (threading.py)",
         "_worker (concurrent/futures/thread.py)", "epoll", "sleep", "acquire", "get (queue.py)", "accept",
         "readinto (socket.py)", "_run_once (asyncio/base_events.py)")


def summarize_raw(path: Path, top: int = 12) -> dict[str, Any]:
    """Top self (leaf) and inclusive frames of a py-spy raw (collapsed stacks) file, idle waits
    (select/poll/sleep/lock waits, a blocked socket read) set apart."""
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = busy = 0
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {"error": f"no profile at {path}"}
    for line in lines:
        stack, _, n = line.rpartition(" ")
        try:
            count = int(n)
        except ValueError:
            continue
        frames = [f for f in stack.split(";") if f and not f.startswith("thread (") and not f.startswith("process ")]
        if not frames:
            continue
        total += count
        leaf = _frame_name(frames[-1])
        if any(leaf.startswith(i) or i in leaf for i in _IDLE):
            continue
        busy += count
        self_c[leaf] += count
        for f in set(_frame_name(x) for x in frames):
            incl[f] += count
    def pct(c: int) -> float:
        return round(100.0 * c / busy, 1) if busy else 0.0
    return {"samples": total, "busy_samples": busy,
            "top_self": [{"frame": f, "pct_of_busy": pct(c)} for f, c in self_c.most_common(top)],
            "top_inclusive": [{"frame": f, "pct_of_busy": pct(c)} for f, c in incl.most_common(top)
                              if pct(c) < 99.5][:top]}
