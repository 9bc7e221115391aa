"""Client-side CPU per operation: the one timing helper ``bench.sdk_cpu``'s cases share.

``getrusage(RUSAGE_SELF)`` is this process's CPU, every thread, user and system (kernel) time
apart (the emulator and Azurite are other processes, so their CPU is not in it; on loopback the
kernel's TCP work for a send is mostly charged to the sender); wall time is ``time.perf_counter``.
"""

from __future__ import annotations

import gc
import os
import resource
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Result:
    """One case: ``ops`` operations took ``cpu_s`` of this process's CPU and ``wall_s`` of wall time."""

    name: str
    ops: int
    cpu_s: float
    wall_s: float
    errors: int = 0
    concurrency: int = 1
    note: str = ""
    sys_s: float = 0.0  # of cpu_s, the kernel's share

    @property
    def sys_us_per_op(self) -> float:
        return self.sys_s / max(self.ops, 1) * 1e6

    @property
    def cpu_us_per_op(self) -> float:
        return self.cpu_s / max(self.ops, 1) * 1e6

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpu_us_per_op": round(self.cpu_us_per_op, 1),
                "ops_per_s": round(self.ops_per_s, 1), "cpu_s": round(self.cpu_s, 4),
                "wall_s": round(self.wall_s, 4), "sys_s": round(self.sys_s, 4),
                "sys_us_per_op": round(self.sys_us_per_op, 1)}


def _cpu() -> tuple[float, float]:
    """(user + system, system) CPU seconds of this process."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_stime


def _clock() -> tuple[tuple[float, float], float]:
    gc.collect()
    return _cpu(), time.perf_counter()


def _result(name: str, ops: int, start: tuple[tuple[float, float], float], errors: int, concurrency: int,
            note: str) -> Result:
    wall1, (cpu1, sys1) = time.perf_counter(), _cpu()
    (cpu0, sys0), wall0 = start
    return Result(name, ops, cpu1 - cpu0, wall1 - wall0, errors, concurrency, note, sys1 - sys0)


def timed(name: str, ops: int, body: Callable[[], int], *, concurrency: int = 1, note: str = "") -> Result:
    """Run ``body`` (which performs ``ops`` operations and returns its error count) and time it."""
    start = _clock()
    errors = body()
    return _result(name, ops, start, errors, concurrency, note)


async def timed_async(name: str, ops: int, body: Callable[[], Awaitable[int]], *, concurrency: int = 1,
                      note: str = "") -> Result:
    """``timed`` for a coroutine, awaited on the running loop."""
    start = _clock()
    errors = await body()
    return _result(name, ops, start, errors, concurrency, note)


def in_threads(threads: int, ops: int, op: Callable[[int], object]) -> Callable[[], int]:
    """A body that runs ``op(i)`` for i in range(ops), split over ``threads`` threads started together."""

    def body() -> int:
        errors = [0] * threads
        start = threading.Barrier(threads)

        def run(t: int) -> None:
            start.wait()
            for i in range(t, ops, threads):
                try:
                    op(i)
                except Exception:
                    errors[t] += 1

        workers = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return sum(errors)

    return body


def sequential(ops: int, op: Callable[[int], object]) -> Callable[[], int]:
    """A body that runs ``op(i)`` for i in range(ops) in this thread."""

    def body() -> int:
        errors = 0
        for i in range(ops):
            try:
                op(i)
            except Exception:
                errors += 1
        return errors

    return body


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)}
