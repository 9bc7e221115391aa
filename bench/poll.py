"""One poll loop for the bench's waits: ask again until the answer comes, the time is up, or the run stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(answer: Callable[[], T], timeout: float, every: float = 0.5,
             stop: threading.Event | None = None) -> T:
    """``answer()`` every ``every`` s until it is truthy, ``timeout`` s have passed or ``stop`` is
    set; -> its last value (falsy: not in time, or stopped)."""
    pause = stop or threading.Event()  # never set: a plain sleep
    deadline = time.monotonic() + timeout
    while not (got := answer()):
        if time.monotonic() >= deadline or pause.wait(every):
            break
    return got
