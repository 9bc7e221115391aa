"""One request's call to the agent's remote service, retried on transient faults until completeBy.

``POST {base}/{operation}`` with ``Idempotency-Key`` and ``traceparent`` headers and the body
``{"orderId", "order", "context"}`` (plus ``compensates`` for a compensation). Transient faults
(connect errors, timeouts, 408/425/429, 5xx, a 2xx whose body is not a JSON object) are retried
by tenacity with exponential backoff plus jitter (at least the server's ``Retry-After``), never
past completeBy; each call's timeout is bounded by the time left and by a per-call maximum. The
idempotency key is the same on every attempt, so a lost response is answered from the service's
stored result and the effect happens once. Any other answer is final.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import tenacity
import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ProxyError,
    SSLError,
)
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from shared.agent.guard import CallGuard
from shared.agent.parsing import ReceivedRequest
from shared.core import jsonio
from shared.observability import telemetry

TRANSIENT_STATUSES = frozenset({408, 425, 429})


def loads(data: bytes | str) -> Any:
    """Strict JSON with every non-integer number a Decimal (the app's ``shared.core.jsonio.loads``)."""
    return jsonio.loads(data)


def dumps(value: Any) -> bytes:
    """JSON with Decimals as strings (the app's ``shared.core.jsonio.dumps``), UTF-8."""
    return jsonio.dumps(value).encode("utf-8")


@dataclass(frozen=True)
class RetryPolicy:
    initial_backoff: float = 0.2  # first wait, seconds; doubles per attempt
    max_backoff: float = 5.0
    jitter: float = 0.2  # uniform random seconds added to each wait
    max_call_timeout: float = 10.0  # upper bound of one call's (read) timeout
    connect_timeout: float = 3.0
    min_call_seconds: float = 0.05  # do not start a call with less time left than this
    max_attempts: int | None = None  # None: keep retrying until completeBy


@dataclass(frozen=True)
class RemoteAnswer:
    """The service's final answer: a 2xx with its JSON object, or a rejection with its reason."""

    status: int
    payload: Any  # 2xx: the result object; otherwise the reason (str)

    @property
    def succeeded(self) -> bool:
        return 200 <= self.status < 300


class TransientFault(Exception):
    """A call that may succeed if repeated (retried while time is left)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class DeadlineReached(Exception):
    """completeBy came before an answer: the step is the Supervisor's now, nothing is sent."""

    def __init__(self, when: str, detail: str, fault: str | None = None) -> None:
        super().__init__(detail)
        self.when = when  # "during retries" | "before the next call"
        self.detail = detail
        self.fault = fault  # the last transient fault, if any


class RetriesExhausted(Exception):
    """``max_attempts`` transient faults while time was still left."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------- pools

_pools: dict[str, urllib3.HTTPConnectionPool] = {}
_pools_lock = threading.Lock()


def pool_for(base_url: str, pool_size: int = 32) -> urllib3.HTTPConnectionPool:
    """One urllib3 connection pool per worker per remote host, shared by the worker's threads.

    urllib3 directly, not requests: requests' per-call preparation (settings merge, hooks, adapter
    lookup) cost about half of the remote call's CPU. The pool is thread-safe and sized for the
    worker's 32 function threads; its own retries are off (tenacity retries, bounded by completeBy)
    and so are redirects (a 3xx is a final answer). No proxy from the environment, as before.
    """
    origin = urllib3.util.parse_url(base_url)
    key = f"{origin.scheme}://{origin.netloc}"
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = urllib3.connection_from_url(key, maxsize=pool_size, block=False, retries=False)
            _pools[key] = pool
        return pool


# --------------------------------------------------------------------------- the call

@functools.lru_cache(maxsize=256)
def _path_of(url: str) -> str:
    """The path of a remote operation's URL, as the pool is asked for it (parsed once per URL)."""
    return urllib3.util.parse_url(url).request_uri


@dataclass(frozen=True)
class _Reply:
    """One HTTP answer, read in full."""

    status: int
    headers: Any  # urllib3's HTTPHeaderDict (case-insensitive ``get``)
    data: bytes


