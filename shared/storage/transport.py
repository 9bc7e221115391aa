"""The table requests' HTTP transport: azure-core's public ``HttpTransport`` interface on urllib3
connection pools, one per origin.

azure-core lets a pipeline take any transport (its documented extension point; the Azure SDK
team's "Custom transport in Python SDK" shows one on HTTPX). Its own sync transport,
``RequestsTransport``, sends through ``requests.Session.request``, whose per-call work
(``prepare_request``, settings merges, hooks, cookies, adapters) profiled at ~17% of the app's
CPU at saturation, more than the urllib3 ``urlopen`` under it (measured: docs/reliability.md,
"Table requests").
This one does what :class:`shared.storage.tables.RestTable` needs and nothing else: its requests
(``azure.core.rest.HttpRequest`` with a bytes body, read whole), one ``urlopen``, no redirects,
no retries below the pipeline's ``RetryPolicy``, TLS verified (urllib3's defaults), no proxy.
A request goes to its origin's ``HTTPConnectionPool`` with its path alone. (A ``PoolManager``
re-parsed every URL with urllib3's ``parse_url`` and looked its pool up again: ~2.5% of the
function code's CPU at saturation in a py-spy profile.)
Errors become azure-core's, as ``RequestsTransport`` maps them: ``ServiceRequestError`` when the
request did not go out (no connection, a connect timeout, TLS) and ``ServiceResponseError`` when
it may have arrived (a read timeout, a connection broken after sending); the timeouts as their
``...TimeoutError`` subclasses.
Thread-safe: urllib3's pools are, and a pool is made under a lock; over ``maxsize`` busy
connections a thread opens one more (``block=False``) and it is dropped after use.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from azure.core.exceptions import (
    HttpResponseError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest import HttpRequest, HttpResponse
from urllib3 import BaseHTTPResponse, HTTPConnectionPool, Timeout
from urllib3.connectionpool import connection_from_url
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError, ProtocolError, ReadTimeoutError

CONNECT_SECONDS = 300.0  # azure-core's ConnectionConfiguration defaults
READ_SECONDS = 300.0


class Urllib3Transport(HttpTransport):  # type: ignore[type-arg]
    """azure-core transport over urllib3 connection pools, one per origin (see the module docstring)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.pools: dict[str, HTTPConnectionPool] = {}  # "scheme://host:port" -> its pool
        self._lock = threading.Lock()

    def pool(self, origin: str) -> HTTPConnectionPool:
        """The pool of ``origin`` (``scheme://host[:port]``), made on its first request."""
        pool = self.pools.get(origin)
        if pool is None:
            with self._lock:
                pool = self.pools.get(origin)
                if pool is None:
                    pool = self.pools[origin] = connection_from_url(origin, maxsize=self.maxsize, block=False,
                                                                    retries=False)
        return pool

    def __enter__(self) -> Urllib3Transport:
        return self

    def __exit__(self, *args: Any) -> None:
        self.close()

    def open(self) -> None:
        """Nothing to open: a pool connects on its first request."""

    def close(self) -> None:
        with self._lock:
            pools, self.pools = list(self.pools.values()), {}
        for pool in pools:
            pool.close()

    def send(self, request: HttpRequest, **kwargs: Any) -> Response:  # type: ignore[override]
        """Send ``request`` and read its response whole. ``connection_timeout`` / ``read_timeout``:
        seconds, for this request (300 each by default, as azure-core's)."""
        kwargs.pop("stream", None)  # every response is read whole: the table responses are small
        timeout = Timeout(connect=kwargs.pop("connection_timeout", CONNECT_SECONDS),
                          read=kwargs.pop("read_timeout", READ_SECONDS))
        if kwargs:
            raise TypeError(f"Urllib3Transport.send() got unsupported keywords {sorted(kwargs)}")
        url = urlsplit(request.url)
        target = f"{url.path or '/'}?{url.query}" if url.query else (url.path or "/")
        try:
            raw = self.pool(f"{url.scheme}://{url.netloc}").urlopen(
                request.method, target, body=request.content, headers=request.headers, retries=False, redirect=False,
                timeout=timeout, preload_content=True, assert_same_host=False)
        except NewConnectionError as exc:  # refused, no such host (a ConnectTimeoutError subclass)
            raise ServiceRequestError(exc, error=exc) from exc
        except ConnectTimeoutError as exc:
            raise ServiceRequestTimeoutError(exc, error=exc) from exc
        except ReadTimeoutError as exc:
            raise ServiceResponseTimeoutError(exc, error=exc) from exc
        except ProtocolError as exc:  # the connection broke after the request went out
            raise ServiceResponseError(exc, error=exc) from exc
        except HTTPError as exc:  # TLS and the rest: the request did not go out
            raise ServiceRequestError(exc, error=exc) from exc
        return Response(request, raw)


class Response(HttpResponse):
    """A response read whole: azure-core's public ``HttpResponse`` interface over urllib3's."""

    def __init__(self, request: HttpRequest, raw: BaseHTTPResponse) -> None:
        self._request = request
        self.raw = raw
        self._content: bytes = raw.data
        self._encoding: str | None = None

    @property
    def request(self) -> HttpRequest:
        return self._request

    @property
    def status_code(self) -> int:
        return self.raw.status

    @property
    def headers(self) -> MutableMapping[str, str]:
        return self.raw.headers  # urllib3's HTTPHeaderDict: case-insensitive

    @property
    def reason(self) -> str:
        return self.raw.reason or ""

    @property
    def content_type(self) -> str | None:
        return self.raw.headers.get("Content-Type")

    @property
    def is_closed(self) -> bool:
        return True

    @property
    def is_stream_consumed(self) -> bool:
        return True

    @property
    def encoding(self) -> str | None:
        return self._encoding

    @encoding.setter
    def encoding(self, value: str | None) -> None:
        self._encoding = value

    @property
    def url(self) -> str:
        return self._request.url

    @property
    def content(self) -> bytes:
        return self._content

    def text(self, encoding: str | None = None) -> str:
        return self._content.decode(encoding or self._encoding or "utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self._content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise HttpResponseError(response=self)

    def read(self) -> bytes:
        return self._content

    def iter_raw(self, **kwargs: Any) -> Iterator[bytes]:
        yield self._content

    def iter_bytes(self, **kwargs: Any) -> Iterator[bytes]:
        yield self._content

    def close(self) -> None:
        """The body was read whole and the connection went back to its pool."""

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *args: Any) -> None:
        self.close()
