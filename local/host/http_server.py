"""The HTTP front end: routes requests to HTTP-triggered functions.

Auth levels are enforced as the Azure host enforces them (:mod:`local.host.keys`): a route's
``authLevel`` decides which key it needs, read from ``x-functions-key`` or ``?code=``, and a
request without it gets 401 before any function runs. Without keys (``--no-keys``, as
``func start`` runs) nothing is checked. Requests under the route prefix go to the functions;
``/admin/host/status`` (the master key) reports the instance (its WEBSITE_INSTANCE_ID) and ``/``
answers that the host is running.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import azure.functions as func

from .app import FunctionSpec, Invoker
from .keys import ADMIN, HostKeys, level_of, presented_key
from .routes import RouteTable, compile_route

log = logging.getLogger("local.host.http")

MAX_BODY = 100 * 1024 * 1024  # the host's default request size limit (ScriptConstants.DefaultMaxRequestBodySize)
BODY_LIMIT_SETTING = "FUNCTIONS_REQUEST_BODY_SIZE_LIMIT"  # the app setting that changes it, in bytes


def body_limit(env: Mapping[str, str]) -> int:
    """The largest request body taken (413 beyond): ``FUNCTIONS_REQUEST_BODY_SIZE_LIMIT`` when it is
    a whole number, as the host's ``HttpRequestBodySizeMiddleware`` reads it, else 100 MB."""
    value = (env.get(BODY_LIMIT_SETTING) or "").strip()
    return int(value) if value.isdigit() else MAX_BODY


def build_routes(specs: list[FunctionSpec], prefix: str) -> RouteTable:
    table = RouteTable()
    for s in specs:
        if s.trigger_type != "httpTrigger":
            continue
        route = s.trigger.get("route") or s.name
        table.add(compile_route(str(route), prefix, target=s, methods=s.trigger.get("methods")))
    return table


def response_parts(value: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """Turn a function's return value into (status, headers, body) as the worker's encoder does."""
    if value is None:
        return 204, [], b""
    if isinstance(value, func.HttpResponse) or (
            hasattr(value, "status_code") and hasattr(value, "get_body") and hasattr(value, "headers")):
        headers = [(str(k), str(v)) for k, v in value.headers.items()]
        if not any(k.lower() == "content-type" for k, _ in headers):
            mimetype = value.mimetype or "text/plain"
            ct = f"{mimetype}; charset={value.charset}" if mimetype.startswith("text/") else mimetype
            headers.append(("Content-Type", ct))
        return int(value.status_code), headers, value.get_body() or b""
    if isinstance(value, str):
        return 200, [("Content-Type", "text/plain; charset=utf-8")], value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return 200, [("Content-Type", "application/octet-stream")], bytes(value)
    return 200, [("Content-Type", "application/json; charset=utf-8")], json.dumps(value).encode("utf-8")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # the bench's lanes phase opens 160 connections at once (to 2 instances)

    def server_bind(self) -> None:
        # Every instance binds the same port; the kernel spreads connections between them.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


class HttpFrontEnd:
    def __init__(self, host: str, port: int, routes: RouteTable, invoker: Invoker, instance_id: str,
                 keys: HostKeys | None = None) -> None:
        self.routes = routes
        self.keys = keys  # None: no auth level is enforced (--no-keys)
        self.max_body = body_limit(os.environ)
        self.invoker = invoker
        self.instance_id = instance_id
        self.started = time.time()
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "local-functions-host"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("%s " + format, self.address_string(), *args)

            def _handle(self) -> None:
                front.handle(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _handle  # noqa: N815

        self.server = _Server((host, port), Handler)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def serve_forever(self) -> None:
        self.server.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ request handling

    def _read_body(self, h: BaseHTTPRequestHandler) -> bytes:
        if "chunked" in (h.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            total = 0
            while True:
                size_line = h.rfile.readline(1024)
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while h.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                total += size
                if total > self.max_body:
                    raise ValueError("body too large")
                chunks.append(h.rfile.read(size))
                h.rfile.readline(1024)
            return b"".join(chunks)
        length = int(h.headers.get("Content-Length") or 0)
        if length > self.max_body:
            raise ValueError("body too large")
        return h.rfile.read(length) if length else b""

    def _send(self, h: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        h.send_response(status)
        for k, v in headers:
            if k.lower() in ("content-length", "transfer-encoding", "connection"):
                continue
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD" and body:
            h.wfile.write(body)

    def _json(self, h: BaseHTTPRequestHandler, status: int, obj: Any) -> None:
        self._send(h, status, [("Content-Type", "application/json; charset=utf-8")], json.dumps(obj).encode())

    def allowed(self, level: str, h: BaseHTTPRequestHandler, params: dict[str, str]) -> bool:
        """Whether the request presents a key that ``level`` accepts (always, without keys)."""
        if self.keys is None:
            return True
        return self.keys.allows(level, presented_key(dict(h.headers.items()), params))

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        try:
            body = self._read_body(h)
        except ValueError:
            self._send(h, 413, [], b"")
            h.close_connection = True
            return
        split = urlsplit(h.path)
        path = split.path or "/"
        params: dict[str, str] = {}
        for k, v in parse_qsl(split.query, keep_blank_values=True):
            params[k] = f"{params[k]},{v}" if k in params else v
        if path.rstrip("/") == "/admin/host/status":
            if not self.allowed(ADMIN, h, params):
                self._send(h, 401, [], b"")
                return
            self._json(h, 200, {"state": "Running", "id": self.instance_id, "pid": os.getpid(),
                                "uptimeSeconds": round(time.time() - self.started, 3)})
            return
        route, route_params, allowed = self.routes.lookup(h.command, path)
        if route is None:
            if path in ("/", "") and h.command in ("GET", "HEAD"):
                self._send(h, 200, [("Content-Type", "text/plain; charset=utf-8")],
                           b"Your Functions 4.0 app is up and running (local host)\n")
            elif allowed:
                self._send(h, 405, [("Allow", ", ".join(sorted(allowed)))], b"")
            else:
                self._send(h, 404, [], b"")
            return
        spec: FunctionSpec = route.target
        if not self.allowed(level_of(spec.trigger.get("authLevel")), h, params):
            self._send(h, 401, [], b"")  # as the Azure host: 401, empty, the function never runs
            return
        headers: dict[str, str] = {}
        for k, v in h.headers.items():
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        host_header = h.headers.get("Host") or f"127.0.0.1:{self.port}"
        url = f"http://{host_header}{h.path}"
        req = func.HttpRequest(h.command, url, headers=headers, params=params, route_params=route_params,
                               body=body)
        try:
            result = self.invoker.invoke_blocking(spec, req, f"This HTTP triggered function executed "
                                                  f"({h.command} {path})", headers.get("traceparent"))
            status, resp_headers, resp_body = response_parts(result.value)
        except Exception as e:  # noqa: BLE001 - the client gets a 500 and the log has why
            if not getattr(e, "_logged_by_invoker", False):
                log.exception("'%s' failed to produce an HTTP response", spec.name)
            status, resp_headers, resp_body = 500, [], b""
        try:
            self._send(h, status, resp_headers, resp_body)
        except OSError:
            pass
