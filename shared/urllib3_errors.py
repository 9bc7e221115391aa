"""urllib3's exceptions as azure-core's, so that the SDK's retry policy sees what it saw under
``RequestsTransport`` (azure-core's ``_requests_basic``, where requests wraps the same urllib3 errors):

* no request reached the service (refused, DNS, TLS, proxy, connect timeout): ``ServiceRequestError``
  (``ServiceRequestTimeoutError`` for a connect timeout);
* the request may have reached it (read timeout, reset or closed before or during the response,
  bad status line): ``ServiceResponseError`` (``ServiceResponseTimeoutError`` for a read timeout).
  One difference: requests turned a reset in the middle of a body into ``ChunkedEncodingError``,
  which azure-core made an ``HttpResponseError``; both are retried (for retryable methods);
* the body ended before its ``Content-Length``: ``IncompleteReadError``; an undecodable
  ``Content-Encoding``: ``DecodeError``.
"""

from __future__ import annotations

from azure.core.exceptions import (
    AzureError,
    DecodeError,
    IncompleteReadError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from urllib3 import exceptions as u3


def _incomplete(error: BaseException) -> bool:
    """A body cut short: urllib3 raises ``ProtocolError("Connection broken: IncompleteRead(...)")``."""
    return isinstance(error, u3.IncompleteRead) or any(isinstance(a, u3.IncompleteRead) for a in error.args) \
        or "IncompleteRead" in str(error)


def azure_error(error: Exception) -> AzureError | None:
    """The azure-core error for a urllib3 ``error`` (None: not a transport error, let it through)."""
    if isinstance(error, u3.NewConnectionError):  # refused, DNS (NameResolutionError): before ConnectTimeoutError,
        return ServiceRequestError(error, error=error)  # whose subclass it is
    if isinstance(error, u3.ConnectTimeoutError):
        return ServiceRequestTimeoutError(error, error=error)
    if isinstance(error, u3.ReadTimeoutError):
        return ServiceResponseTimeoutError(error, error=error)
    if isinstance(error, (u3.SSLError, u3.ProxyError)):
        return ServiceRequestError(error, error=error)
    if isinstance(error, u3.DecodeError):
        return DecodeError(error, error=error)
    if isinstance(error, (u3.ProtocolError, u3.IncompleteRead)):
        if _incomplete(error):
            return IncompleteReadError(error, error=error)
        return ServiceResponseError(error, error=error)
    if isinstance(error, u3.HTTPError):  # e.g. LocationParseError, EmptyPoolError, HeaderParsingError
        return ServiceRequestError(error, error=error)
    return None
