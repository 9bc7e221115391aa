"""The Temporal peer's rig (app venv side, standard library + local.procs): the remotes simulator,
the status listener, the Temporal dev server and the worker + front, on free loopback ports.

bench/peer_rig.py's PeerRig with two processes instead of one: ``temporal server start-dev --headless
--db-filename WORK/temporal.sqlite`` (through devserver.py, so it dies with this process even on
a SIGKILL of the runner; stopped by PID: its process group) and ``python -m bench.peer_temporal``
(the worker and front, ``peer_proc``: what ``kill_peer`` SIGKILLs and ``start_peer`` restarts;
the dev server and its SQLite file stay, as the DBOS peer's database does).
"""

from __future__ import annotations

from pathlib import Path

from bench.peer_rig import PeerRig
from bench.peer_temporal.venv import ensure_temporal_venv
from local.procs import Proc, free_port, wait_for_port

SERVER_CPU = "temporal server"


class TemporalRig(PeerRig):
    # WAL, as the DBOS peer's SQLite (synchronous left as is): 10.0 orders/s at saturation against
    # 3.2 with the dev server's own journal, 10 s each, 48 in flight, same machine, same minute
    server_flags: tuple[str, ...] = ("--sqlite-pragma", "journal_mode=wal")

    def __init__(self, work: Path, echo: bool = False) -> None:
        self.temporal_port = free_port()
        self.server_proc: Proc | None = None
        super().__init__(work, echo=echo)

    def venv(self) -> tuple[Path, float]:
        return ensure_temporal_venv()

    def start(self) -> TemporalRig:
        db = self.work / "temporal.sqlite"
        self.server_proc = Proc("temporal", [
            str(self.python), "-m", "bench.peer_temporal.devserver", "--headless", "--db-filename", str(db),
            "--ip", "127.0.0.1", "--port", str(self.temporal_port), "--http-port", str(free_port()),
            "--metrics-port", str(free_port()), "--log-level", "error", *self.server_flags],
            log_path=self.work / "temporal.log", echo=self.echo).start("Temporal Server:", 60)
        try:
            wait_for_port("127.0.0.1", self.temporal_port, 30)
            super().start()
        except BaseException:
            self.server_proc.stop()  # the rest as PeerRig.start leaves it; stop() needs a started listener
            raise
        return self

    def peer_command(self) -> list[str]:
        return [str(self.python), "-m", "bench.peer_temporal", "--port", str(self.peer_port),
                "--temporal", f"127.0.0.1:{self.temporal_port}", "--remotes", self.remotes_url,
                "--status-url", self.listener.url]

    def cpu_pids(self) -> dict[str, int]:
        pids = super().cpu_pids()
        assert self.server_proc is not None
        pids[SERVER_CPU] = self.server_proc.pid  # devserver.py exec'd the server: the same pid
        return pids

    def stop(self) -> None:
        super().stop()
        if self.server_proc is not None:
            self.server_proc.stop()
