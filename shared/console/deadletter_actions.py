"""Acting on one dead letter: ``POST /api/deadletters/{queue}/{sequenceNumber}/resubmit|discard``.

Service Bus settles a dead letter only through a lock, and its public API receives a dead letter
by sequence number only when it was deferred. So ``act_on_dead_letter``:

1. peeks the sequence number (one management request): not there, 404, nothing locked;
2. receives the dead-letter queue in peek-lock, oldest first, ``SCAN_BATCH`` at a time, up to
   ``MAX_SCAN`` messages, until it holds the one asked for;
3. resubmit: sends a copy to the queue, THEN completes the dead letter; discard: completes it;
4. abandons every other message it locked (their ``deliveryCount`` goes up by one; a dead letter
   is never dead-lettered again). A lock it could not give back expires (the queue's lock
   duration) and the message is there again: nothing is lost.

A dead letter another caller holds, or one past the first ``MAX_SCAN``, is answered 409.

The copy is the message again (body, application properties but the dead-letter reason and
description, content type, correlation id, subject, to, reply_to, session, partition key, time
to live) with the message id ``resubmit:<sequence number>:<original id>`` (at most 128
characters). A new id, because a queue's duplicate detection would drop a copy with the original
id inside its window (a poison message is dead-lettered within seconds), and the dead letter
would be completed with nothing sent. A deterministic one, because a process that dies between
the send and the completion leaves the dead letter there: resubmitted again, its second copy has
the same id and duplicate detection drops it inside the window; after it, the order is protected
by what makes any redelivery safe: the step's attempt and Idempotency-Key in the body, and the
Supervisor's conditional writes (a stale reply changes nothing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from shared.api.http import HttpResult, problem
from shared.console.deadletters import (
    MAX_SEQUENCE,
    PEEK_TIMEOUT_SECONDS,
    ServiceBusUnavailable,
    body_text,
    client_or_default,
    order_id_of,
    resolve_queue,
    text_of,
    whole_number,
)
from shared.observability.logs import log_event
from shared.runtime import Runtime

ACTIONS = ("resubmit", "discard")
SCAN_BATCH = 50  # dead letters asked for per receive
MAX_SCAN = 500  # dead letters locked at most while looking for one (all within one lock duration)
RECEIVE_WAIT_SECONDS = 2.0  # how long one receive waits for the first message
MAX_MESSAGE_ID = 128  # Service Bus's limit on a message id
DEAD_LETTER_PROPERTIES = frozenset({"DeadLetterReason", "DeadLetterErrorDescription"})

log = logging.getLogger(__name__)


class DeadLetterNotFound(LookupError):
    """No dead letter of that sequence number in the queue's dead-letter queue."""


class DeadLetterBusy(RuntimeError):
    """The dead letter is there but could not be locked: the reason is the message."""


class NotResubmittable(ValueError):
    """The dead letter cannot be sent again as it is (an AMQP value or sequence body)."""


@dataclass(frozen=True)
class Done:
    """What was done to one dead letter."""

    queue: str
    sequence_number: int
    action: str
    message_id: str | None
    order_id: str | None
    resubmitted_as: str | None  # the copy's message id (resubmit)


def resubmit_id(sequence_number: int, message_id: str | None) -> str:
    """The copy's message id: unique per dead letter (its sequence number), the same on a retry."""
    return f"resubmit:{sequence_number}:{message_id or ''}"[:MAX_MESSAGE_ID]


def copy_of(message: Any, message_id: str) -> Any:
    """A ``ServiceBusMessage`` that is ``message`` again, under ``message_id``."""
    from azure.servicebus import ServiceBusMessage
    from azure.servicebus.amqp import AmqpMessageBodyType

    if message.body_type != AmqpMessageBodyType.DATA:
        raise NotResubmittable(f"its body is an AMQP {message.body_type.value} body, not data: discard it")
    properties = {key: value for key, value in (message.application_properties or {}).items()
                  if text_of(key) not in DEAD_LETTER_PROPERTIES}
    session = message.session_id
    partition = message.partition_key if session is None or message.partition_key == session else None
    return ServiceBusMessage(b"".join(bytes(section) for section in message.body),
                             application_properties=properties or None, session_id=session, message_id=message_id,
                             time_to_live=message.time_to_live, content_type=message.content_type,
                             correlation_id=message.correlation_id, subject=message.subject,
                             partition_key=partition, to=message.to, reply_to=message.reply_to,
                             reply_to_session_id=message.reply_to_session_id)


def _settle(client: Any, receiver: Any, queue: str, message: Any, action: str) -> Done:
    from azure.core.exceptions import AzureError

    body = body_text(message)
    done = Done(queue, message.sequence_number, action, text_of(message.message_id),
                order_id_of(message.application_properties, body), None)
    if action == "resubmit":
        copy = copy_of(message, resubmit_id(message.sequence_number, done.message_id))
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(copy)
        done = replace(done, resubmitted_as=copy.message_id)
    try:
        receiver.complete_message(message)  # after the send: a crash between leaves the dead letter, never loses it
    except AzureError as exc:
        if done.resubmitted_as is None:
            raise
        raise ServiceBusUnavailable(f"the copy was sent as {done.resubmitted_as} but the dead letter was not removed "
                                    f"({type(exc).__name__}: {exc}): resubmit it again (the same id, which duplicate "
                                    "detection drops inside its window) or discard it") from exc
    return done


