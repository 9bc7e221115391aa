"""Start and stop the local stack's processes: free ports, readiness lines, stop by PID.

Used by ``local.stack`` and by the pytest fixtures alike, so that tests start the stack the
way users do. Every child gets its own process group, so stopping it also stops anything it
spawned (the host's instances, Azurite's node process) and nothing is orphaned.
"""

from __future__ import annotations

import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def serve_until_signalled(server: socketserver.BaseServer, ready_line: str) -> None:
    """Serve ``server`` until SIGTERM or Ctrl-C, then close it: ``ready_line`` is printed once it
    serves (what ``Proc.start`` waits for). ``shutdown`` blocks until ``serve_forever`` returns, so
    the signal handler calls it off the main thread."""

    def _stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(ready_line, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s") from None
            time.sleep(0.05)


class Proc:
    """A child process whose output is collected and scanned for a readiness word."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
        log_path: Path | None = None,
        echo: bool = False,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.args = list(args)
        self.env = env
        self.cwd = str(cwd or REPO_ROOT)
        self.log_path = log_path
        self.echo = echo
        # Called for every output line, in order: for facts that must outlive the bounded
        # ``lines`` buffer (e.g. the host's `instance K pid PID` lines under heavy logging).
        self.on_line = on_line
        self.lines: deque[str] = deque(maxlen=2000)
        self.popen: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self, ready_word: str | None = "ready", timeout: float = 60.0) -> Proc:
        """Start the process; unless ``ready_word`` is None, wait until a line contains it.

        Each start has its own pump thread and events: after a restart, the pump of the process
        before may still be reading that process's last output, and its end is not this one's."""
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.popen = popen = subprocess.Popen(
            self.args,
            cwd=self.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # own process group: stop() reaches its children too
        )
        seen = threading.Event()  # the ready word was printed
        woken = threading.Event()  # ... or the output ended (the process exited)
        threading.Thread(target=self._pump, args=(popen, ready_word or "", seen, woken),
                         name=f"pump-{self.name}", daemon=True).start()
        if ready_word is None:
            return self
        if not woken.wait(timeout) or not seen.is_set():
            tail = "\n".join(list(self.lines)[-40:])
            self.stop()
            raise RuntimeError(f"{self.name} did not print {ready_word!r} within {timeout}s "
                               f"(exit code {popen.poll()}):\n{tail}")
        return self

    def _pump(self, popen: subprocess.Popen[str], ready_word: str, seen: threading.Event,
              woken: threading.Event) -> None:
        """Collect ``popen``'s output; set ``seen`` and ``woken`` at the ready word, ``woken`` at the end."""
        assert popen.stdout is not None
        log = open(self.log_path, "a", encoding="utf-8") if self.log_path else None
        try:
            for line in popen.stdout:
                line = line.rstrip("\n")
                self.lines.append(line)
                if self.on_line is not None:
                    self.on_line(line)
                if log:
                    log.write(line + "\n")
                    log.flush()
                if self.echo:
                    sys.stderr.write(f"[{self.name}] {line}\n")
                if ready_word and ready_word in line:
                    seen.set()
                    woken.set()
        finally:
            if log:
                log.close()
        popen.wait()
        woken.set()  # wake start(): it tells "exited" from "ready" by ``seen``

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, for chaos tests."""
        self._signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``timeout``."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        # Children may outlive the leader; the group id is the leader's pid.
        self._signal(signal.SIGKILL)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def _signal(self, sig: int) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def output(self) -> str:
        return "\n".join(self.lines)
