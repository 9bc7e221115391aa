"""The agent runtime: one request -> one remote call (retried until completeBy) -> at most one reply.

* Past ``completeBy`` on arrival: send nothing, make no call (the Supervisor owns the step now).
* Otherwise call the remote (``shared.agent.remote``). Running out of time during retries, or
  getting the answer only after completeBy: send nothing.
* The remote's circuit breaker is open (``shared.agent.guard``): no call; a ``waiting`` reply
  (the breaker, when it is looked at again, and whether this step is the one woken then).
* The remote's rate limit (``shared.agent.limiter``) has no slot soon enough: the slot is
  reserved and the step waits for it the same way (a ``waiting`` reply that claims the wake-up
  at the slot); the request sent again then is named after the slot and calls in it.
* A 2xx -> a ``success`` reply with the result; a permanent rejection (any other 4xx:
  400/404/409/422 ...) -> an ``error`` reply with the reason from the body's ``error`` field.
  (409 ``compensated``: the step's key was tombstoned by its compensation; the late original
  call applied nothing.)

Each request is handled in a CONSUMER span, a child of the context the request carries (a new
trace if it had none); the remote calls (CLIENT spans, ``telemetry.client_span``) are its
children, and the reply carries its context. Logs are the app's structured JSON lines
(``shared.observability.logs.log_event``) carrying the order id and the span's ids.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

import tenacity
import urllib3

from shared.agent.gate import BreakerGate
from shared.agent.guard import BreakerWait, CallGuard
from shared.agent.limiter import RateGate
from shared.agent.parsing import ReceivedRequest, Workflows, as_registry, parse_request, step_of
from shared.agent.remote import DeadlineReached, RemoteAnswer, RemotePost, RetriesExhausted, RetryPolicy, pool_for
from shared.agent.replies import Outcome, build_reply, reply_message
from shared.core.breaker.waiting import WaitingStep
from shared.core.messages import Bus, ReplyMessage
from shared.core.ratelimit.bucket import reserved_slot
from shared.core.times import iso
from shared.observability import telemetry
from shared.observability.logs import log_event

Status = Literal["replied", "expired", "exhausted"]
RequestLog = Callable[..., None]  # (level, event, **fields): a log line about one request


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
    outcome: Outcome | None = None
    reply: ReplyMessage | None = None
    calls: int = 0
    detail: str = ""
    statuses: tuple[int | str, ...] = field(default_factory=tuple)  # per call: HTTP status or fault

    @property
    def replied(self) -> bool:
        return self.status == "replied"


class TransientFailure(RuntimeError):
    """Raised by the adapter for an ``exhausted`` result: abandon -> redelivery while time is left."""


def utcnow() -> datetime:
    return datetime.now(UTC)


class AgentRuntime:
    """Handles requests for one agent against its remote service. Thread-safe; one per worker.

    ``bus`` is the app's ``shared.core.messages.Bus`` (anything with ``send(OutMessage)``).
    """

    def __init__(
        self,
        agent: str,
        base_url: str,
        bus: Bus,
        *,
        pool: urllib3.HTTPConnectionPool | None = None,
        policy: RetryPolicy | None = None,
        now: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
        workflow: Workflows = None,
        breaker: BreakerGate | None = None,
        rate: RateGate | None = None,
    ) -> None:
        self.rate = rate  # the remote's rate limit, shared by every instance (None: none)
        self.breaker = breaker  # the remote's circuit breaker, shared by every instance (None: none)
        self.agent = agent
        self.workflow = as_registry(workflow)  # every workflow a request may name (its route, its policy)
        self.base_url = base_url.rstrip("/")
        self.bus = bus
        self.pool = pool or pool_for(self.base_url)
        self.policy = policy or RetryPolicy()
        self._now = now
        self._sleep = sleep

    def handle_message(self, body: bytes | str, *, message_id: str | None, reply_to: str | None,
                       application_properties: Mapping[Any, Any] | None = None) -> AgentResult:
        """Parse (raises ``PoisonMessage``) and handle one request message."""
        request = parse_request(body, message_id=message_id, reply_to=reply_to,
                                application_properties=application_properties, agent=self.agent,
                                workflow=self.workflow)
        return self.handle(request)

    def handle(self, request: ReceivedRequest) -> AgentResult:
        """Call the remote for ``request`` and reply, unless completeBy comes first: in a CONSUMER span."""
        attributes = {"messaging.message.id": request.envelope.message_id, "orders.order_id": request.order_id,
                      "orders.step": request.step, "orders.kind": request.kind, "orders.attempt": request.attempt}
        with telemetry.consumer_span(f"process {self.agent}", request.envelope.traceparent,
                                     request.envelope.tracestate, **attributes) as span:
            result = self._handle(request)
            span.set_attribute("orders.agent.status", result.status)
            return result

    def _handle(self, request: ReceivedRequest) -> AgentResult:
        note = self._request_log(request)
        left = self._time_left(request)
        if left <= 0:
            note(logging.WARNING, "agent.expired", when="on arrival", lateSeconds=round(-left, 3),
                 action="nothing sent, no call made")
            return AgentResult("expired", detail="past completeBy on arrival")

        guard = None
        if self.breaker is not None or self.rate is not None:
            guard = CallGuard(self.breaker, WaitingStep(request.order_id, request.attempt, request.step, request.kind),
                              rate=self.rate, sleep=self._sleep, time_left=lambda: self._time_left(request),
                              reserved=reserved_slot(request.envelope.message_id) if self.rate else None)
        post = RemotePost.for_request(request, self.base_url, self.pool, self.policy_for(request),
                                      lambda: self._time_left(request), self._now, guard)
        try:
            answer = post.run(self._sleep, on_retry=lambda state: _note_retry(note, state))
        except BreakerWait as wait:
            return self._reply_waiting(request, wait, tuple(post.statuses), note)
        except DeadlineReached as e:
            faults = {"fault": e.fault} if e.fault is not None else {}
            note(logging.WARNING, "agent.expired", when=e.when, calls=len(post.statuses), **faults,
                 action="nothing sent")
            return AgentResult("expired", calls=len(post.statuses), detail=e.detail, statuses=tuple(post.statuses))
        except RetriesExhausted as e:
            note(logging.ERROR, "agent.exhausted", calls=len(post.statuses), fault=e.reason,
                 action="left to redelivery")
            return AgentResult("exhausted", calls=len(post.statuses), detail=e.reason, statuses=tuple(post.statuses))

        if self._time_left(request) <= 0:
            note(logging.WARNING, "agent.expired", when="response after completeBy", calls=len(post.statuses),
                 status=answer.status, action="nothing sent")
            return AgentResult("expired", calls=len(post.statuses), detail="response after completeBy",
                               statuses=tuple(post.statuses))
        return self._reply(request, answer, tuple(post.statuses), note)

    def _reply(self, request: ReceivedRequest, answer: RemoteAnswer,
               statuses: tuple[int | str, ...], note: RequestLog) -> AgentResult:
        """Send the reply the service's final answer calls for."""
        if answer.succeeded:
            reply = build_reply(request, "success", answer.payload, None)
        else:
            reply = build_reply(request, "error", None, answer.payload)
        telemetry.send(self.bus, reply_message(request, reply))
        note(logging.INFO if reply.outcome == "success" else logging.WARNING, "agent.replied",
             outcome=reply.outcome, reason=reply.reason, calls=len(statuses), status=answer.status)
        return AgentResult("replied", outcome=reply.outcome, reply=reply, calls=len(statuses), statuses=statuses)

    def _reply_waiting(self, request: ReceivedRequest, wait: BreakerWait, statuses: tuple[int | str, ...],
                       note: RequestLog) -> AgentResult:
        """The remote's breaker is open: tell the scheduler the step waits (not a failure)."""
        reply = build_reply(request, "waiting", None, wait.verdict, breaker=wait.remote, until=wait.until,
                            wake=wait.wake, opening=wait.opening or None)
        telemetry.send(self.bus, reply_message(request, reply))
        note(logging.WARNING, "agent.waiting", breaker=wait.remote, until=iso(wait.until), wake=wait.wake,
             reason=wait.verdict, calls=len(statuses))
        return AgentResult("replied", outcome="waiting", reply=reply, calls=len(statuses), statuses=statuses)

    def policy_for(self, request: ReceivedRequest) -> RetryPolicy:
        """The agent's policy, with the request's step's own ``retry`` (tries, first backoff) over it."""
        step = step_of(self.workflow, request.workflow, request.workflow_version, request.step)
        if step is None:
            return self.policy
        own = step.retry
        policy = self.policy
        if own.agent_attempts is not None:
            policy = replace(policy, max_attempts=own.agent_attempts)
        if own.agent_backoff_seconds is not None:
            policy = replace(policy, initial_backoff=own.agent_backoff_seconds)
        return policy

    def _time_left(self, request: ReceivedRequest) -> float:
        return (request.complete_by - self._now()).total_seconds()

    def _request_log(self, request: ReceivedRequest) -> RequestLog:
        def note(level: int, event: str, **fields: Any) -> None:
            log_event(level, event, order_id=request.order_id, agent=self.agent,
                      kind=request.kind, step=request.step, operation=request.operation,
                      attempt=request.attempt, messageId=request.envelope.message_id, **fields)

        return note


def _note_retry(note: RequestLog, state: tenacity.RetryCallState) -> None:
    note(logging.INFO, "agent.retry", call=state.attempt_number, waitSeconds=round(state.upcoming_sleep, 3),
         fault=str(state.outcome.exception()) if state.outcome else None)
