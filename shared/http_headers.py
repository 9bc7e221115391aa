"""urllib3 connections whose responses' header blocks are parsed as headers only.

Why: ``http.client`` hands a response's header block to the ``email`` package's full parser.
For a ``multipart/*`` Content-Type (every Table Storage ``$batch`` response) that parser gets
ready to split a body it is never given, and compiles a regular expression for the
response's one-off boundary: ~240 µs of CPU per response (``re``'s cache cannot help, each
boundary is new), ~5% of the app's CPU at saturation in a py-spy profile. urllib3 notes the
same parse's side effects (urllib3/urllib3#800: the multipart defects it has to ignore).

``HeadersOnlyResponse`` is ``http.client.HTTPResponse`` whose ``begin`` is the running Python's
own ``begin`` (its code object, not a copy of its source) with ``parse_headers`` bound to
``parse_headers_only``: the same header lines, read with the same limits, into the same
``HTTPMessage`` class, through ``email.parser.HeaderParser``. Only the message's payload
differs: an empty string where the full parser left an empty multipart list, which
urllib3's header check accepts either way. The table clients' transport
(``shared.urllib3_transport``) opens its connections through ``pool_classes``; nothing else in
the process is changed.
"""

from __future__ import annotations

import email.parser
import http.client
import types
from typing import Any

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

# the running http.client's own limits (a header line, the number of header lines)
MAX_LINE: int = getattr(http.client, "_MAXLINE", 65536)
MAX_HEADERS: int = getattr(http.client, "_MAXHEADERS", 100)


def parse_headers_only(fp: Any, _class: type[http.client.HTTPMessage] = http.client.HTTPMessage
                       ) -> http.client.HTTPMessage:
    """``http.client.parse_headers``, with the header block parsed as headers only."""
    lines = []
    while True:
        line = fp.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("header line")
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
        if line in (b"\r\n", b"\n", b""):
            break
    return email.parser.HeaderParser(_class=_class).parsestr(  # type: ignore[return-value]
        b"".join(lines).decode("iso-8859-1"))


def _begin_with_headers_only() -> Any:
    begin = http.client.HTTPResponse.begin
    scope = {**vars(http.client), "parse_headers": parse_headers_only}
    return types.FunctionType(begin.__code__, scope, begin.__name__, begin.__defaults__, begin.__closure__)


class HeadersOnlyResponse(http.client.HTTPResponse):
    """``http.client.HTTPResponse`` whose header block is parsed as headers only (module docstring)."""

    begin = _begin_with_headers_only()


class HeadersOnlyHTTPConnection(HTTPConnection):
    response_class = HeadersOnlyResponse


class HeadersOnlyHTTPSConnection(HTTPSConnection):
    response_class = HeadersOnlyResponse


class HeadersOnlyHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = HeadersOnlyHTTPConnection


class HeadersOnlyHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = HeadersOnlyHTTPSConnection


def pool_classes() -> dict[str, type[HTTPConnectionPool]]:
    """A ``PoolManager``'s ``pool_classes_by_scheme`` whose connections use ``HeadersOnlyResponse``."""
    return {"http": HeadersOnlyHTTPConnectionPool, "https": HeadersOnlyHTTPSConnectionPool}
