"""A flush run every few seconds by one daemon thread: for cosmetic figures only.

The console's figures (``shared.observability.figures``) are counted in memory and sent a moment later.
Nothing an order's correctness or its search depends on goes through here: an instance may be
frozen or recycled as soon as no invocation runs, and whatever a flush had not sent yet is lost
with it (a few seconds of the console's counters). What a failing flush kept is sent by the
next round; a failure is logged as ``{event}``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from shared.observability.logs import log_event


class Periodic:
    def __init__(self, flush: Callable[[], Any], interval: float, *, name: str, event: str) -> None:
        self.flush = flush
        self.interval = interval
        self.name = name
        self.event = event
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread on first use (idempotent, thread-safe)."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            self._once()

    def _once(self) -> None:
        try:
            self.flush()  # no span: the SDKs' calls make none (shared.observability.telemetry)
        except Exception as exc:  # noqa: BLE001 - kept for the next round (or lost with the process)
            log_event(logging.WARNING, self.event, error=repr(exc))
