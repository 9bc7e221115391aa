"""HTTP calls from the peer to the remotes simulator and to the runner's status listener.

Standard library only, one keep-alive connection per thread and destination (DBOS runs each
workflow on a thread of its pool). The answers mean what they mean to our agents: 200 success,
422/409 a permanent rejection, anything else (503, 429, a reset, a timeout) transient.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

REMOTES_URL = ""  # set by the peer's main: http://HOST:PORT of the simulator
STATUS_URL = ""  # set by the peer's main: where status events go ("" = nowhere)
CALL_TIMEOUT = 10.0  # seconds a remote call may take before it counts as transient
_PERMANENT = (409, 422)

_local = threading.local()


class Transient(Exception):
    """No definitive answer: the step is retried with the same idempotency key."""


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    conns: dict[str, http.client.HTTPConnection] = _local.__dict__.setdefault("conns", {})
    parts = urlsplit(url)
    base = f"{parts.hostname}:{parts.port}"
    conn = conns.get(base)
    if conn is None:
        conn = conns[base] = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    return conn, parts.path


def _drop(url: str) -> None:
    parts = urlsplit(url)
    conn = _local.__dict__.get("conns", {}).pop(f"{parts.hostname}:{parts.port}", None)
    if conn is not None:
        conn.close()


def _post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
    conn, path = _connection(url, timeout)
    try:
        if conn.sock is None:
            conn.connect()
            sock: socket.socket = conn.sock  # type: ignore[assignment]  # set by connect()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException):
        _drop(url)
        raise


def call(service: str, operation: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    """One remote call: ``{"outcome": "success", "result": …}`` on a 200, ``{"outcome": "error",
    "reason": …}`` on a permanent rejection; raises Transient otherwise."""
    url = f"{REMOTES_URL}/{service}/{operation}"
    try:
        status, data = _post(url, json.dumps(body).encode(), {"Idempotency-Key": key}, CALL_TIMEOUT)
    except (OSError, http.client.HTTPException) as e:
        raise Transient(f"{service}/{operation}: {e!r}") from None
    if status == 200:
        return {"outcome": "success", "result": json.loads(data)}
    if status in _PERMANENT:
        try:
            reason = json.loads(data).get("error")
        except ValueError:
            reason = data[:200].decode(errors="replace")
        return {"outcome": "error", "reason": f"{status} {reason}"}
    raise Transient(f"{service}/{operation}: {status} {data[:200]!r}")


def post_status(body: bytes) -> None:
    """Send one status event to STATUS_URL; a failure is dropped (the listener is a measurement aid)."""
    if not STATUS_URL:
        return
    for _ in (0, 1):  # once more on a stale keep-alive connection
        try:
            _post(STATUS_URL, body, {}, 5.0)
            return
        except (OSError, http.client.HTTPException):
            continue
