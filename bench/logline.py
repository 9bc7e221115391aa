"""The benchmark's progress lines: ``[HH:MM:SS] message``, flushed at once (a long run shows progress)."""

from __future__ import annotations

from datetime import datetime


def log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)
