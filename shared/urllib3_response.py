"""The responses of ``shared.urllib3_transport``: azure-core's two response types over a
``urllib3.HTTPResponse``, as ``RequestsTransport`` builds them over a ``requests.Response``.

* ``RestUrllib3Response`` for an ``azure.core.rest.HttpRequest`` (what the SDKs' ``send_request``
  and generated operations send): built on azure-core's ``HttpResponseImpl``, the base of its own
  transports' rest responses, so it has the back-compat members the Tables SDK uses
  (``parts()`` in ``submit_transaction``, ``body()``). Not ``azure.core.rest`` public API: an
  azure-core without it fails this module's import, and ``shared.clients`` then falls back to
  ``RequestsTransport``.
* ``Urllib3Response`` for a legacy ``azure.core.pipeline.transport.HttpRequest``.

A response is either read whole by the transport (``stream=False``) or streamed by the caller
(``stream=True``: ``read()``, ``iter_bytes()``, ``iter_raw()``, ``stream_download()``). Closing it
gives its connection back to the pool when the body was read to the end, else drops the socket
(a half-read connection cannot carry the next request).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from azure.core.pipeline.transport import HttpResponse as LegacyHttpResponse
from azure.core.rest._http_response_impl import HttpResponseImpl
from azure.core.utils import case_insensitive_dict
from urllib3 import BaseHTTPResponse

from shared.urllib3_errors import azure_error


def release(raw: BaseHTTPResponse) -> None:
    """Give ``raw``'s connection back to the pool; close the socket first if the body was not all read."""
    if not raw.closed:
        raw.close()
    raw.release_conn()


def _failed(raw: BaseHTTPResponse, exc: Exception) -> Exception:
    """After a read of ``raw`` raised ``exc``: its socket dropped, and what to raise (azure-core's
    error for urllib3's; ``exc`` itself for anything else)."""
    release(raw)
    return azure_error(exc) or exc


def chunks(raw: BaseHTTPResponse, block_size: int, *, decompress: bool) -> Iterator[bytes]:
    """The body in chunks of up to ``block_size``, with urllib3's errors as azure-core's."""
    try:
        yield from raw.stream(block_size, decode_content=decompress)
    except Exception as exc:
        error = _failed(raw, exc)
        if error is exc:
            raise
        raise error from exc


def read_all(raw: BaseHTTPResponse) -> bytes:
    """The whole body (decoded per ``Content-Encoding``), with urllib3's errors as azure-core's."""
    try:
        return raw.read(decode_content=True)
    except Exception as exc:
        error = _failed(raw, exc)
        if error is exc:
            raise
        raise error from exc
    finally:
        if raw.closed:
            raw.release_conn()


class StreamDownloadGenerator:
    """azure-core's stream download protocol: ``(pipeline, response, decompress=...)`` -> chunks."""

    def __init__(self, pipeline: Any, response: Any, *, decompress: bool = True) -> None:
        self.pipeline, self.response = pipeline, response
        raw: BaseHTTPResponse = response.internal_response
        self.content_length = int(response.headers.get("Content-Length", 0) or 0)
        self._chunks = chunks(raw, response.block_size, decompress=decompress)

    def __len__(self) -> int:
        return self.content_length

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._chunks)


class RestUrllib3Response(HttpResponseImpl):
    """An ``azure.core.rest.HttpResponse`` over a urllib3 response (``content`` set if preloaded)."""

    def __init__(self, *, request: Any, internal_response: BaseHTTPResponse, block_size: int,
                 content: bytes | None = None) -> None:
        headers = case_insensitive_dict(internal_response.headers)
        super().__init__(request=request, internal_response=internal_response, block_size=block_size,
                         status_code=internal_response.status, reason=internal_response.reason or "",
                         content_type=headers.get("Content-Type"), headers=headers,
                         stream_download_generator=StreamDownloadGenerator)
        self._content = content

    def close(self) -> None:
        if not self.is_closed:
            self._is_closed = True
            release(self._internal_response)


class Urllib3Response(LegacyHttpResponse):
    """A legacy ``azure.core.pipeline.transport.HttpResponse`` over a urllib3 response."""

    def __init__(self, request: Any, internal_response: BaseHTTPResponse, block_size: int,
                 content: bytes | None = None) -> None:
        super().__init__(request, internal_response, block_size=block_size)
        self.status_code = internal_response.status
        self.headers = case_insensitive_dict(internal_response.headers)
        self.reason = internal_response.reason
        self.content_type = self.headers.get("Content-Type")
        self._content = content

    def body(self) -> bytes:
        if self._content is None:
            self._content = read_all(self.internal_response)
        return self._content

    def stream_download(self, pipeline: Any, **kwargs: Any) -> Iterator[bytes]:
        return StreamDownloadGenerator(pipeline, self, **kwargs)
