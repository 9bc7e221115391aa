"""The agent's reply to a request (docs/contracts.md, "Agent messages": Reply).

Sent to the request's ``reply_to`` with message_id ``reply:<request message_id>`` (the replies
queue has duplicate detection, so a redelivered request's second reply is dropped),
correlation_id = the request's message_id; its ``traceparent`` is the context of the span that
sends it (``shared.observability.telemetry.send``), in the agent's consumer span.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from shared.agent.parsing import ReceivedRequest
from shared.core.messages import OutMessage, ReplyMessage

Outcome = Literal["success", "error", "waiting"]


def reply_message_id(request_message_id: str) -> str:
    return f"reply:{request_message_id}"


def build_reply(request: ReceivedRequest, outcome: Outcome, result: dict[str, Any] | None, reason: str | None,
                *, breaker: str | None = None, until: datetime | None = None, wake: bool = False,
                opening: int | None = None) -> ReplyMessage:
    """The reply: the request's coordinates, the outcome, and its result or reason; the request's
    fencing token, unchanged, when it had one (``shared.core.fence``). Built as sent, without
    validation: the Scheduler validates what it receives."""
    return ReplyMessage.model_construct(kind=request.kind, orderId=request.order_id, step=request.step,
                                        attempt=request.attempt, outcome=outcome, result=result, reason=reason,
                                        breaker=breaker, until=until, wake=wake, opening=opening,
                                        fence=request.fence)


def reply_message(request: ReceivedRequest, reply: ReplyMessage) -> OutMessage:
    """``reply`` addressed to the request's reply queue (the sender adds the trace context)."""
    return OutMessage(
        queue=request.envelope.reply_to,
        body=reply.to_body(),
        message_id=reply_message_id(request.envelope.message_id),
        correlation_id=request.envelope.message_id,
    )