def _give_back(receiver: Any, held: list[Any]) -> None:
    from azure.core.exceptions import AzureError

    for message in held:
        try:
            receiver.abandon_message(message)
        except AzureError as exc:  # the lock expires instead: the message is there again after it
            log.warning("dead letter %s not given back: %s", message.sequence_number, exc)


def act_on_dead_letter(rt: Runtime, queue: str, sequence_number: int, action: str, *,
                       client: Any | None = None) -> Done:
    """Resubmit or discard the dead letter ``sequence_number`` of ``queue`` (see the module).
    Raises ``DeadLetterNotFound``, ``DeadLetterBusy``, ``NotResubmittable``, ``ServiceBusUnavailable``."""
    from azure.core.exceptions import AzureError
    from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue

    sb = client_or_default(rt, client)
    dead = ServiceBusSubQueue.DEAD_LETTER
    try:
        with sb.get_queue_receiver(queue, sub_queue=dead, receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                                   prefetch_count=0) as receiver:
            peeked = receiver.peek_messages(max_message_count=1, sequence_number=sequence_number,
                                            timeout=PEEK_TIMEOUT_SECONDS)
            if not peeked or peeked[0].sequence_number != sequence_number:
                raise DeadLetterNotFound(f"no dead letter {sequence_number} in {queue}")
            held: list[Any] = []
            try:
                while len(held) < MAX_SCAN:
                    batch = receiver.receive_messages(max_message_count=min(SCAN_BATCH, MAX_SCAN - len(held)),
                                                      max_wait_time=RECEIVE_WAIT_SECONDS)
                    if not batch:
                        break
                    match = next((m for m in batch if m.sequence_number == sequence_number), None)
                    held.extend(m for m in batch if m is not match)
                    if match is not None:
                        try:
                            return _settle(sb, receiver, queue, match, action)
                        except BaseException:
                            held.append(match)  # not settled: given back with the others
                            raise
            finally:
                _give_back(receiver, held)
    except AzureError as exc:  # ServiceBusError and the credential's errors
        raise ServiceBusUnavailable(f"{action} of {queue}/$DeadLetterQueue {sequence_number} failed: "
                                    f"{type(exc).__name__}: {exc}") from exc
    if len(held) >= MAX_SCAN:
        raise DeadLetterBusy(f"it is not among the first {MAX_SCAN} dead letters of {queue}: "
                             "resubmit or discard older ones first")
    raise DeadLetterBusy(f"dead letter {sequence_number} of {queue} is locked by another caller: try again")


def _bad(field: str, message: str) -> HttpResult:
    return problem(400, "invalid-request", "Invalid dead-letter request", f"{field}: {message}",
                   errors=[{"field": field, "message": message}])


def post_dead_letter_action(rt: Runtime, raw_queue: str | None, raw_sequence: str | None, action: str, *,
                            by: str, client: Any | None = None) -> HttpResult:
    """``POST /api/deadletters/{queue}/{sequenceNumber}/{action}``: 200 with what was done."""
    if action not in ACTIONS:
        raise ValueError(f"unknown dead-letter action {action!r}")
    queue = resolve_queue(rt, raw_queue)
    if queue is None:
        known = ", ".join(sorted(rt.config.queues))
        return _bad("queue", f"must be a queue setting ({known}) or the name of one of those queues")
    sequence_number = whole_number(raw_sequence or "", 19)
    if sequence_number is None or not 1 <= sequence_number <= MAX_SEQUENCE:
        return _bad("sequenceNumber", f"must be a sequence number: a whole number from 1 to {MAX_SEQUENCE}")
    where: dict[str, Any] = {"queue": queue[1], "sequenceNumber": sequence_number, "action": action}
    try:
        done = act_on_dead_letter(rt, queue[1], sequence_number, action, client=client)
    except DeadLetterNotFound as exc:
        return problem(404, "not-found", "No such dead letter", str(exc))
    except DeadLetterBusy as exc:
        return problem(409, "dead-letter-busy", "Dead letter not available", str(exc))
    except NotResubmittable as exc:
        return problem(422, "not-resubmittable", "Dead letter cannot be resubmitted", str(exc))
    except ServiceBusUnavailable as exc:
        log_event(logging.WARNING, "deadletter.action_failed", by=by, error=str(exc), **where)
        return problem(503, "service-bus-unavailable", "Service Bus unavailable", str(exc))
    log_event(logging.INFO, f"deadletter.{'resubmitted' if action == 'resubmit' else 'discarded'}",
              order_id=done.order_id, by=by, messageId=done.message_id, resubmittedAs=done.resubmitted_as, **where)
    return HttpResult(200, {**where, "setting": queue[0], "messageId": done.message_id, "orderId": done.order_id,
                            "resubmittedAs": done.resubmitted_as, "by": by})
