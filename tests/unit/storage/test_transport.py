"""The table requests' transport (shared/storage/transport.py) against a real local HTTP server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from azure.core import PipelineClient
from azure.core.exceptions import (
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.policies import RetryPolicy
from azure.core.rest import HttpRequest

from shared.storage.transport import Urllib3Transport

SEEN: list[tuple[str, str, dict[str, str], bytes]] = []


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        self._answer()

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        SEEN.append((self.command, self.path, dict(self.headers), body))
        if self.path.startswith("/hang"):
            threading.Event().wait(2)
        if self.path.startswith("/drop"):
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        status = 404 if self.path.startswith("/missing") else 200
        payload = b'{"value": [1, 2]}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("ETag", 'W/"1"')
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_request_goes_out_as_given_and_its_response_is_read_whole(server: str) -> None:
    SEEN.clear()
    with Urllib3Transport(4) as transport:
        response = transport.send(HttpRequest("POST", f"{server}/t?a=1", content=b"abc", headers={"X-Ms-Version": "v"}))
        assert SEEN == [("POST", "/t?a=1", SEEN[0][2], b"abc")] and SEEN[0][2]["X-Ms-Version"] == "v"
        assert response.status_code == 200 and response.reason == "OK"
        assert response.headers["etag"] == response.headers["ETag"] == 'W/"1"'
        assert response.content == response.read() == b'{"value": [1, 2]}' and response.json() == {"value": [1, 2]}
        assert response.text() == '{"value": [1, 2]}' and response.content_type == "application/json"
        assert response.is_closed and response.is_stream_consumed and list(response.iter_bytes()) == [response.content]
        response.raise_for_status()


def test_one_pool_per_origin_its_connection_kept_alive_and_closed_with_the_transport(server: str) -> None:
    """Requests to one origin share its pool (a kept-alive connection: one made for three
    sequential requests); another origin gets its own; ``close`` closes and forgets them."""
    SEEN.clear()
    other = server.replace("127.0.0.1", "localhost")
    transport = Urllib3Transport(4)
    for path in ("/a", "/b%20c?x=1&y=%2F", "/"):
        assert transport.send(HttpRequest("GET", f"{server}{path}")).status_code == 200
    assert transport.send(HttpRequest("GET", f"{other}/d")).status_code == 200
    assert [seen[1] for seen in SEEN] == ["/a", "/b%20c?x=1&y=%2F", "/", "/d"]
    assert sorted(transport.pools) == sorted([server, other])
    assert transport.pools[server].num_connections == 1 and transport.pools[server].pool.maxsize == 4
    pools = list(transport.pools.values())
    transport.close()
    assert transport.pools == {} and all(pool.pool is None for pool in pools)  # urllib3 drops a closed pool's queue


def test_an_error_status_is_a_response_and_raise_for_status_raises(server: str) -> None:
    response = Urllib3Transport(4).send(HttpRequest("GET", f"{server}/missing"))
    assert response.status_code == 404
    with pytest.raises(HttpResponseError):
        response.raise_for_status()


def test_through_the_pipeline_the_same_as_any_transport(server: str) -> None:
    client = PipelineClient(base_url=server, policies=[RetryPolicy()], transport=Urllib3Transport(4))
    response = client.send_request(HttpRequest("GET", f"{server}/p"))
    assert response.status_code == 200 and response.json() == {"value": [1, 2]}


def test_nothing_listening_is_a_request_error_the_pipeline_retries() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    transport = Urllib3Transport(4)
    with pytest.raises(ServiceRequestError) as raised:
        transport.send(HttpRequest("GET", f"http://127.0.0.1:{port}/"))
    assert type(raised.value) is ServiceRequestError  # refused: not a timeout
    tries: list[int] = []
    original = transport.send

    def counted(request: HttpRequest, **kwargs: object) -> object:
        tries.append(1)
        return original(request, **kwargs)

    transport.send = counted  # type: ignore[method-assign]
    client = PipelineClient(base_url="http://x", transport=transport,
                            policies=[RetryPolicy(retry_total=2, retry_backoff_factor=0)])
    with pytest.raises(ServiceRequestError):
        client.send_request(HttpRequest("GET", f"http://127.0.0.1:{port}/"))
    assert len(tries) == 3


@pytest.mark.parametrize(("path", "error"), [("/drop", ServiceResponseError), ("/hang", ServiceResponseTimeoutError)])
def test_a_dropped_or_late_response_is_a_response_error(server: str, path: str, error: type[Exception]) -> None:
    """The request went out: a response error (a POST is not retried by the pipeline on it)."""
    with pytest.raises(ServiceResponseError) as raised:
        Urllib3Transport(4).send(HttpRequest("GET", f"{server}{path}"), read_timeout=0.3)
    assert type(raised.value) is error


def test_an_unknown_keyword_is_refused_not_ignored(server: str) -> None:
    with pytest.raises(TypeError, match="proxies"):
        Urllib3Transport(4).send(HttpRequest("GET", f"{server}/"), proxies={"http": "x"})
