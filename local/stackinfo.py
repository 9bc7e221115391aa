"""``.local/stack.json``: what the running local stack says about itself, read safely.

``local.stack`` writes the file once every process is ready and removes it when it stops
(a normal stop, Ctrl-C, SIGTERM, SIGHUP, a failed start). A stack killed outright (SIGKILL)
cannot remove it; a reader then finds the process that wrote it gone, or its host not
answering. ``read_running`` raises ``StackNotRunning`` saying which, so nobody is handed the
URL of a stack that is not there.

    .venv/bin/python -m local.stackinfo [--key baseUrl | --remotes] [--state-dir .local]

prints the running stack's base URL (or another field of stack.json: ``--key remotes`` prints
that object as JSON, ``--key remotes.baseUrl`` one field of it; ``--remotes`` is the remote
services simulator's base URL, the same as ``--key remotes.baseUrl``), or writes why the stack
is not running to stderr and exits 1 (printing nothing, so ``BASE=$(...)`` stays empty). Standard
library only: ``python3 -m local.stackinfo`` works outside the venv too.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

STACK_JSON = "stack.json"
DEFAULT_STATE_DIR = Path(__file__).resolve().parent.parent / ".local"
START_HINT = "start it with `make run`"
CONNECT_TIMEOUT = 2.0


class StackNotRunning(RuntimeError):
    """No local stack is running from this state folder; the message says how we know."""


def pid_alive(pid: object) -> bool:
    """Whether a process with this pid exists (signal 0 checks without sending anything)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def _answers(url: str) -> bool:
    parts = urlsplit(url)
    if not parts.hostname or not parts.port:
        return False
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=CONNECT_TIMEOUT):
            return True
    except OSError:
        return False


def read_running(state_dir: Path | str = DEFAULT_STATE_DIR) -> dict[str, Any]:
    """stack.json of the stack running from ``state_dir``; StackNotRunning if there is none."""
    path = Path(state_dir) / STACK_JSON
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StackNotRunning(f"the local stack is not running: {path} does not exist (it is written when "
                              f"the stack is ready and removed when it stops); {START_HINT}") from None
    except (OSError, ValueError) as exc:
        raise StackNotRunning(f"the local stack is not running: {path} cannot be read ({exc}); "
                              f"{START_HINT}") from None
    if not isinstance(data, dict):
        raise StackNotRunning(f"the local stack is not running: {path} is not a stack description; {START_HINT}")
    stack_pid = data.get("stackPid")
    if not pid_alive(stack_pid):
        raise StackNotRunning(f"the local stack is not running: the process that wrote {path} (pid {stack_pid}) "
                              f"is gone, killed before it could clean up; {START_HINT}")
    base_url = str(data.get("baseUrl") or "")
    if not _answers(base_url):
        host_log = (data.get("logs") or {}).get("host", "the host's log")
        raise StackNotRunning(f"the local stack (pid {stack_pid}) is up but its host does not answer at "
                              f"{base_url or '(no baseUrl)'}; see {host_log}, or restart: {START_HINT}")
    return data


def field(data: dict[str, Any], key: str) -> Any:
    """stack.json's field ``key``; ``a.b`` is field ``b`` of the object ``a``. KeyError saying what
    there is instead when there is no such field."""
    value: Any = data
    path: list[str] = []
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            where = f"field {'.'.join(path)!r}" if path else "stack.json"
            has = f"it has: {', '.join(sorted(value))}" if isinstance(value, dict) else "it is not an object"
            raise KeyError(f"{where} has no field {part!r}; {has}")
        value = value[part]
        path.append(part)
    return value


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=".venv/bin/python -m local.stackinfo", description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--key", default="baseUrl",
                       help="field of stack.json to print (default baseUrl); a.b: field b of object a")
    which.add_argument("--remotes", dest="key", action="store_const", const="remotes.baseUrl",
                       help="print the remote services simulator's base URL (--key remotes.baseUrl)")
    ap.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR), help="default .local")
    args = ap.parse_args(list(argv) if argv is not None else None)
    try:
        data = read_running(args.state_dir)
    except StackNotRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        value = field(data, args.key)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    print(value if isinstance(value, str) else json.dumps(value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
