"""The host processes' long garbage collections, recorded from outside the app.

``bench/startup/sitecustomize.py`` installs this in the local host's processes when the
benchmark counts their requests (``BENCH_OPCOUNT_DIR``). A ``gc.callbacks`` hook times every
collection; one that takes at least ``MIN_MS`` is appended to ``gc-<pid>.log`` in that folder
as ``<epoch seconds at its start> <ms> <generation>``. ``bench.tail`` lays them beside the
slowest orders. A collection that short is not written: the hook costs two clock reads.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

MIN_MS = 10.0


def install(directory: str) -> None:
    started = [0.0, 0.0]  # epoch seconds, perf_counter at the collection's start

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0], started[1] = time.time(), time.perf_counter()
            return
        took = 1000 * (time.perf_counter() - started[1])
        if took >= MIN_MS:
            with open(os.path.join(directory, f"gc-{os.getpid()}.log"), "a", encoding="utf-8") as f:
                f.write(f"{started[0]:.3f} {took:.1f} {info.get('generation', -1)}\n")

    gc.callbacks.append(timed)


def read(directory: Path | str) -> list[tuple[float, float, int, int]]:
    """Every recorded collection: ``(epoch start, ms, generation, pid)``, in time order."""
    out = []
    for f in Path(directory).glob("gc-*.log"):
        pid = int(f.stem.removeprefix("gc-"))
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                at, ms, gen = line.split()
                out.append((float(at), float(ms), int(gen), pid))
            except ValueError:
                continue
    return sorted(out)
