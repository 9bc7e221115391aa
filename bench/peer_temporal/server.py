"""The Temporal peer's worker and HTTP front, one process: ``POST /orders`` → 202 ``{"orderId"}``,
``GET /orders/{id}``, the DBOS peer's API, so bench's load generator drives it unchanged.

The POST answers once the dev server has recorded the workflow's start (``start_workflow``
returns after the server persisted it), the same point at which our submission and the DBOS
peer answer. Run with .venv-temporal's python, from the repository root, once the dev server
serves on ``--temporal``::

    python -m bench.peer_temporal --port P --temporal 127.0.0.1:T --remotes http://127.0.0.1:R \
        [--status-url http://127.0.0.1:S/status]

Prints ``peer ready http://HOST:PORT`` once the worker polls and the front listens. Dies with
the process that started it (PR_SET_PDEATHSIG, see devserver.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from bench.peer_dbos import remote
from bench.peer_dbos.orders import BadOrder, normalise
from bench.peer_temporal.activities import ACTIVITIES
from bench.peer_temporal.devserver import die_with_parent
from bench.peer_temporal.workflow import TASK_QUEUE, WORKFLOW, OrderWorkflow

ACTIVITY_THREADS = 64  # activities in flight at once (the DBOS peer's pool is DBOS's own)


class Front:
    def __init__(self, client: Client) -> None:
        self.client = client

    async def route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        parts = [p for p in path.split("?")[0].split("/") if p]
        if method == "POST" and parts == ["orders"]:
            try:
                order = normalise(json.loads(body))
            except (ValueError, BadOrder) as e:
                return 400, {"error": str(e)}
            order_id = uuid.uuid4().hex
            await self.client.start_workflow(WORKFLOW, args=[order_id, order], id=order_id, task_queue=TASK_QUEUE)
            return 202, {"orderId": order_id}
        if method == "GET" and parts == ["health"]:
            return 200, {"status": "ok"}
        if method == "GET" and len(parts) == 2 and parts[0] == "orders":
            handle = self.client.get_workflow_handle(parts[1])
            try:
                desc = await handle.describe()
            except RPCError as e:
                if e.status == RPCStatusCode.NOT_FOUND:
                    return 404, {"error": f"no order {parts[1]}"}
                raise
            status = desc.status.name if desc.status is not None else "UNKNOWN"
            out: dict[str, Any] = {"orderId": parts[1], "status": status}
            if desc.status == WorkflowExecutionStatus.COMPLETED:
                out.update(await handle.result())
            return 200, out
        return 404, {"error": f"not found: {method} {path}"}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """HTTP/1.1 with keep-alive, as the load generator speaks it: Content-Length bodies only."""
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                line = await reader.readline()
                if not line.strip():
                    break
                method, path = line.decode("latin-1").split(" ", 2)[:2]
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                try:
                    status, payload = await self.route(method, path, body)
                except Exception as e:  # noqa: BLE001 - a 500 to the client, the front goes on
                    status, payload = 500, {"error": repr(e)}
                data = json.dumps(payload, default=str).encode()
                writer.write(f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()


async def run(args: argparse.Namespace) -> None:
    client = await Client.connect(args.temporal, namespace="default")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with ThreadPoolExecutor(max_workers=ACTIVITY_THREADS, thread_name_prefix="activity") as pool:
        worker = Worker(client, task_queue=TASK_QUEUE, workflows=[OrderWorkflow], activities=ACTIVITIES,
                        activity_executor=pool, max_concurrent_activities=ACTIVITY_THREADS,
                        max_concurrent_local_activities=ACTIVITY_THREADS)
        async with worker:
            front = await asyncio.start_server(Front(client).serve, args.host, args.port, backlog=512)
            async with front:
                print(f"peer ready http://{args.host}:{args.port}", flush=True)
                await stop.wait()
    print("peer stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peer_temporal", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--temporal", required=True, help="HOST:PORT of the Temporal dev server's gRPC front end")
    ap.add_argument("--remotes", required=True, help="base URL of the remotes simulator")
    ap.add_argument("--status-url", default="", help="where to POST status events (none if empty)")
    args = ap.parse_args(argv)
    die_with_parent()
    remote.REMOTES_URL = args.remotes.rstrip("/")
    remote.STATUS_URL = args.status_url
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
