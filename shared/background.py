"""A flush run every few seconds by one daemon thread, and once more when the process exits.

The search index's write-behind queue (``shared.write_behind``) and the console's figures
(``shared.console_stats``) both keep writes in memory and send them a moment later. What a
failing flush kept is sent by the next round; a failure is logged as ``{event}`` (at exit too:
the store may be gone by then).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.instrumentation.utils import suppress_instrumentation

from shared.logs import log_event


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
                atexit.register(self._once, atExit=True)

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            self._once()

    def _once(self, **context: Any) -> None:
        try:
            # A flush belongs to no order: its table requests would each be a new root trace
            # (a CLIENT span a second per queue and instance), so they are not traced.
            with suppress_instrumentation():
                self.flush()
        except Exception as exc:  # noqa: BLE001 - kept for the next round (or lost with the process)
            log_event(logging.WARNING, self.event, error=repr(exc), **context)
