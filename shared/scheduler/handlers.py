"""The Scheduler: schedule messages (claim + dispatch), resumes (a step that waited on an open
breaker goes on), wake-ups (a delay's timer, a wait's kept event) and agent replies.

Each handler takes a typed view of the order, asks the pure core what to do, and runs the
effects; when the decision's conditional write loses its race, it takes a fresh view and decides
again. Where a view comes from is the storage's business (``shared.storage.views``): a read of
the order's partition, or, for a reply, the rows its request's fencing token carries. Handlers are
idempotent: at-least-once delivery, crashes between writes and duplicates all resume from the
store (see ``shared.core.statemachine``).

Poison messages: the handler logs an error-level JSON line with the reason, the message id and
an excerpt, and raises :class:`PoisonMessage` with a reason code; the trigger dead-letters the
message at its first delivery with that reason and a description naming the problem
(``functions.settlement``): ``InvalidJson`` (not UTF-8/JSON), ``SchemaViolation`` (not the queue's
message, e.g. a schedule notice with a ``step``), ``UnknownOrder``, ``UnknownStep`` (a reply for a
step the order's workflow lacks), ``ResultTooLarge`` (a reply whose result cannot be stored).
The message is kept for inspection and replay, and the dead-letter alert fires. Nothing in the
state changes. Not poison: a stale notice (an order already claimed or finished) or a late reply
of a superseded attempt are normal at-least-once traffic, completed with their logged verdict.
Transient failures (store or bus unavailable) raise anything else: the message is abandoned and
redelivered, and only a fault that outlasts MaxDeliveryCount dead-letters it
(MaxDeliveryCountExceeded).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import NoReturn

from pydantic import ValidationError

from shared.core.effects import Effect, Log, PutWatch, Transact
from shared.core.jsonio import loads
from shared.core.messages import PoisonMessage, ReplyMessage, ResumeMessage, ScheduleMessage
from shared.core.statemachine import (
    KEEP_TELEMETRY,
    Decision,
    Verdict,
    decide_for_order,
    decide_reply,
    decide_resume,
    decide_schedule,
    decide_wake,
)
from shared.core.wakeup import WakeMessage
from shared.observability import telemetry
from shared.observability.logs import log_event
from shared.runtime import Runtime
from shared.storage.store import TooLarge
from shared.storage.views import SourcedView, read_view, refused, views_for_reply

REPLY_RACE_RETRIES = 3


def poison(source: str, code: str, reason: str, body: bytes, message_id: str | None,
           traceparent: str | None = None) -> NoReturn:
    """Log and raise a :class:`PoisonMessage`: ``code`` its dead-letter reason, ``reason`` the problem."""
    excerpt = body[:512].decode("utf-8", errors="replace")
    log_event(logging.ERROR, "message.poison", traceparent=traceparent, source=source, reason=code,
              description=reason, messageId=message_id, excerpt=excerpt, action="dead-lettered")
    raise PoisonMessage(f"{source}: {reason}", code)


def _invalid(source: str, what: str, exc: Exception, body: bytes, message_id: str | None,
             traceparent: str | None) -> NoReturn:
    """Not JSON (InvalidJson), or JSON that is not the queue's message (SchemaViolation), naming
    each field's problem."""
    if isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(body)'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        poison(source, "SchemaViolation", f"{what}: {problems}", body, message_id, traceparent)
    poison(source, "InvalidJson", f"{what}: {exc}".splitlines()[0], body, message_id, traceparent)


def handle_schedule(rt: Runtime, body: bytes, *, message_id: str | None = None,
                    traceparent: str | None = None) -> Verdict:
    """A schedule notice, handled in a CONSUMER span of the order's trace (the message's context)."""
    with telemetry.consumer_span("process scheduler", traceparent, **{"messaging.message.id": message_id}):
        return _handle_schedule(rt, body, message_id=message_id, traceparent=traceparent)


