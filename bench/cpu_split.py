"""CPU per order, split: the app's own code apart from the local host's receive/settle loop.

In Azure the receive and settle loop is the .NET host's work, so the host instances' CPU is split
per thread: each instance names its threads' roles in ``<dir>/<pid>.json`` (``local.host.threadroles``,
asked for through ``LOCAL_HOST_THREAD_ROLES_DIR``), and :class:`SplitMeter` reads
``/proc/<pid>/task/<tid>/stat`` per thread before and after the window: ``app`` (the functions'
thread pool: their code, table requests and sends), ``host_loop`` (the event loop: receive,
settle, lock renewal) and ``host_other`` (the rest of the process).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local.host.threadroles import ENV

ROLE_GROUPS = {"invoke": "app", "loop": "host_loop"}  # any other role, and the residual: host_other
GROUPS = ("app", "host_loop", "host_other")


def parse_stat(text: str) -> float:
    """utime + stime, in clock ticks, of a ``/proc/.../stat`` line (the command may hold spaces and ')')."""
    fields = text.rsplit(")", 1)[1].split()
    return float(int(fields[11]) + int(fields[12]))


def _ticks(path: str) -> float | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return parse_stat(f.read())
    except (OSError, IndexError, ValueError):
        return None


def read_roles(directory: Path, pid: int) -> dict[int, str]:
    """native tid -> role, from an instance's roles file (empty if it wrote none)."""
    try:
        data = json.loads((directory / f"{pid}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {int(t): str(r) for t, r in (data.get("threads") or {}).items()}


@dataclass
class Sample:
    """One instance's CPU ticks: the whole process, and each registered thread still alive."""

    total: float
    threads: dict[int, float] = field(default_factory=dict)


def sample(pid: int, roles: dict[int, str], proc: str = "/proc") -> Sample | None:
    total = _ticks(f"{proc}/{pid}/stat")
    if total is None:
        return None
    threads = {}
    for tid in roles:
        t = _ticks(f"{proc}/{pid}/task/{tid}/stat")
        if t is not None:
            threads[tid] = t
    return Sample(total, threads)


def split(before: Sample, after: Sample, roles: dict[int, str]) -> dict[str, float]:
    """Ticks per group between two samples. A thread born in the window counts from 0; one that
    ended in it is in the process total only, so it lands in ``host_other``."""
    out = dict.fromkeys(GROUPS, 0.0)
    for tid, t1 in after.threads.items():
        d = t1 - before.threads.get(tid, 0.0)
        out[ROLE_GROUPS.get(roles.get(tid, ""), "host_other")] += d
    out["host_other"] += (after.total - before.total) - sum(after.threads.values()) + sum(
        v for tid, v in before.threads.items() if tid in after.threads)
    return out


class SplitMeter:
    """The host instances' CPU seconds per group (``app``, ``host_loop``, ``host_other``) over a window."""

    def __init__(self, directory: Path, pids: list[int], proc: str = "/proc") -> None:
        self.directory = directory
        self.pids = pids
        self.proc = proc
        self._before: dict[int, Sample] = {}

    def start(self) -> None:
        self._before = {}
        for pid in self.pids:
            s = sample(pid, self._all_roles(pid), self.proc)
            if s is not None:
                self._before[pid] = s

    def _all_roles(self, pid: int) -> dict[int, str]:
        return read_roles(self.directory, pid)

    def stop(self) -> dict[str, Any]:
        hz = os.sysconf("SC_CLK_TCK")
        sums = dict.fromkeys(GROUPS, 0.0)
        seen = 0
        for pid, before in self._before.items():
            roles = self._all_roles(pid)
            after = sample(pid, roles, self.proc)
            if after is None or not roles:
                continue
            seen += 1
            for k, v in split(before, after, roles).items():
                sums[k] += v
        return {"instances": seen, "cpu_seconds": {k: round(v / hz, 3) for k, v in sums.items()}}


# The machine-speed control: the bench's own process (load generator and status consumer) does
# the same work per order whatever the app's code, in the same window on the same CPUs. This
# machine's speed moves by up to 2x within minutes (``bench.calibrate``), so the app's CPU per
# order is also given in units of the control's.
CONTROL = "bench (load + status consumer)"


def per_order(host_split: dict[str, Any], process_cpu: dict[str, float], orders: int) -> dict[str, Any]:
    """CPU ms per order: (a) the app's code, (b) the host's loop (and its other threads), (c) every
    other process by name (their CPU seconds from ``bench.profiling.CpuMeter``), and (a) over the
    control's CPU per order (absent without the control)."""
    if not orders:
        return {}
    cs = host_split.get("cpu_seconds") or {}
    others = {k: round(1000 * v / orders, 1) for k, v in process_cpu.items() if not k.startswith("host instance")}
    out = {"app_code": round(1000 * cs.get("app", 0.0) / orders, 1),
           "host_loop": round(1000 * cs.get("host_loop", 0.0) / orders, 1),
           "host_other_threads": round(1000 * cs.get("host_other", 0.0) / orders, 1),
           "other_processes": others, "other_processes_total": round(sum(others.values()), 1),
           "orders": orders}
    control = process_cpu.get(CONTROL, 0.0)
    if control > 0:
        out["app_code_over_control"] = round(cs.get("app", 0.0) / control, 2)
    return out


class PhaseMeters:
    """CPU seconds per process and the host instances' split over one phase, per order at the end."""

    def __init__(self, pids: dict[str, list[int]], directory: Path) -> None:
        from bench.profiling import CpuMeter

        self.cpu = CpuMeter(pids)
        self.split = SplitMeter(directory, [p for k, v in pids.items() if k.startswith("host instance") for p in v])

    def start(self) -> None:
        self.cpu.start()
        self.split.start()

    def stop(self, orders: int) -> dict[str, Any]:
        cpu, host = self.cpu.stop(), self.split.stop()
        return {"cpu_seconds": cpu, "cpu_split": host, "cpu_ms_per_order_split": per_order(host, cpu, orders)}


def host_env(directory: Path) -> dict[str, str]:
    """The environment variable that asks the host instances for their roles files."""
    return {ENV: str(directory)}


def report_line(phase: dict[str, Any], label: str = "") -> str | None:
    po = phase.get("cpu_ms_per_order_split")
    if not po:
        return None
    line = (f"CPU ms per order{label}, split: app code {po['app_code']}, host receive/settle loop "
            f"{po['host_loop']} (other host threads {po['host_other_threads']}), other processes "
            f"{po['other_processes_total']} {po['other_processes']}")
    if "app_code_over_control" in po:
        line += f"; app code / the bench process's CPU (machine-speed control) {po['app_code_over_control']}"
    return line