@dataclass
class RemotePost:
    """One request's POST, repeated on transient faults until an answer or completeBy."""

    pool: urllib3.HTTPConnectionPool
    url: str  # ``{base_url}/{operation}``, on the pool's host
    body: bytes
    headers: dict[str, str]
    policy: RetryPolicy
    time_left: Callable[[], float]  # seconds until completeBy
    now: Callable[[], datetime]
    statuses: list[int | str] = field(default_factory=list)  # per call: HTTP status or fault
    guard: CallGuard | None = None  # the remote's circuit breaker (None: no breaker)

    @classmethod
    def for_request(cls, request: ReceivedRequest, base_url: str, pool: urllib3.HTTPConnectionPool,
                    policy: RetryPolicy, time_left: Callable[[], float], now: Callable[[], datetime],
                    guard: CallGuard | None = None) -> RemotePost:
        """The call ``request`` asks for, in the current (the agent's) span: its ``traceparent``
        here; when spans are recorded each call is a CLIENT span of its own and sends that instead."""
        headers = telemetry.inject({
            "Idempotency-Key": request.idempotency_key,
            "Content-Type": "application/json",
            "Accept": "application/json",
        })
        body: dict[str, Any] = {"orderId": request.order_id, "order": request.order, "context": request.context}
        if request.compensates is not None:
            body["compensates"] = request.compensates.model_dump(by_alias=True)
        return cls(pool, f"{base_url}/{request.operation}", dumps(body), headers, policy, time_left, now,
                   guard=guard)

    def run(self, sleep: Callable[[float], None],
            on_retry: Callable[[tenacity.RetryCallState], None]) -> RemoteAnswer:
        """The final answer. Raises :class:`DeadlineReached` or :class:`RetriesExhausted`."""
        stop = _StopAtDeadline(self.policy, self.time_left)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TransientFault),
            wait=_BoundedWait(self.policy, self.time_left),
            stop=stop,
            sleep=sleep,
            before_sleep=on_retry,
            reraise=True,
        )
        try:
            return retrying(self._post_once)
        except TransientFault as e:
            if self.time_left() - self.policy.min_call_seconds <= 0 or stop.stopped_by_deadline:
                raise DeadlineReached("during retries", f"completeBy reached during retries: {e.reason}",
                                      fault=e.reason) from None
            raise RetriesExhausted(e.reason) from None

    def _post_once(self) -> RemoteAnswer:
        left = self.time_left()
        if left < self.policy.min_call_seconds:
            raise DeadlineReached("before the next call", "completeBy reached before the next call")
        if self.guard is not None:
            self.guard.before_call()  # raises BreakerWait: no call (not retried: not a TransientFault)
            left = self.time_left()  # it may have waited for the rate limit's slot
            if left < self.policy.min_call_seconds:
                raise DeadlineReached("before the next call", "completeBy reached before the next call")
        read_timeout = min(self.policy.max_call_timeout, left)
        connect_timeout = min(self.policy.connect_timeout, left)
        try:
            reply = self._exchange(urllib3.Timeout(connect=connect_timeout, read=read_timeout))
        except HTTPError as e:
            fault = _fault_of(e)
            # a read timeout shortened by completeBy is the deadline's doing, not the remote's
            self._record(fault, cut_by_deadline=fault == "timeout" and read_timeout < self.policy.max_call_timeout)
            cause = _unwrap(e)
            if fault == "timeout":
                raise TransientFault(f"timeout after {read_timeout:.2f}s: {type(cause).__name__}") from None
            if fault == "connection-error":
                raise TransientFault(f"connection error: {type(cause).__name__}") from None
            raise TransientFault(f"{type(cause).__name__}: {cause}") from None
        try:
            answer = _answer(reply, self.now())
        except TransientFault as fault:
            self._record(reply.status, final=not 200 <= reply.status < 300, retry_after=fault.retry_after)
            raise
        self._record(reply.status)
        return answer

    def _exchange(self, timeout: urllib3.Timeout) -> _Reply:
        """One POST, in its CLIENT span, and its whole answer. Raises urllib3's ``HTTPError``s: before the
        answer's headers as they come (see :func:`_fault_of`); while reading its body, a timeout as itself
        and anything else (a connection closed mid-response, a body shorter than its Content-Length) as
        :class:`_BrokenBody`. The body is read here rather than preloaded so the two can be told apart."""
        with telemetry.client_span("POST", self.url, self.headers) as call:
            response = self.pool.urlopen("POST", _path_of(self.url), body=self.body, headers=call.headers,
                                         retries=False, redirect=False, assert_same_host=False, timeout=timeout,
                                         preload_content=False)
            call.answered(response.status)
            try:
                data = response.read()
            except Urllib3Timeout:
                raise
            except HTTPError as e:
                raise _BrokenBody(e) from e
            finally:
                response.release_conn()
        return _Reply(response.status, response.headers, data)

    def _record(self, status: int | str, *, final: bool = True, cut_by_deadline: bool = False,
                retry_after: float | None = None) -> None:
        self.statuses.append(status)
        if self.guard is not None:
            self.guard.after_call(status, final=final, cut_by_deadline=cut_by_deadline, retry_after=retry_after)


