"""Which native thread of an instance does what, for a CPU split measured from outside.

When ``LOCAL_HOST_THREAD_ROLES_DIR`` names a directory, each instance keeps a small JSON file
there, ``<pid>.json``: ``{"pid": PID, "threads": {"<native tid>": "<role>"}}``, rewritten (whole,
atomically) whenever a thread registers. Roles: ``loop`` (the instance's event loop: Service Bus
receive, settle, lock renewal, output-binding sends, invocation bookkeeping), ``invoke`` (the
thread pool that runs sync functions: the app's code), ``http`` (the HTTP accept loop),
``timer`` and ``main``. A benchmark reads ``/proc/<pid>/task/<tid>/stat`` per thread, so that
the host's own work and the app's can be told apart. Without the variable nothing is written.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

ENV = "LOCAL_HOST_THREAD_ROLES_DIR"


class ThreadRoles:
    """The roles of this process's threads, mirrored to ``<dir>/<pid>.json`` (a no-op without a dir)."""

    def __init__(self, directory: str | None) -> None:
        self.path = Path(directory) / f"{os.getpid()}.json" if directory else None
        self._threads: dict[int, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> ThreadRoles:
        return cls(os.environ.get(ENV) or None)

    def register(self, role: str) -> None:
        """Record the calling thread under ``role`` (call it from that thread)."""
        if self.path is None:
            return
        with self._lock:
            self._threads[threading.get_native_id()] = role
            body = json.dumps({"pid": os.getpid(), "threads": {str(t): r for t, r in self._threads.items()}})
            tmp = self.path.with_suffix(f".tmp{threading.get_native_id()}")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(body, encoding="utf-8")
                os.replace(tmp, self.path)
            except OSError:
                pass  # a diagnostic: never worth failing a thread's start
