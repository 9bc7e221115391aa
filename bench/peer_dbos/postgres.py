"""A throw-away PostgreSQL for the peer's system database (``--db postgres``): Debian's server,
initdb'd in a temp dir and started by pg_ctl on a free loopback port, trust auth, no fsync off
(a commit is as durable as PostgreSQL makes it by default). Installs Debian's ``postgresql``
with apt-get only if no server binaries are found, as the Makefile does for chromium.

PostgreSQL refuses to run as root: as root, the cluster belongs to the ``postgres`` user the
Debian package creates, and its commands run through ``runuser``. Standard library only.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from local.procs import free_port


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        print("installing Debian's postgresql for the peer's system database ...", flush=True)
        subprocess.run(["apt-get", "update"], check=True)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "postgresql"], check=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent


class Postgres:
    """``start()`` → a SQLAlchemy URL of an empty database ``peer``; ``stop()`` removes it all."""

    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.dir = Path(tempfile.mkdtemp(prefix="peer-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.dir)

    def start(self) -> str:
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions")
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.dir / "pg.log"), "-w", "start")
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "peer")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/peer"

    def cpu_seconds(self) -> float:
        """CPU seconds of the server so far: the postmaster with its exited children (cutime,
        cstime) and its live ones (the backends of the peer's connection pool)."""
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0.0
        total = 0
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat", encoding="ascii") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(d) == postmaster:
                total += sum(int(x) for x in fields[11:15])
            elif int(fields[1]) == postmaster:
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.data.exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except subprocess.CalledProcessError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
