"""``shared.http_headers``: responses read as the stdlib reads them, without the full ``email``
parse of a multipart header block (and the regular expression it compiles per boundary)."""

from __future__ import annotations

import http.client
import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.core.rest import HttpRequest
from urllib3 import PoolManager

from shared.http_headers import MAX_HEADERS, HeadersOnlyResponse
from shared.urllib3_transport import Urllib3Transport
from tests.unit.test_urllib3_transport import http_server
from tests.unit.tls_server import https_server

BOUNDARY = "batchresponse_5d1c8d4e-3b1f-4f6e-9a59-0c1d2e3f4a5b"
MULTIPART = (f"HTTP/1.1 202 Accepted\r\nContent-Type: multipart/mixed; boundary={BOUNDARY}\r\n"
             "x-ms-request-id: 1\r\nContent-Length: 5\r\n\r\nhello")
RESPONSES = {
    "multipart": MULTIPART,
    "json": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nETag: W/\"1\"\r\nContent-Length: 2\r\n\r\n{}",
    "chunked": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "close": "HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\nnope",
    "http/1.0": "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "no content": "HTTP/1.1 204 No Content\r\nETag: W/\"2\"\r\n\r\n",
    "100 continue first": "HTTP/1.1 100 Continue\r\nX-A: 1\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
    "folded header": "HTTP/1.1 200 OK\r\nX-Long: a\r\n b\r\nContent-Length: 0\r\n\r\n",
    "duplicate headers": "HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 0\r\n\r\n",
}


class FakeSocket:
    def __init__(self, data: str) -> None:
        self.data = data.encode("iso-8859-1")

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


def read(cls: type[http.client.HTTPResponse], raw: str, method: str = "GET") -> dict[str, Any]:
    r = cls(FakeSocket(raw), method=method)  # type: ignore[arg-type]
    r.begin()
    return {"status": r.status, "reason": r.reason, "version": r.version, "headers": r.headers.items(),
            "length": r.length, "chunked": r.chunked, "will_close": r.will_close, "body": r.read(),
            "type": type(r.headers), "content_type": r.headers.get_content_type(),
            "boundary": r.headers.get_param("boundary")}


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_a_response_reads_as_the_stdlib_reads_it(name: str) -> None:
    assert read(HeadersOnlyResponse, RESPONSES[name]) == read(http.client.HTTPResponse, RESPONSES[name])


def test_a_head_response_reads_as_the_stdlib_reads_it() -> None:
    raw = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
    assert read(HeadersOnlyResponse, raw, "HEAD") == read(http.client.HTTPResponse, raw, "HEAD")


@pytest.mark.parametrize("raw, error", [
    ("HTTP/1.1 200 OK\r\nX-Big: " + "a" * 70_000 + "\r\n\r\n", http.client.LineTooLong),
    ("HTTP/1.1 200 OK\r\n" + "X-A: 1\r\n" * (MAX_HEADERS + 1) + "\r\n", http.client.HTTPException),
])
def test_the_stdlibs_limits_hold(raw: str, error: type[Exception]) -> None:
    for cls in (http.client.HTTPResponse, HeadersOnlyResponse):
        with pytest.raises(error):
            cls(FakeSocket(raw)).begin()  # type: ignore[arg-type]


def multipart(_got: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return 202, {"Content-Type": f"multipart/mixed; boundary={BOUNDARY}"}, b"--" + BOUNDARY.encode() + b"--\r\n"


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The patterns ``re.compile`` is asked for (the email parser looks it up at each call)."""
    seen: list[str] = []
    real: Callable[..., Any] = re.compile

    def spy(pattern: Any, flags: int = 0) -> Any:
        seen.append(str(pattern))
        return real(pattern, flags)

    monkeypatch.setattr(re, "compile", spy)
    yield seen


def test_the_stdlib_compiles_a_pattern_per_multipart_boundary(compiled: list[str]) -> None:
    """The cost the module removes (so that the next test can fail)."""
    with http_server(multipart) as server, PoolManager() as pools:
        assert pools.request("GET", server.base).status == 202
    assert any(re.escape(BOUNDARY) in p for p in compiled)


def test_the_transport_reads_a_multipart_response_without_that_pattern(compiled: list[str],
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    with http_server(multipart) as server, Urllib3Transport() as transport:
        response = transport.send(HttpRequest("POST", f"{server.base}/$batch", content=b"x"))
    assert response.status_code == 202
    assert response.headers["Content-Type"] == f"multipart/mixed; boundary={BOUNDARY}"
    assert response.read() == b"--" + BOUNDARY.encode() + b"--\r\n"
    assert not any(re.escape(BOUNDARY) in p for p in compiled)
    assert not [r for r in caplog.records if r.name.startswith("urllib3")]  # its header check passed


def test_https_connections_and_a_calls_own_tls_settings_read_with_it_too(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Azure is HTTPS; a call's own ``connection_verify`` opens a pool of its own. Only the test
    server's responses are counted (http.server's ``Server`` header): in a whole test run, stores
    of earlier tests may still flush to Azurite in the background through the same class."""
    began: list[int] = []
    begin = HeadersOnlyResponse.begin

    def counted(self: HeadersOnlyResponse) -> None:
        begin(self)
        if str(self.headers.get("Server", "")).startswith("BaseHTTP/"):
            began.append(1)

    monkeypatch.setattr(HeadersOnlyResponse, "begin", counted)
    with https_server(tmp_path) as (base, ca_file):
        with Urllib3Transport(connection_verify=ca_file) as trusting:
            assert trusting.send(HttpRequest("GET", f"{base}/x")).text() == "secure"
        with Urllib3Transport() as transport:
            assert transport.send(HttpRequest("GET", f"{base}/x"), connection_verify=ca_file).text() == "secure"
    assert len(began) == 2
