"""Timer triggers: NCRONTAB schedules, one runner per function across all instances.

The Functions host runs a timer function on one instance at a time by holding a blob lease
(the singleton listener lock). Here the lease is an ``fcntl`` lock on a file in a lease directory
shared by the instances: the instance holding it schedules and runs the function; the others
retry every second, and the kernel frees the lock if the holder dies, so another instance takes
over. With ``useMonitor`` (default true unless the schedule recurs more often than once a
minute) the last and next occurrences are recorded next to the lease, so a missed occurrence is
run at once as past due, as the host's schedule monitor does. ``runOnStartup`` runs the function
when the runner starts (when an instance takes the lease).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from azure.functions.timer import TimerRequest

from . import ncrontab
from .app import FunctionSpec, Invoker

log = logging.getLogger("local.host.timer")

LEASE_RETRY = 1.0


def _as_bool(v: Any, default: bool) -> bool:
    if v is None:
        return default
    if isinstance(v, bool):
        return v
    return str(v).lower() == "true"


def _fmt(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def _parse(t: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(t)) if t else None
    except ValueError:
        return None


class TimerRunner:
    def __init__(self, spec: FunctionSpec, invoker: Invoker, lease_dir: Path, instance_id: str,
                 stopping: threading.Event) -> None:
        self.spec = spec
        self.invoker = invoker
        self.instance_id = instance_id
        self.stopping = stopping
        self.schedule = ncrontab.parse(str(spec.trigger["schedule"]))
        self.run_on_startup = _as_bool(spec.trigger.get("runOnStartup"), False)
        self.use_monitor = _as_bool(spec.trigger.get("useMonitor"),
                                    self.schedule.min_interval() >= timedelta(minutes=1))
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name)
        self.lease_path = lease_dir / f"timer-{safe}.lock"
        self.status_path = lease_dir / f"timer-{safe}.status.json"
        self.thread = threading.Thread(target=self._run, name=f"timer-{spec.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    # ------------------------------------------------------------------ lease

    def _run(self) -> None:
        fd = os.open(self.lease_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while not self.stopping.is_set():
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    self.stopping.wait(LEASE_RETRY)
                    continue
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{self.instance_id} {os.getpid()}\n".encode(), 0)
                    log.info("Timer lease for 'Functions.%s' acquired by %s; schedule %r",
                             self.spec.name, self.instance_id, self.schedule.expression)
                    self._schedule_loop()
                except Exception:  # noqa: BLE001 - a broken runner must not go unnoticed, nor stop
                    log.exception("timer runner for 'Functions.%s' failed; retrying", self.spec.name)
                    self.stopping.wait(LEASE_RETRY)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ status (useMonitor)

    def _read_status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.status_path.read_text()))
        except (OSError, ValueError):
            return {}

    def _write_status(self, last: datetime | None, nxt: datetime) -> None:
        if not self.use_monitor:
            return
        data = {"Last": _fmt(last), "Next": _fmt(nxt), "LastUpdated": _fmt(datetime.now(UTC))}
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.status_path)

    # ------------------------------------------------------------------ schedule

    def _invoke(self, past_due: bool, last: datetime | None, nxt: datetime, reason: str) -> None:
        req = TimerRequest(
            past_due=past_due,
            schedule_status={"Last": _fmt(last), "Next": _fmt(nxt), "LastUpdated": _fmt(datetime.now(UTC))},
            schedule={"AdjustForDST": True},
        )
        try:
            self.invoker.invoke_blocking(self.spec, req, reason)
        except Exception:  # noqa: BLE001,S110 - logged by the invoker; the schedule goes on
            pass

    def _schedule_loop(self) -> None:
        now = datetime.now(UTC)
        status = self._read_status() if self.use_monitor else {}
        last = _parse(status.get("Last"))
        recorded_next = _parse(status.get("Next"))
        if self.run_on_startup:
            self._invoke(False, last, self.schedule.next_after(now), "Timer fired on startup (runOnStartup)")
        elif recorded_next is not None and recorded_next < now - timedelta(seconds=1):
            self._invoke(True, last, self.schedule.next_after(now),
                         f"Timer is past due (missed occurrence {recorded_next.isoformat()})")
            last = recorded_next
        while not self.stopping.is_set():
            nxt = self.schedule.next_after(datetime.now(UTC))
            self._write_status(last, nxt)
            while not self.stopping.is_set():
                delay = (nxt - datetime.now(UTC)).total_seconds()
                if delay <= 0:
                    break
                self.stopping.wait(min(delay, 1.0))
            if self.stopping.is_set():
                return
            following = self.schedule.next_after(nxt)
            self._write_status(last, following)
            self._invoke(False, last, following, f"Timer fired at {nxt.isoformat()}")
            last = nxt
