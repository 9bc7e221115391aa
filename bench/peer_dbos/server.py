"""The peer's HTTP front and process: ``POST /orders`` → 202 ``{"orderId"}``, ``GET /orders/{id}``.

The POST answers once DBOS has written the workflow's start (its status row and inputs) to the
system database, the same point at which our submission answers: after that the order survives
a crash. Run with .venv-peer's python, from the repository root::

    python -m bench.peer_dbos --port P --remotes http://127.0.0.1:R --db /tmp/x/peer.sqlite \
        [--status-url http://127.0.0.1:S/status]

Prints ``peer ready http://HOST:PORT`` once DBOS is launched (after it queued the recovery of
the workflows a killed predecessor left pending) and it serves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import sqlite3
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dbos import DBOS, SetWorkflowID

from bench.peer_dbos import remote
from bench.peer_dbos.orders import BadOrder, normalise
from bench.peer_dbos.workflow import order_workflow


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "peer-dbos/1"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") != "/orders":
            self._send(404, {"error": f"not found: {self.path}"})
            return
        try:
            order = normalise(json.loads(raw))
        except (ValueError, BadOrder) as e:
            self._send(400, {"error": str(e)})
            return
        order_id = uuid.uuid4().hex
        with SetWorkflowID(order_id):
            DBOS.start_workflow(order_workflow, order_id, order)
        self._send(202, {"orderId": order_id})

    def do_GET(self) -> None:  # noqa: N802
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if parts == ["health"]:
            self._send(200, {"status": "ok"})
            return
        if len(parts) != 2 or parts[0] != "orders":
            self._send(404, {"error": f"not found: {self.path}"})
            return
        status = DBOS.get_workflow_status(parts[1])
        if status is None:
            self._send(404, {"error": f"no order {parts[1]}"})
            return
        body: dict[str, Any] = {"orderId": parts[1], "status": status.status}
        if status.output is not None:
            body.update(status.output)
        if status.error is not None:
            body["error"] = repr(status.error)
        self._send(200, body)


def set_wal(db: str) -> None:
    """Put the database in WAL mode before DBOS opens it (the mode is stored in the file). DBOS
    leaves SQLite's rollback journal, where every commit waits for readers to leave; WAL keeps
    each commit durable (synchronous stays FULL) and lets readers and the writer overlap."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")


class PeerServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512
    allow_reuse_address = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peer_dbos", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--remotes", required=True, help="base URL of the remotes simulator")
    ap.add_argument("--db", required=True, help="path of the SQLite system database")
    ap.add_argument("--status-url", default="", help="where to POST status events (none if empty)")
    ap.add_argument("--log-level", default="WARNING")
    args = ap.parse_args(argv)

    set_wal(args.db)
    remote.REMOTES_URL = args.remotes.rstrip("/")
    remote.STATUS_URL = args.status_url
    DBOS(config={"name": "peer-order", "system_database_url": f"sqlite:///{args.db}",
                 "application_version": "peer-order-1", "executor_id": "peer", "log_level": args.log_level})
    DBOS.launch()
    server = PeerServer((args.host, args.port), _Handler)

    def _stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"peer ready http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        DBOS.destroy(workflow_completion_timeout_sec=5)
    print("peer stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
