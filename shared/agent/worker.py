"""An agent in a Functions worker: one ``AgentRuntime`` per agent (``runtime_for``), and one
request message handled with the trigger's settlement rules (``handle_message``).

Settlement (the host completes on return and abandons on an exception; ``functions.settlement.settle``
dead-letters a ``PoisonMessage``):

* **Poison messages** never reach the remote service. They are logged at ERROR with the reason
  code, the message id and a body excerpt, and raised as ``PoisonMessage(description, reason)``;
  the trigger dead-letters them at their first delivery with that reason and description
  (docs/reliability.md, "Poison messages"):

  - ``InvalidJson``: the body is not JSON; ``SchemaViolation``: not a request (a field missing or
    wrong, no reply_to); ``UnknownStep``: a step/operation this agent does not serve;
  - ``UnknownOrder``: the order does not exist; ``StepNotInFlight``: the order is finished, or this
    step's (or compensation's) attempt is not the one it has in flight (``check_in_flight``: the
    order's rows as they are now, ``shared.storage.views.current_view``, and the pure core's rule
    ``shared.core.statemachine.request_not_in_flight``). A copy of a request that arrives after its
    order moved on is such a message: at-least-once delivery makes it normal, and dead-lettering it
    is safe (the order no longer waits on it); the dead-letter queue shows how often it happens.

  The order does not wait on a poison request: the Supervisor times the step out and redrives or
  alerts on it.
* **An open circuit breaker** (the remote's, shared by every instance: ``shared.agent.guard``):
  no call; the runtime replies ``waiting`` and the message completes. The step is re-dispatched
  when the breaker closes.
* **A rate-limited remote** (``shared.agent.limiter``): a call whose slot is more than a second
  away is not made; its slot is reserved, the runtime replies ``waiting`` and the message completes.
  The step is sent again at its slot.
* **Transient failures** are retried inside the invocation until completeBy (tenacity, in the
  runtime); running out of time means the step is the Supervisor's and nothing is sent. If the
  runtime gives up while time is still left (``exhausted``: an attempt cap) or the reply cannot
  be sent (or the order's rows cannot be read), it raises: the message is abandoned and
  redelivered while its TTL (which ends at completeBy) lasts. That is safe, because the remote
  call is idempotent on the request's Idempotency-Key and the reply's message_id is deterministic
  (the replies queue's duplicate detection drops a second copy); each redelivery re-checks
  completeBy on arrival.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from shared.agent.board import BreakerBoard
from shared.agent.guard import breaker_for
from shared.agent.limiter import RateGate
from shared.agent.parsing import ReceivedRequest, parse_request
from shared.agent.runtime import AgentResult, AgentRuntime, TransientFailure
from shared.core.messages import PoisonMessage
from shared.core.statemachine import bound, request_not_in_flight
from shared.core.workflows import UnknownWorkflow
from shared.core.workflows.catalog import Agent
from shared.messaging import ServiceBusBus
from shared.observability.logs import log_event
from shared.observability.telemetry import valid_traceparent
from shared.runtime import Runtime, get_runtime
from shared.runtime.clients import get_clients
from shared.settings import instance_id, remote_rate_limits
from shared.storage.views import current_view

_lock = threading.Lock()
_runtimes: dict[str, AgentRuntime] = {}
_board: BreakerBoard | None = None  # the worker's gates' breakers, refreshed by one query (with the first gate)


def runtime_for(agent: Agent) -> AgentRuntime:
    """The worker's runtime for ``agent``: created on first use, then reused by every thread."""
    global _board
    rt = _runtimes.get(agent.name)
    if rt is not None:
        return rt
    with _lock:
        rt = _runtimes.get(agent.name)
        if rt is None:
            clients = get_clients()  # the worker's one ServiceBusClient and per-queue senders
            bus = ServiceBusBus(clients.sender)
            # the remote's circuit breaker: its row in the state table, shared by every instance;
            # this worker's gates are refreshed together (one query of every breaker per BreakerCacheSeconds)
            store = get_runtime().store
            if _board is None:
                _board = BreakerBoard(store)
            gate = breaker_for(agent.name, store, bus, clients.settings, instance_id(), board=_board)
            # the remote's rate limit (declared in workflows/agents.json, RemoteRateLimits over it): a row
            # in the state table, shared by every instance; none by default (no table request per call)
            limit = remote_rate_limits(clients.settings.values).get(agent.name)
            rate = RateGate(store, agent.name, limit) if limit is not None else None
            rt = AgentRuntime(agent.name, clients.settings[agent.service_url_setting], bus, breaker=gate, rate=rate)
            _runtimes[agent.name] = rt
        return rt


