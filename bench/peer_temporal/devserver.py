"""``python -m bench.peer_temporal.devserver ARGS…``: exec the venv's ``temporal server start-dev ARGS…``
so that it dies with the process that started it.

Linux's PR_SET_PDEATHSIG survives the exec: if the bench runner dies (even SIGKILLed) the dev
server gets SIGKILL, so a crashed run leaves no server behind. A normal stop is by PID (the
process group, local.procs.Proc). Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent exits; exit now if the parent is already gone."""
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    if os.getppid() != parent:  # the parent died before prctl: nobody would stop us
        sys.exit(1)


def main() -> None:
    die_with_parent()
    temporal = Path(sys.executable).parent / "temporal"
    os.execv(temporal, [str(temporal), "server", "start-dev", *sys.argv[1:]])


if __name__ == "__main__":
    main()
