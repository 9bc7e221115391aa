"""The agent runtime: one request from the scheduler -> one remote HTTP call -> at most one reply.

Pure of the Functions runtime (functions/agents.py is the thin adapter). Given a request
message (docs/contracts.md, "Agent messages") and the agent's remote service base URL:

* Past ``completeBy`` on arrival: send nothing, make no call (the Supervisor owns the step now).
* Otherwise ``POST {base}/{operation}`` with ``Idempotency-Key`` and ``traceparent`` headers and
  the body ``{"orderId", "order", "context"}``, plus ``compensates`` for a compensation (the
  original step and its idempotency key: the remote finds the effect to undo by that key).
  The agent's ``traceparent`` is a child of the request's (same trace id, the agent's own span
  id; a new trace if the request had none), the same on every attempt and on the reply, as for
  every message the app sends (shared/logs.py).
* Transient faults (connect errors, timeouts, 408/425/429, 5xx, a 2xx whose body is not a JSON
  object) are retried by tenacity with exponential backoff plus jitter (honouring ``Retry-After``),
  never past ``completeBy``; each call's timeout is bounded by the time left and by a per-call
  maximum. Running out of time during retries: send nothing. The idempotency key is the same on
  every attempt (and on every redelivery), so a lost response is answered from the service's
  stored result and the effect happens once.
* A permanent rejection (any other 4xx: 400/404/409/422 ...) -> an ``error`` reply with the
  reason taken from the body's ``error`` field. (409 ``compensated``: the step's key was
  tombstoned by its compensation; the late original call applied nothing.) A 2xx -> a ``success`` reply with the result.
* Compensation requests (kind ``compensation``, operations ``release``/``refund``) take the
  same path, with their own idempotency key (``ORDERID:STEP:compensate``).

A reply is sent to the request's ``reply_to`` with message_id ``reply:<request message_id>``
(the replies queue has duplicate detection, so a redelivered request's second reply is dropped),
correlation_id = the request's message_id, and the ``traceparent`` application property. Replies
go out through the app's ``shared.messaging.Bus`` (``ServiceBusBus`` in the worker, ``MemoryBus``
in tests) as an ``OutMessage``.

Money: JSON is parsed with ``parse_float=Decimal`` (never floats; ``shared.models.loads``) and
Decimals are written back as JSON strings, the contract's money form (``"total": "19.98"``).
Logs are the app's structured JSON lines (``shared.logs.log_event``) carrying the order id.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import requests
import tenacity
from requests.adapters import HTTPAdapter

from shared import models
from shared.logs import child_traceparent, log_event, parse_traceparent
from shared.messaging import Bus, OutMessage, PoisonMessage  # noqa: F401 - re-exported for the adapter
from shared.workflow import WORKFLOW, Step

Kind = Literal["step", "compensation"]
KINDS: tuple[str, ...] = ("step", "compensation")
_OPERATION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


# --------------------------------------------------------------------------- JSON (Decimal-safe)

def loads(data: bytes | str) -> Any:
    """Strict JSON with every non-integer number a Decimal (the app's ``shared.models.loads``)."""
    return models.loads(data)


def dumps(value: Any) -> bytes:
    """JSON with Decimals as strings (the app's ``shared.models.dumps``), UTF-8."""
    return models.dumps(value).encode("utf-8")


# --------------------------------------------------------------------------- request parsing



@dataclass(frozen=True)
class AgentRequest:
    kind: Kind
    order_id: str
    step: str
    operation: str
    attempt: int
    idempotency_key: str
    complete_by: datetime  # timezone-aware
    order: dict[str, Any]
    context: dict[str, Any]
    # Envelope (Service Bus message properties)
    message_id: str
    reply_to: str
    traceparent: str | None = None
    tracestate: str | None = None
    # A compensation's target: {"step": ..., "idempotencyKey": "ORDERID:STEP"} (None for a step)
    compensates: dict[str, Any] | None = None



def _str_field(obj: Mapping[str, Any], name: str, errors: list[str]) -> str:
    v = obj.get(name)
    if not isinstance(v, str) or not v.strip():
        errors.append(f"{name}: a non-empty string is required")
        return ""
    return v


def _prop(props: Mapping[Any, Any] | None, name: str) -> str | None:
    if not props:
        return None
    for k, v in props.items():
        key = k.decode() if isinstance(k, bytes) else k
        if key == name:
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            return str(v) if v is not None else None
    return None


def parse_request(
    body: bytes | str,
    *,
    message_id: str | None,
    reply_to: str | None,
    application_properties: Mapping[Any, Any] | None = None,
    agent: str | None = None,
    workflow: Sequence[Step] = WORKFLOW,
) -> AgentRequest:
    """Parse and validate a request message. Raises :class:`PoisonMessage` naming every problem.

    With ``agent`` given, the step and operation must be ones ``workflow`` routes to that agent
    (a request on the wrong queue is poison: it must never reach another service's endpoint).
    """
    try:
        obj = loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise PoisonMessage(f"body is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise PoisonMessage("body is not a JSON object")
    errors: list[str] = []
    kind = obj.get("kind")
    if kind not in KINDS:
        errors.append(f"kind: must be one of {list(KINDS)}")
    order_id = _str_field(obj, "orderId", errors)
    step = _str_field(obj, "step", errors)
    operation = _str_field(obj, "operation", errors)
    if operation and not _OPERATION_RE.fullmatch(operation):
        errors.append("operation: not a valid operation name")
    key = _str_field(obj, "idempotencyKey", errors)
    attempt = obj.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        errors.append("attempt: an integer >= 1 is required")
    complete_by: datetime | None = None
    raw_cb = obj.get("completeBy")
    if not isinstance(raw_cb, str):
        errors.append("completeBy: an ISO-8601 timestamp with a UTC offset is required")
    else:
        try:
            complete_by = datetime.fromisoformat(raw_cb.replace("Z", "+00:00"))
        except ValueError:
            errors.append("completeBy: not an ISO-8601 timestamp")
        else:
            if complete_by.tzinfo is None or complete_by.utcoffset() is None:
                errors.append("completeBy: a UTC offset is required")
    order = obj.get("order")
    if not isinstance(order, dict):
        errors.append("order: a JSON object is required")
    context = obj.get("context", {})
    if context is None:
        context = {}
    if not isinstance(context, dict):
        errors.append("context: a JSON object is required")
    compensates = obj.get("compensates")
    if compensates is not None:
        if kind != "compensation":
            errors.append("compensates: only a compensation request has one")
        elif not isinstance(compensates, dict):
            errors.append("compensates: a JSON object is required")
        else:
            target = compensates.get("idempotencyKey")
            if not isinstance(target, str) or not target.strip():
                errors.append("compensates.idempotencyKey: a non-empty string is required")
            if not isinstance(compensates.get("step"), str) or (step and compensates.get("step") != step):
                errors.append("compensates.step: must name the request's step")
    if not message_id:
        errors.append("message_id: missing")
    if not reply_to:
        errors.append("reply_to: missing (nowhere to reply)")
    if agent is not None and step and operation and kind in KINDS:
        wf = next((s for s in workflow if s.name == step), None)
        if wf is None:
            errors.append(f"step: {step!r} is not a workflow step")
        elif wf.agent != agent:
            errors.append(f"step: {step!r} is served by agent {wf.agent!r}, not {agent!r}")
        else:
            expected = wf.operation if kind == "step" else wf.compensation
            if operation != expected:
                errors.append(f"operation: {kind} {step!r} expects {expected!r}, got {operation!r}")
    if errors:
        raise PoisonMessage("; ".join(errors))
    assert complete_by is not None and isinstance(attempt, int)
    return AgentRequest(
        kind=kind,  # type: ignore[arg-type]
        order_id=order_id,
        step=step,
        operation=operation,
        attempt=attempt,
        idempotency_key=key,
        complete_by=complete_by,
        order=order,  # type: ignore[arg-type]
        context=context,
        message_id=str(message_id),
        reply_to=str(reply_to),
        traceparent=parse_traceparent(_prop(application_properties, "traceparent")),
        tracestate=_prop(application_properties, "tracestate"),
        compensates=compensates,  # type: ignore[arg-type]
    )


# --------------------------------------------------------------------------- replies

def reply_message_id(request_message_id: str) -> str:
    return f"reply:{request_message_id}"


def build_reply(request: AgentRequest, outcome: Literal["success", "error"],
                result: dict[str, Any] | None, reason: str | None) -> dict[str, Any]:
    return {
        "kind": request.kind,
        "orderId": request.order_id,
        "step": request.step,
        "attempt": request.attempt,
        "outcome": outcome,
        "result": result,
        "reason": reason,
    }


# --------------------------------------------------------------------------- HTTP sessions

_sessions: dict[str, requests.Session] = {}
_sessions_lock = threading.Lock()


def session_for(base_url: str, pool_size: int = 32) -> requests.Session:
    """One ``requests.Session`` per worker per service, shared by the worker's threads.

    urllib3's connection pool is thread-safe; the session holds no per-request state we use
    (no cookies/auth). ``trust_env`` is off: no per-request scan of proxy environment variables
    or .netrc. Adapter-level retries are off: tenacity does the retrying, bounded by completeBy.
    """
    with _sessions_lock:
        s = _sessions.get(base_url)
        if s is None:
            s = requests.Session()
            s.trust_env = False
            adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0)
            s.mount("http://", adapter)
            s.mount("https://", adapter)
            _sessions[base_url] = s
        return s


# --------------------------------------------------------------------------- the runtime

@dataclass(frozen=True)
class RetryPolicy:
    initial_backoff: float = 0.2  # first wait, seconds; doubles per attempt
    max_backoff: float = 5.0
    jitter: float = 0.2  # uniform random seconds added to each wait
    max_call_timeout: float = 10.0  # upper bound of one call's (read) timeout
    connect_timeout: float = 3.0
    min_call_seconds: float = 0.05  # do not start a call with less time left than this
    max_attempts: int | None = None  # None: keep retrying until completeBy


Status = Literal["replied", "expired", "exhausted"]


@dataclass(frozen=True)
class AgentResult:
    """What the runtime did with one request.

    * ``replied``: a reply was sent (``outcome`` success or error, ``reply`` its body).
    * ``expired``: completeBy passed (on arrival, during retries, or before the response was in
      hand); nothing was sent. ``calls`` is 0 when it had already expired on arrival.
    * ``exhausted``: ``max_attempts`` transient failures while time was still left; nothing was
      sent. The adapter raises so Service Bus redelivers the request (its TTL ends at completeBy).
    """

    status: Status
    outcome: Literal["success", "error"] | None = None
    reply: dict[str, Any] | None = None
    calls: int = 0
    detail: str = ""
    statuses: tuple[int | str, ...] = field(default_factory=tuple)  # per call: HTTP status or fault

    @property
    def replied(self) -> bool:
        return self.status == "replied"


class TransientFailure(RuntimeError):
    """Raised by the adapter for an ``exhausted`` result: abandon -> redelivery while time is left."""


class _Transient(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


@dataclass(frozen=True)
class _Response:
    status: int
    payload: Any


TRANSIENT_STATUSES = frozenset({408, 425, 429})


def _retry_after(resp: requests.Response, now: datetime) -> float | None:
    value = resp.headers.get("Retry-After")
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


def _reason(payload: Any, resp: requests.Response) -> str:
    if isinstance(payload, dict) and isinstance(payload.get("error"), str) and payload["error"]:
        return str(payload["error"])
    text = (resp.text or "").strip()
    return f"HTTP {resp.status_code}" + (f": {text[:300]}" if text else "")


def utcnow() -> datetime:
    return datetime.now(UTC)


class AgentRuntime:
    """Handles requests for one agent against its remote service. Thread-safe; one per worker.

    ``bus`` is the app's ``shared.messaging.Bus`` (anything with ``send(OutMessage)``).
    """

    def __init__(
        self,
        agent: str,
        base_url: str,
        bus: Bus,
        *,
        session: requests.Session | None = None,
        policy: RetryPolicy | None = None,
        now: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
        workflow: Sequence[Step] = WORKFLOW,
    ) -> None:
        self.agent = agent
        self.workflow = workflow
        self.base_url = base_url.rstrip("/")
        self.bus = bus
        self.session = session or session_for(self.base_url)
        self.policy = policy or RetryPolicy()
        self._now = now
        self._sleep = sleep

    # -- entry points

    def handle_message(self, body: bytes | str, *, message_id: str | None, reply_to: str | None,
                       application_properties: Mapping[Any, Any] | None = None) -> AgentResult:
        """Parse (raises :class:`PoisonMessage`) and handle one request message."""
        request = parse_request(body, message_id=message_id, reply_to=reply_to,
                                application_properties=application_properties, agent=self.agent,
                                workflow=self.workflow)
        return self.handle(request)

    def handle(self, request: AgentRequest) -> AgentResult:
        span = child_traceparent(request.traceparent)  # the agent's span: HTTP calls and the reply

        def note(level: int, event: str, **fields: Any) -> None:
            log_event(level, event, order_id=request.order_id, traceparent=span, agent=self.agent,
                      kind=request.kind, step=request.step, operation=request.operation,
                      attempt=request.attempt, messageId=request.message_id, **fields)

        left = self._left(request)
        if left <= 0:
            note(logging.WARNING, "agent.expired", when="on arrival", lateSeconds=round(-left, 3),
                 action="nothing sent, no call made")
            return AgentResult("expired", detail="past completeBy on arrival")

        statuses: list[int | str] = []
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Transient),
            wait=_BoundedWait(self.policy, lambda: self._left(request)),
            stop=_StopAtDeadline(self.policy, lambda: self._left(request)),
            sleep=self._sleep,
            before_sleep=lambda rs: note(
                logging.INFO, "agent.retry", call=rs.attempt_number, waitSeconds=round(rs.upcoming_sleep, 3),
                fault=str(rs.outcome.exception()) if rs.outcome else None),
            reraise=True,
        )
        try:
            response = retrying(self._call, request, span, statuses)
        except _Transient as e:
            calls = len(statuses)
            if self._left(request) - self.policy.min_call_seconds <= 0 or self._deadline_stop(retrying):
                note(logging.WARNING, "agent.expired", when="during retries", calls=calls, fault=e.reason,
                     action="nothing sent")
                return AgentResult("expired", calls=calls, detail=f"completeBy reached during retries: {e.reason}",
                                   statuses=tuple(statuses))
            note(logging.ERROR, "agent.exhausted", calls=calls, fault=e.reason, action="left to redelivery")
            return AgentResult("exhausted", calls=calls, detail=e.reason, statuses=tuple(statuses))
        except _Expired as e:
            calls = len(statuses)
            note(logging.WARNING, "agent.expired", when="before the next call", calls=calls, action="nothing sent")
            return AgentResult("expired", calls=calls, detail=str(e), statuses=tuple(statuses))

        if self._left(request) <= 0:
            note(logging.WARNING, "agent.expired", when="response after completeBy", calls=len(statuses),
                 status=response.status, action="nothing sent")
            return AgentResult("expired", calls=len(statuses), detail="response after completeBy",
                               statuses=tuple(statuses))

        if 200 <= response.status < 300:
            reply = build_reply(request, "success", response.payload, None)
        else:
            reply = build_reply(request, "error", None, response.payload)
        self._send_reply(request, span, reply)
        note(logging.INFO if reply["outcome"] == "success" else logging.WARNING, "agent.replied",
             outcome=reply["outcome"], reason=reply["reason"], calls=len(statuses), status=response.status)
        return AgentResult("replied", outcome=reply["outcome"], reply=reply, calls=len(statuses),
                           statuses=tuple(statuses))

    # -- internals

    def _left(self, request: AgentRequest) -> float:
        return (request.complete_by - self._now()).total_seconds()

    @staticmethod
    def _deadline_stop(retrying: tenacity.Retrying) -> bool:
        stop = retrying.stop
        return isinstance(stop, _StopAtDeadline) and stop.stopped_by_deadline

    def _call(self, request: AgentRequest, span: str, statuses: list[int | str]) -> _Response:
        left = self._left(request)
        if left < self.policy.min_call_seconds:
            raise _Expired("completeBy reached before the next call")
        read_timeout = min(self.policy.max_call_timeout, left)
        connect_timeout = min(self.policy.connect_timeout, left)
        headers = {
            "Idempotency-Key": request.idempotency_key,
            "Content-Type": "application/json",
            "Accept": "application/json",
            "traceparent": span,
        }
        if request.tracestate:
            headers["tracestate"] = request.tracestate
        call_body: dict[str, Any] = {"orderId": request.order_id, "order": request.order,
                                     "context": request.context}
        if request.compensates is not None:
            call_body["compensates"] = request.compensates
        body = dumps(call_body)
        url = f"{self.base_url}/{request.operation}"
        try:
            resp = self.session.post(url, data=body, headers=headers, timeout=(connect_timeout, read_timeout),
                                     allow_redirects=False)
        except requests.Timeout as e:
            statuses.append("timeout")
            raise _Transient(f"timeout after {read_timeout:.2f}s: {type(e).__name__}") from None
        except requests.ConnectionError as e:
            statuses.append("connection-error")
            raise _Transient(f"connection error: {type(e).__name__}") from None
        except requests.RequestException as e:  # ChunkedEncodingError, ContentDecodingError ...
            statuses.append("protocol-error")
            raise _Transient(f"{type(e).__name__}: {e}") from None
        statuses.append(resp.status_code)
        try:
            payload = loads(resp.content) if resp.content else None
        except (ValueError, UnicodeDecodeError):
            payload = None
        code = resp.status_code
        if code in TRANSIENT_STATUSES or code >= 500:
            raise _Transient(_reason(payload, resp), _retry_after(resp, self._now()))
        if 200 <= code < 300:
            if not isinstance(payload, dict):
                # A 2xx without a JSON object (a proxy page, a truncated body): not the service's
                # answer. Retrying is safe: the same Idempotency-Key returns the stored result.
                raise _Transient(f"HTTP {code} without a JSON object body")
            return _Response(code, payload)
        # Any other status (a business 4xx: 400/404/409/422 ...; an unexpected 3xx) is final.
        return _Response(code, _reason(payload, resp))

    def _send_reply(self, request: AgentRequest, span: str, reply: dict[str, Any]) -> None:
        props = {"traceparent": span}
        if request.tracestate:
            props["tracestate"] = request.tracestate
        self.bus.send(OutMessage(
            queue=request.reply_to,
            body=reply,
            message_id=reply_message_id(request.message_id),
            correlation_id=request.message_id,
            application_properties=props,
        ))


class _Expired(Exception):
    pass


class _BoundedWait(tenacity.wait.wait_base):
    """Exponential backoff plus jitter, at least the server's Retry-After, capped by time left."""

    def __init__(self, policy: RetryPolicy, left: Callable[[], float]) -> None:
        self._exp = tenacity.wait_exponential_jitter(
            multiplier=policy.initial_backoff, max=policy.max_backoff, jitter=policy.jitter)
        self._max = policy.max_backoff
        self._left = left

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        wait = self._exp(retry_state)
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, _Transient) and exc.retry_after is not None:
            wait = max(wait, min(exc.retry_after, self._max))
        return max(0.0, min(wait, self._left()))


class _StopAtDeadline(tenacity.stop.stop_base):
    """Stop when the next attempt would start at or after completeBy (or after max_attempts)."""

    def __init__(self, policy: RetryPolicy, left: Callable[[], float]) -> None:
        self._policy = policy
        self._left = left
        self.stopped_by_deadline = False

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        if self._left() - retry_state.upcoming_sleep < self._policy.min_call_seconds:
            self.stopped_by_deadline = True
            return True
        return self._policy.max_attempts is not None and retry_state.attempt_number >= self._policy.max_attempts