def handle_message(agent: Agent, body: bytes, *, message_id: str | None, reply_to: str | None,
                   application_properties: Mapping[Any, Any] | None, delivery_count: int | None = None,
                   runtime: AgentRuntime | None = None, orders: Runtime | None = None) -> AgentResult:
    """Handle one request message (module docstring: settlement). ``runtime``: the worker's
    (``runtime_for``) unless one is given. ``orders``: where the order's rows are read for
    ``check_in_flight``: the worker's runtime when no ``runtime`` is given, else no check unless given."""
    try:
        request = parse_request(
            body,
            message_id=message_id,
            reply_to=reply_to,
            application_properties=application_properties,
            agent=agent.name,
            # Every loaded workflow: a request names its own (order v1 when it names none).
            workflow=runtime.workflow if runtime is not None else None,
        )
        if orders is not None or runtime is None:
            check_in_flight(orders, request)
    except PoisonMessage as e:
        props = application_properties or {}
        log_event(
            logging.ERROR, "agent.poison", order_id=_order_id(body),
            traceparent=valid_traceparent(props.get("traceparent")), agent=agent.name, messageId=message_id,
            reason=e.reason, description=str(e), deliveryCount=delivery_count,
            bodyStart=bytes(body[:200]).decode("utf-8", "replace"), action="dead-lettered",
        )
        raise
    rt = runtime or runtime_for(agent)
    result = rt.handle(request)
    if result.status == "exhausted":
        # Abandon: Service Bus redelivers while the message's TTL (<= completeBy) lasts.
        raise TransientFailure(f"agent {agent.name}: {result.detail} (order {request.order_id}, "
                               f"step {request.step}, attempt {request.attempt}); abandoning for redelivery")
    return result


def check_in_flight(orders: Runtime | None, request: ReceivedRequest) -> None:
    """Raise ``PoisonMessage`` (UnknownOrder, StepNotInFlight) unless the order has ``request``'s
    step (or compensation) attempt in flight, on the order's rows as they are now (in ``orders``'
    store, the worker's runtime's when None): the request's token's rows while the state row keeps
    their ETag (one point read), else a read of the partition. A failed read raises as is
    (transient: the message is abandoned and redelivered)."""
    orders = orders or get_runtime()
    view = current_view(orders.store, orders.keys, request.order_id, request.fence)
    if view.state is None:
        raise PoisonMessage(f"order {request.order_id} does not exist", "UnknownOrder")
    try:
        ctx = bound(view, orders.ctx())
    except UnknownWorkflow as exc:  # the order's workflow is not loaded here: nothing of it runs
        raise PoisonMessage(f"order {request.order_id}: {exc}", "StepNotInFlight") from None
    why = request_not_in_flight(view, request.kind, request.step, request.attempt, ctx)
    if why is not None:
        raise PoisonMessage(f"order {request.order_id}: {why}", "StepNotInFlight")


def _order_id(body: bytes) -> str | None:
    """Best effort: the order id of a poison message, for the log line (None if unreadable)."""
    try:
        value = json.loads(body).get("orderId")
    except Exception:  # noqa: BLE001 - it is poison; any failure just means no order id
        return None
    return value if isinstance(value, str) else None