def _handle_schedule(rt: Runtime, body: bytes, *, message_id: str | None, traceparent: str | None) -> Verdict:
    try:
        data = loads(body)
        msg: ScheduleMessage | ResumeMessage | WakeMessage
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind == "resume":
            msg = ResumeMessage.model_validate(data)
        elif kind == "wake":
            msg = WakeMessage.model_validate(data)
        else:
            msg = ScheduleMessage.model_validate(data)
    except (ValueError, ValidationError) as exc:  # ValidationError first: it is a ValueError too
        _invalid("scheduler", "invalid schedule message", exc, body, message_id, traceparent)
    # A resume or a wake-up that loses its race (the step's waiting reply, an event, or a Supervisor
    # wrote first) is decided again on fresh rows: it still applies if the lease still names its
    # attempt. A schedule message that loses its race means another instance claimed the order: done.
    again = isinstance(msg, (ResumeMessage, WakeMessage))
    for _ in range(REPLY_RACE_RETRIES if again else 1):
        view = read_view(rt.store, msg.orderId)
        if view.state is None:
            poison("scheduler", "UnknownOrder", f"unknown order {msg.orderId}", body, message_id, traceparent)
        if isinstance(msg, ResumeMessage):
            decide = partial(decide_resume, view, msg)
        elif isinstance(msg, WakeMessage):
            decide = partial(decide_wake, view, msg)
        else:
            decide = partial(decide_schedule, view, msg.seq)
        decision = decide_for_order(view, rt.ctx(), decide)
        with telemetry.kept(decision.verdict, decision.verdict in KEEP_TELEMETRY):
            lost = rt.run(decision.effects).lost_race
        if not lost:
            return decision.verdict
    if isinstance(msg, (ResumeMessage, WakeMessage)):
        # Never drop a resume or a wake-up: the step would wait until the Supervisor's backstop.
        # Redelivered instead.
        raise RuntimeError(f"{msg.kind} of {msg.orderId} {msg.step}:{msg.attempt} lost {REPLY_RACE_RETRIES} races")
    return Verdict.LOST_RACE


def handle_reply(rt: Runtime, body: bytes, *, message_id: str | None = None,
                 traceparent: str | None = None) -> Verdict:
    """An agent's reply, handled in a CONSUMER span of the order's trace (the message's context)."""
    with telemetry.consumer_span("process replies", traceparent, **{"messaging.message.id": message_id}):
        return _handle_reply(rt, body, message_id=message_id, traceparent=traceparent)


def _handle_reply(rt: Runtime, body: bytes, *, message_id: str | None, traceparent: str | None) -> Verdict:
    try:
        reply = ReplyMessage.model_validate(loads(body))
    except (ValueError, ValidationError) as exc:
        _invalid("replies", "invalid reply", exc, body, message_id, traceparent)
    for sourced in views_for_reply(rt.store, reply, keys=rt.keys, reads=REPLY_RACE_RETRIES, message_id=message_id):
        view = sourced.view
        if view.state is None:
            poison("replies", "UnknownOrder", f"unknown order {reply.orderId}", body, message_id, traceparent)
        decision = _decide_reply(rt, sourced, reply, message_id)
        if decision is None:
            continue  # an unconfirmed view could not be acted on: decided again on a read
        if decision.verdict is Verdict.POISON:
            rt.run(decision.effects)
            poison("replies", "UnknownStep", f"unknown step {reply.step}", body, message_id, traceparent)
        try:
            with telemetry.kept(decision.verdict, decision.verdict in KEEP_TELEMETRY):
                outcome = rt.run(decision.effects)
        except TooLarge as exc:  # raised before anything is written
            if not sourced.confirmed:
                continue  # decided on a read, a stale reply is stale there, not poison
            # e.g. a result too large for a Table property: retrying cannot help. The step stays in
            # flight; the Supervisor times it out (and alerts at the threshold).
            poison("replies", "ResultTooLarge", f"reply cannot be stored: {exc}", body, message_id, traceparent)
        if not outcome.lost_race:
            return decision.verdict
        # Lost the ETag race (a Supervisor or a duplicate of this reply wrote first): decide again
        # on fresh rows; the reply is now stale or a duplicate, or still applies.
    return Verdict.LOST_RACE


def _decide_reply(rt: Runtime, sourced: SourcedView, reply: ReplyMessage, message_id: str | None) -> Decision | None:
    """The reply's decision on ``sourced``; None when the view is unconfirmed (a token's rows) and
    the decision cannot be acted on through its conditional write alone: it makes no decision, or
    it would act before writing (a failure's alert, a deadline row), on rows the order may have left."""
    try:
        decision = decide_for_order(sourced.view, rt.ctx(), partial(decide_reply, sourced.view, reply))
    except Exception as exc:  # noqa: BLE001 - on a token's rows only: the read decides
        if sourced.confirmed:
            raise
        refused(reply, message_id, f"no decision on its rows: {exc!r}")
        return None
    if sourced.confirmed or _writes_first(decision.effects):
        return decision
    return None


def _writes_first(effects: list[Effect]) -> bool:
    """Whether the decision's write comes before anything else it does (log lines aside, and a
    webhook delivery's watch: put on rows the order has left, its transaction loses the race and the
    watch, due, finds no delivery row of its own and goes; nothing else acts on it)."""
    for eff in effects:
        if isinstance(eff, Transact):
            return True
        if not isinstance(eff, Log | PutWatch):
            return False
    return False
