"""The messages between the roles, typed (docs/contracts.md, "Agent messages"), and what a
message to send is (:class:`OutMessage`, a :class:`Bus` to send it on).

* :class:`AgentRequest`: the Scheduler's request to an agent. The Scheduler builds it from typed
  values and sends ``to_body()``; the agent reads the same model back
  (``shared.agent.parsing.read_agent_request``, which adds the Service Bus envelope).
* :class:`ReplyMessage`: an agent's reply. :class:`ScheduleMessage` and :class:`ResumeMessage`:
  the Scheduler queue's notices (claim an order; re-dispatch a step that waited on a breaker).
* :class:`PoisonMessage`: a message that can never be processed.

By concern: ``fields`` (the field rules and shared types), ``requests`` (a step's request),
``scheduler`` (the Scheduler queue's notices and the replies), ``notices`` (status messages and
alerts) and ``sending`` (``OutMessage``, ``Bus``, ``PoisonMessage``). Import from this package.

Money: bodies are parsed with ``shared.core.jsonio.loads`` (every non-integer number a Decimal),
and ``order`` and ``context`` keep their Decimals; ``shared.core.jsonio.dumps`` writes them as strings.
"""

from shared.core.messages.fields import KINDS, MAX_FENCE_LENGTH, OPERATION_NAME, Body, Kind
from shared.core.messages.notices import AlertMessage, BreakerAlert, StatusMessage
from shared.core.messages.requests import AgentRequest, CompensationTarget, RequestRoute
from shared.core.messages.scheduler import ReplyMessage, ResumeMessage, ScheduleMessage
from shared.core.messages.sending import Bus, OutMessage, PoisonMessage

__all__ = [
    "AgentRequest", "AlertMessage", "Body", "BreakerAlert", "Bus", "CompensationTarget", "KINDS", "Kind",
    "MAX_FENCE_LENGTH", "OPERATION_NAME", "OutMessage", "PoisonMessage", "ReplyMessage", "RequestRoute",
    "ResumeMessage", "ScheduleMessage", "StatusMessage",
]
