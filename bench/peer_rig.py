"""The peers' rig (bench.peer measures with it): the remotes simulator, the status listener and the peer process."""

from __future__ import annotations

import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.load import LoadRun, Poster, StatusEvents
from bench.peer_dbos.venv import ensure_peer_venv
from local.procs import Proc, free_port
from local.remotes.client import RemotesClient


class StatusListener(StatusEvents):
    """Receives the peer's status events (``POST /status``) and stamps their arrival, as
    bench.load.StatusWatcher does for our status queue, so LoadRun drives the peer as it drives our app."""

    def __init__(self) -> None:
        super().__init__()
        listener = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                now = time.time()
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()
                listener.record(raw, now)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/status"
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-listener", daemon=True)

    def start(self) -> StatusListener:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class PeerRig:
    """The remotes simulator, the status listener and the peer, on free loopback ports.
    bench/peer_temporal/rig.py's TemporalRig is one with the Temporal dev server beside the peer."""

    def __init__(self, work: Path, echo: bool = False) -> None:
        self.work = work
        self.echo = echo
        self.python, self.venv_build_seconds = self.venv()
        self.remotes_url = f"http://127.0.0.1:{free_port()}"
        self.peer_port = free_port()
        self.peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.listener = StatusListener()
        self.remotes_proc: Proc | None = None
        self.peer_proc: Proc | None = None
        self.remotes = RemotesClient(self.remotes_url)
        self.peer_starts: list[float] = []  # seconds from spawn to "peer ready", per start
        self.runs: list[LoadRun] = []

    def venv(self) -> tuple[Path, float]:
        return ensure_peer_venv()

    def peer_command(self) -> list[str]:
        return [str(self.python), "-m", "bench.peer_dbos", "--port", str(self.peer_port), "--remotes",
                self.remotes_url, "--db", str(self.work / "peer.sqlite"), "--status-url", self.listener.url]

    def cpu_pids(self) -> dict[str, int]:
        """The processes whose CPU is counted, by name: "peer" is the peer's own process."""
        assert self.remotes_proc is not None
        return {"peer": self.peer_pid, "remotes": self.remotes_proc.pid, "bench (load + listener)": os.getpid()}

    def start(self) -> PeerRig:
        self.listener.start()
        port = self.remotes_url.rsplit(":", 1)[1]
        self.remotes_proc = Proc("remotes", [sys.executable, "-m", "local.remotes", "--port", port],
                                 log_path=self.work / "remotes.log", echo=self.echo).start("remotes ready", 30)
        self.start_peer()
        return self

    def start_peer(self) -> float:
        """Start (or restart) the peer on the same database; seconds until it served."""
        t0 = time.monotonic()
        self.peer_proc = Proc("peer", self.peer_command(), log_path=self.work / "peer.log",
                              echo=self.echo).start("peer ready", 60)
        took = time.monotonic() - t0
        self.peer_starts.append(round(took, 2))
        return took

    @property
    def peer_pid(self) -> int:
        assert self.peer_proc is not None
        return self.peer_proc.pid

    def kill_peer(self) -> None:
        assert self.peer_proc is not None
        self.peer_proc.kill()

    def new_run(self, phase: str, seed: int = 0) -> LoadRun:
        run = LoadRun(Poster(self.peer_url, "peer-status", seed=seed), self.listener, phase)  # type: ignore[arg-type]
        self.runs.append(run)
        return run

    def order_ids(self) -> list[str]:
        """Every order accepted so far, over all runs."""
        return [oid for run in self.runs for oid in list(run.orders)]

    def stop(self) -> None:
        for proc in (self.peer_proc, self.remotes_proc):
            if proc is not None:
                proc.stop()
        self.remotes.close()
        self.listener.stop()

    def __enter__(self) -> PeerRig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