class _BrokenBody(HTTPError):
    """The answer's body could not be read in full (its headers had come): a ``protocol-error``."""

    def __init__(self, cause: HTTPError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _unwrap(fault: HTTPError) -> BaseException:
    """The fault behind urllib3's wrappers (``MaxRetryError.reason``, a broken body's cause)."""
    if isinstance(fault, MaxRetryError) and fault.reason is not None:
        return fault.reason
    if isinstance(fault, _BrokenBody):
        return fault.cause
    return fault


def _fault_of(fault: HTTPError) -> str:
    """The transport fault a urllib3 error is, as the breaker and the statuses name it.

    ``timeout``: the connect or read timeout fired (a refused or unresolvable connection is a
    ``NewConnectionError``, itself a ``ConnectTimeoutError``: that is a ``connection-error``).
    ``connection-error``: no answer came (refused, reset or closed before the answer, TLS, proxy).
    ``protocol-error``: anything else (a body cut short, undecodable content, a malformed answer).
    """
    cause = _unwrap(fault)
    if isinstance(cause, NewConnectionError):
        return "connection-error"
    if isinstance(cause, (ConnectTimeoutError, Urllib3Timeout)):
        return "timeout"
    if isinstance(fault, _BrokenBody):
        return "protocol-error"
    if isinstance(cause, (ProtocolError, SSLError, ProxyError, OSError)):
        return "connection-error"
    return "protocol-error"


def _answer(reply: _Reply, now: datetime) -> RemoteAnswer:
    """The service's answer, or :class:`TransientFault` when it is not final."""
    try:
        payload = loads(reply.data) if reply.data else None
    except (ValueError, UnicodeDecodeError):
        payload = None
    code = reply.status
    if code in TRANSIENT_STATUSES or code >= 500:
        raise TransientFault(_reason(payload, reply), _retry_after(reply, now))
    if 200 <= code < 300:
        if not isinstance(payload, dict):
            # A 2xx without a JSON object (a proxy page, a truncated body): not the service's
            # answer. Retrying is safe: the same Idempotency-Key returns the stored result.
            raise TransientFault(f"HTTP {code} without a JSON object body")
        return RemoteAnswer(code, payload)
    # Any other status (a business 4xx: 400/404/409/422 ...; an unexpected 3xx) is final.
    return RemoteAnswer(code, _reason(payload, reply))


def _retry_after(reply: _Reply, now: datetime) -> float | None:
    """The ``Retry-After`` header in seconds (delta-seconds or an HTTP date), if any."""
    value = reply.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def _reason(payload: Any, reply: _Reply) -> str:
    """Why the service refused: its body's ``error`` field, else the status and a text excerpt."""
    if isinstance(payload, dict) and isinstance(payload.get("error"), str) and payload["error"]:
        return str(payload["error"])
    text = reply.data.decode("utf-8", "replace").strip()
    return f"HTTP {reply.status}" + (f": {text[:300]}" if text else "")


class _BoundedWait(tenacity.wait.wait_base):
    """Exponential backoff plus jitter, at least the server's Retry-After, capped by time left."""

    def __init__(self, policy: RetryPolicy, time_left: Callable[[], float]) -> None:
        self._exponential = tenacity.wait_exponential_jitter(
            multiplier=policy.initial_backoff, max=policy.max_backoff, jitter=policy.jitter)
        self._max = policy.max_backoff
        self._time_left = time_left

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        wait = self._exponential(retry_state)
        fault = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(fault, TransientFault) and fault.retry_after is not None:
            wait = max(wait, min(fault.retry_after, self._max))
        return max(0.0, min(wait, self._time_left()))


class _StopAtDeadline(tenacity.stop.stop_base):
    """Stop when the next attempt would start at or after completeBy (or after max_attempts)."""

    def __init__(self, policy: RetryPolicy, time_left: Callable[[], float]) -> None:
        self._policy = policy
        self._time_left = time_left
        self.stopped_by_deadline = False

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        if self._time_left() - retry_state.upcoming_sleep < self._policy.min_call_seconds:
            self.stopped_by_deadline = True
            return True
        return self._policy.max_attempts is not None and retry_state.attempt_number >= self._policy.max_attempts
