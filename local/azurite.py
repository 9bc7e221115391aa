"""Start Azurite (installed by ``npm ci`` into node_modules, pinned in package.json) on loopback.

    az = start_azurite(location=Path(".local/azurite"))        # persistent (make run)
    az = start_azurite(in_memory=True, services=("table",))    # tests
    az.connection_string; az.proc (a local.procs.Proc); az.stop()

Every service listens on the port given, or else on a free port: the full ``azurite`` binary
is started with port 0 and the port is read from its "successfully listening at" line (no
race between picking a port and binding it); the single-service binaries (``azurite-table``)
get a port from local.procs.free_port. ``restart()`` starts it again on the same ports, so
connection strings already handed out stay valid.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local.connections import AZURITE_ACCOUNT, azurite_connection_string
from local.procs import REPO_ROOT, Proc, free_port, wait_for_port

NODE_BIN = REPO_ROOT / "node_modules" / ".bin"
ALL_SERVICES = ("blob", "queue", "table")
_LISTENING = re.compile(r"Azurite (Blob|Queue|Table) service is successfully listening at https?://[^:/]+:(\d+)")


def azurite_binary(services: Sequence[str]) -> Path:
    """``azurite`` for several services, ``azurite-table`` (etc.) for one."""
    name = f"azurite-{services[0]}" if len(services) == 1 else "azurite"
    path = NODE_BIN / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `npm ci` (or `make setup`) first")
    return path


@dataclass
class Azurite:
    proc: Proc
    host: str
    ports: dict[str, int]
    services: tuple[str, ...]
    location: Path | None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def table_port(self) -> int:
        return self.ports["table"]

    @property
    def blob_port(self) -> int | None:
        return self.ports.get("blob")

    @property
    def queue_port(self) -> int | None:
        return self.ports.get("queue")

    def endpoint(self, service: str) -> str:
        return f"http://{self.host}:{self.ports[service]}/{AZURITE_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        cs = azurite_connection_string(self.host, self.table_port, self.blob_port)
        if self.queue_port is not None:
            cs += f"QueueEndpoint={self.endpoint('queue')};"
        return cs

    def endpoints(self) -> dict[str, str]:
        return {s: self.endpoint(s) for s in self.services}

    def __iter__(self) -> Iterator[Any]:
        """``proc, connection_string = start_azurite(...)``."""
        return iter((self.proc, self.connection_string))

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop: SIGINT first (azurite-table saves its database on SIGINT only; on
        SIGTERM it dies at once and loses up to 5 s of writes), then local.procs' SIGTERM and
        SIGKILL of the process group for whatever is left."""
        popen = self.proc.popen
        if popen is not None and popen.poll() is None:
            try:
                os.killpg(popen.pid, signal.SIGINT)
                popen.wait(timeout=timeout)
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                pass
        self.proc.stop()

    def kill(self) -> None:
        self.proc.kill()

    def restart(self, timeout: float = 60.0) -> None:
        """Stop (if running) and start again on the same ports and data folder."""
        self.stop()
        again = start_azurite(host=self.host, ports=self.ports, services=self.services,
                              location=self.location, timeout=timeout, **self.options)
        self.proc = again.proc


def start_azurite(
    *,
    host: str = "127.0.0.1",
    location: Path | str | None = None,
    in_memory: bool | None = None,
    services: Sequence[str] = ALL_SERVICES,
    ports: dict[str, int] | None = None,
    log_path: Path | None = None,
    echo: bool = False,
    silent: bool = True,
    timeout: float = 60.0,
) -> Azurite:
    """Start Azurite and wait until every requested service listens.

    ``location``: persistent data folder (created if missing). Without it, in-memory
    persistence is used (``in_memory`` defaults to ``location is None``).
    """
    services = tuple(services)
    if not services or any(s not in ALL_SERVICES for s in services):
        raise ValueError(f"services must be a non-empty subset of {ALL_SERVICES}")
    if "table" not in services:
        raise ValueError("the table service is required (the connection string needs it)")
    if in_memory is None:
        in_memory = location is None
    if in_memory and location is not None:
        raise ValueError("choose either location (persistent) or in_memory, not both")
    if not in_memory and location is None:
        raise ValueError("persistent Azurite needs a location")
    ports = dict(ports or {})

    args: list[str] = [str(azurite_binary(services))]
    if len(services) == 1:
        # azurite-table etc. take only their own service's options, and do not report the port
        # they got for port 0 (azurite-table prints "successfully started on 127.0.0.1:0").
        s = services[0]
        ports.setdefault(s, free_port(host))
        args += [f"--{s}Host", host, f"--{s}Port", str(ports[s])]
    else:
        for s in ALL_SERVICES:  # the full binary starts all three; unused ones still need a port
            args += [f"--{s}Host", host, f"--{s}Port", str(ports.get(s, 0))]
        services = ALL_SERVICES
    args += ["--disableTelemetry", "--skipApiVersionCheck"]
    if silent:
        args.append("--silent")
    loc: Path | None = None
    if in_memory:
        args.append("--inMemoryPersistence")
    else:
        loc = Path(location).resolve()  # type: ignore[arg-type]
        loc.mkdir(parents=True, exist_ok=True)
        args += ["--location", str(loc)]

    proc = Proc("azurite", args, log_path=log_path, echo=echo)
    try:
        found = _wait_listening(proc, host, services, ports, timeout)
    except BaseException:  # includes Ctrl-C while starting: never leave Azurite behind
        proc.stop()
        raise
    return Azurite(proc=proc, host=host, ports={s: found[s] for s in services}, services=services,
                   location=loc, options={"log_path": log_path, "echo": echo, "silent": silent})


def _wait_listening(proc: Proc, host: str, services: Sequence[str], ports: dict[str, int],
                    timeout: float) -> dict[str, int]:
    # Ready lines differ: "successfully listening at URL" (azurite), "successfully started on
    # HOST:PORT" (azurite-table), "successfully listens on URL" (azurite-blob).
    proc.start("successfully", timeout=timeout)
    deadline = time.monotonic() + timeout
    found: dict[str, int] = {s: p for s, p in ports.items() if p} if len(services) == 1 else {}
    while True:
        for line in list(proc.lines):
            m = _LISTENING.search(line)
            if m:
                found[m.group(1).lower()] = int(m.group(2))
        if all(s in found for s in services):
            break
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"Azurite did not start {tuple(services)} (found {found}):\n{proc.output()[-4000:]}")
        time.sleep(0.05)
    for s in services:
        wait_for_port(host, found[s], timeout=max(1.0, deadline - time.monotonic()))
    return found
