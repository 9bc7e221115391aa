"""``shared.urllib3_transport`` against real local servers (``http.server`` or a raw socket, on a free
port, in a thread): round trips, azure-core's retry policy over it, the error mapping the retry
policy depends on, streaming, TLS verification and many threads at once."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import (
    IncompleteReadError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline import Pipeline
from azure.core.pipeline.policies import RetryPolicy
from azure.core.pipeline.transport import HttpRequest as LegacyRequest
from azure.core.rest import HttpRequest
from urllib3 import exceptions as u3

from shared.urllib3_errors import azure_error
from shared.urllib3_transport import Urllib3Transport
from tests.unit.tls_server import https_server


class Handler(BaseHTTPRequestHandler):
    """Answers with what it received (JSON), as the test's ``answer`` says; counts connections."""

    protocol_version = "HTTP/1.1"
    answer: Callable[[BaseHTTPRequestHandler, dict[str, Any]], tuple[int, dict[str, str], bytes]]
    seen: list[dict[str, Any]]
    connections: list[int]

    def setup(self) -> None:
        super().setup()
        self.connections.append(1)

    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        got = {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body.decode()}
        self.seen.append(got)
        status, headers, out = self.answer(got)
        self.send_response(status)
        for k, v in {"Content-Length": str(len(out)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_MERGE = _any

    def log_message(self, *args: Any) -> None:
        pass


def echo(got: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json; charset=utf-8", "ETag": 'W/"1"'}, json.dumps(got).encode()


class _Server(ThreadingHTTPServer):
    # socketserver's listen backlog is 5: 32 threads connecting at once on a busy machine
    # overflowed it now and then, and the kernel reset a connection (ECONNRESET in the test)
    request_queue_size = 128


@contextmanager
def http_server(answer: Callable[..., tuple[int, dict[str, str], bytes]] = echo) -> Iterator[Any]:
    handler = type("H", (Handler,), {"answer": staticmethod(answer), "seen": [], "connections": []})
    server = _Server(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.base = f"http://127.0.0.1:{server.server_port}"  # type: ignore[attr-defined]
    server.handler = handler  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def raw_server(on_connection: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP server that hands each accepted connection to ``on_connection`` (then closes it)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                on_connection(conn)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk


@pytest.fixture
def transport() -> Iterator[Urllib3Transport]:
    with Urllib3Transport() as t:
        yield t


def test_a_rest_request_round_trips_status_headers_and_body(transport: Urllib3Transport) -> None:
    with http_server() as server:
        request = HttpRequest("PUT", f"{server.base}/orders(PartitionKey='a',RowKey='b')?x=1%202",
                              headers={"If-Match": "*", "x-ms-version": "2019-02-02"}, json={"Value": "é"})
        response = transport.send(request)
    assert (response.status_code, response.reason) == (200, "OK")
    assert response.headers["etag"] == response.headers["ETag"] == 'W/"1"'
    assert response.content_type == "application/json; charset=utf-8"
    assert response.is_closed and response.is_stream_consumed
    got = response.json()
    assert got["method"] == "PUT" and got["path"] == "/orders(PartitionKey='a',RowKey='b')?x=1%202"
    assert got["headers"]["If-Match"] == "*" and got["headers"]["x-ms-version"] == "2019-02-02"
    assert json.loads(got["body"]) == {"Value": "é"}
    assert json.loads(response.text()) == got and response.body() == response.content  # back-compat body()


def test_a_legacy_request_gets_a_legacy_response(transport: Urllib3Transport) -> None:
    with http_server() as server:
        response = transport.send(LegacyRequest("POST", f"{server.base}/$batch", data=b"--batch\r\n"))
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    assert json.loads(response.text())["body"] == "--batch\r\n"
    assert json.loads(response.body())["method"] == "POST"


def test_a_503_is_retried_by_an_azure_core_pipeline(transport: Urllib3Transport) -> None:
    answers = iter([(503, {"Retry-After": "0"}, b"busy"), (503, {}, b"busy"), (200, {}, b"done")])
    with http_server(lambda got: next(answers)) as server:
        pipeline = Pipeline(transport, policies=[RetryPolicy(retry_total=3, retry_backoff_factor=0)])
        response = pipeline.run(HttpRequest("GET", f"{server.base}/orders(PartitionKey='a',RowKey='b')")).http_response
        assert response.status_code == 200 and response.text() == "done"
        assert len(server.handler.seen) == 3


def test_connection_refused_is_a_service_request_error(transport: Urllib3Transport) -> None:
    with socket.socket() as bound:  # bound, not listening: connections to it are refused
        bound.bind(("127.0.0.1", 0))
        with pytest.raises(ServiceRequestError) as e:
            transport.send(HttpRequest("GET", f"http://127.0.0.1:{bound.getsockname()[1]}/x"))
    assert isinstance(e.value.inner_exception, u3.NewConnectionError)


def test_a_server_that_closes_without_answering_is_a_service_response_error(transport: Urllib3Transport) -> None:
    with raw_server(read_request) as base:
        with pytest.raises(ServiceResponseError) as e:
            transport.send(HttpRequest("GET", f"{base}/x"))
    assert not isinstance(e.value, ServiceRequestError)


@pytest.mark.parametrize("where", ["constructor", "call"])
def test_a_read_timeout_is_a_service_response_error(where: str) -> None:
    release = threading.Event()

    def hang(conn: socket.socket) -> None:
        read_request(conn)
        release.wait(30)

    with raw_server(hang) as base, Urllib3Transport(**({"read_timeout": 0.2} if where == "constructor" else {})) as t:
        try:
            with pytest.raises(ServiceResponseTimeoutError):
                t.send(HttpRequest("GET", f"{base}/x"), **({"read_timeout": 0.2} if where == "call" else {}))
        finally:
            release.set()


@pytest.mark.parametrize("stream", [False, True])
def test_a_body_cut_short_is_an_incomplete_read(transport: Urllib3Transport, stream: bool) -> None:
    def short(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")

    with raw_server(short) as base:
        with pytest.raises(IncompleteReadError):
            response = transport.send(HttpRequest("GET", f"{base}/x"), stream=stream)
            response.read()


@pytest.mark.parametrize(("error", "expected"), [
    (u3.NewConnectionError(None, "refused"), ServiceRequestError),  # type: ignore[arg-type]
    (u3.NameResolutionError("h", None, socket.gaierror()), ServiceRequestError),  # type: ignore[arg-type]
    (u3.ConnectTimeoutError("connect"), ServiceRequestTimeoutError),
    (u3.ReadTimeoutError(None, "/x", "read"), ServiceResponseTimeoutError),  # type: ignore[arg-type]
    (u3.ProtocolError("Connection aborted.", ConnectionResetError()), ServiceResponseError),
    (u3.SSLError("certificate verify failed"), ServiceRequestError),
])
def test_urllib3_errors_map_as_azure_core_maps_requests(error: Exception, expected: type) -> None:
    mapped = azure_error(error)
    assert type(mapped) is expected and mapped.inner_exception is error  # type: ignore[union-attr]
    assert azure_error(ValueError("not the transport's")) is None


def test_stream_leaves_the_body_to_the_caller_and_reuses_the_connection(transport: Urllib3Transport) -> None:
    with http_server(lambda got: (200, {}, b"x" * 10_000)) as server:
        response = transport.send(HttpRequest("GET", f"{server.base}/big"), stream=True)
        assert not response.is_stream_consumed
        assert b"".join(response.iter_bytes()) == b"x" * 10_000 and response.is_closed
        half = transport.send(HttpRequest("GET", f"{server.base}/big"), stream=True)
        assert len(next(half.iter_raw())) == transport.connection_config.data_block_size
        half.close()  # half read: its connection is dropped, not reused
        assert transport.send(HttpRequest("GET", f"{server.base}/big")).content == b"x" * 10_000
        assert len(server.handler.connections) == 2
        legacy = transport.send(LegacyRequest("GET", f"{server.base}/big"), stream=True)
        assert b"".join(legacy.stream_download(None)) == b"x" * 10_000


def test_many_threads_share_one_transport_and_its_pool() -> None:
    threads, each = 32, 10
    with http_server() as server, Urllib3Transport(pool_maxsize=threads) as t:
        def work(n: int) -> list[bool]:
            out = []
            for i in range(each):
                r = t.send(HttpRequest("POST", f"{server.base}/t", content=f"{n}-{i}".encode()))
                out.append(r.status_code == 200 and r.json()["body"] == f"{n}-{i}")
            return out

        with ThreadPoolExecutor(threads) as pool:
            results = [ok for oks in pool.map(work, range(threads)) for ok in oks]
        assert results == [True] * threads * each
        assert len(server.handler.connections) <= threads  # connections are reused, never one per request


def test_proxy_settings_in_the_environment_are_not_read(transport: Urllib3Transport,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{bound.getsockname()[1]}"  # a proxy there would refuse
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy)
        with http_server() as server:
            assert transport.send(HttpRequest("GET", f"{server.base}/x")).status_code == 200


def test_tls_is_verified_by_default(tmp_path: Path, transport: Urllib3Transport) -> None:
    with https_server(tmp_path) as (base, ca_file):
        with pytest.raises(ServiceRequestError) as e:
            transport.send(HttpRequest("GET", f"{base}/x"))
        assert isinstance(e.value.inner_exception, u3.SSLError)
        assert transport.send(HttpRequest("GET", f"{base}/x"), connection_verify=ca_file).text() == "secure"
        with Urllib3Transport(connection_verify=ca_file) as trusting:
            assert trusting.send(HttpRequest("GET", f"{base}/x")).text() == "secure"


def test_what_it_does_not_support_is_a_clear_error(transport: Urllib3Transport) -> None:
    request = HttpRequest("GET", "http://127.0.0.1:1/x")
    with pytest.raises(ValueError, match="proxies"):
        transport.send(request, proxies={"http": "http://proxy"})
    with pytest.raises(TypeError, match="cookies"):
        transport.send(request, cookies={"a": "b"})
    with pytest.raises(NotImplementedError, match="files"):
        transport.send(LegacyRequest("POST", "http://127.0.0.1:1/x", files={"f": b"x"}))


def test_a_closed_transport_refuses_to_send() -> None:
    with Urllib3Transport() as t:
        pass
    with pytest.raises(ValueError, match="closed"):
        t.send(HttpRequest("GET", "http://127.0.0.1:1/x"))
