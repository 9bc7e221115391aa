"""The agent side: one request from the scheduler -> one remote HTTP call -> at most one reply.

Pure of the Functions runtime (functions/agents.py is the thin adapter). The request message
is ``shared.core.messages.AgentRequest`` (docs/contracts.md, "Agent messages").

* ``parsing``: reading a request off this agent's queue (poison -> ``PoisonMessage``).
* ``remote``: the call to the agent's remote service and its retry policy (tenacity).
* ``replies``: the reply message.
* ``runtime``: ``AgentRuntime``, which ties them together.
* ``worker``: the runtime per agent of a Functions worker, and one message handled with the
  trigger's settlement rules.
* ``guard``, ``gate``, ``board``, ``cache``: the remote's circuit breaker as the agent sees it
  (its shared row in the state table, read through one cache per worker).

Compensation requests (kind ``compensation``, operations ``release``/``refund``) take the same
path, with their own idempotency key (``ORDERID:STEP:compensate``). Replies go out through the
app's ``shared.core.messages.Bus`` (``ServiceBusBus`` in the worker, ``MemoryBus`` in tests).
Money: JSON is parsed with ``parse_float=Decimal`` (never floats) and Decimals are written back
as JSON strings, the contract's money form (``"total": "19.98"``).
"""

from shared.agent.parsing import Envelope, ReceivedRequest, parse_request, route_problems
from shared.agent.remote import TRANSIENT_STATUSES, RemoteAnswer, RetryPolicy, dumps, loads, pool_for
from shared.agent.replies import build_reply, reply_message_id
from shared.agent.runtime import AgentResult, AgentRuntime, Status, TransientFailure, utcnow
from shared.core.messages import KINDS, AgentRequest, Bus, CompensationTarget, Kind, OutMessage, PoisonMessage

__all__ = [
    "KINDS", "TRANSIENT_STATUSES", "AgentRequest", "AgentResult", "AgentRuntime", "Bus", "CompensationTarget",
    "Envelope", "Kind", "OutMessage", "PoisonMessage", "ReceivedRequest", "RemoteAnswer", "RetryPolicy", "Status",
    "TransientFailure", "build_reply", "dumps", "loads", "parse_request", "pool_for", "reply_message_id",
    "route_problems", "utcnow",
]
