"""The Scheduler: schedule messages (claim + dispatch), resumes (a step that waited on an open
breaker goes on) and agent replies.

Each handler reads the order's partition (one query), asks the pure core what to do, and
runs the effects. A reply whose request carried a fencing token (``shared.storage.fence``) is decided
on the token's rows instead, without a read; the partition is read only when that decision
loses its ETag race, does not write, or the token cannot be used. Handlers are idempotent:
at-least-once delivery, crashes between writes and duplicates all resume from the store (see
``shared.core.statemachine``).

Poison messages (not UTF-8/JSON, wrong schema, unknown order or step, a result that cannot
be stored): the handler logs an error-level JSON line with the reason, the message id and an
excerpt, and raises :class:`PoisonMessage`. The Functions binding (autoCompleteMessages) has
no explicit dead-letter call, so the trigger abandons it and the broker dead-letters it after
MaxDeliveryCount (reason MaxDeliveryCountExceeded): the message is kept for inspection and
replay, and the dead-letter alert fires. Nothing in the state changes on any delivery.
Transient failures (store or bus unavailable) raise too: the message is abandoned and
redelivered, and only a fault that outlasts MaxDeliveryCount dead-letters it.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, NoReturn

from pydantic import ValidationError

from shared.core.effects import Effect, Log, Transact
from shared.core.jsonio import loads
from shared.core.messages import PoisonMessage, ReplyMessage, ResumeMessage, ScheduleMessage
from shared.core.statemachine import View, decide_for_order, decide_reply, decide_resume, decide_schedule
from shared.core.statemachine.lease import Lease
from shared.observability import telemetry
from shared.observability.logs import log_event
from shared.runtime import Runtime
from shared.runtime.executor import Outcome
from shared.storage import fence
from shared.storage.store import TooLarge

REPLY_RACE_RETRIES = 3


def poison(source: str, reason: str, body: bytes, message_id: str | None,
           traceparent: str | None = None) -> NoReturn:
    excerpt = body[:512].decode("utf-8", errors="replace")
    log_event(logging.ERROR, "message.poison", traceparent=traceparent, source=source, reason=reason,
              messageId=message_id, excerpt=excerpt, action="abandoned; dead-lettered after MaxDeliveryCount")
    raise PoisonMessage(f"{source}: {reason}")


def _parse(body: bytes) -> Any:
    return loads(body)


def handle_schedule(rt: Runtime, body: bytes, *, message_id: str | None = None,
                    traceparent: str | None = None) -> str:
    """A schedule notice, handled in a CONSUMER span of the order's trace (the message's context)."""
    with telemetry.consumer_span("process scheduler", traceparent, **{"messaging.message.id": message_id}):
        return _handle_schedule(rt, body, message_id=message_id, traceparent=traceparent)


def _handle_schedule(rt: Runtime, body: bytes, *, message_id: str | None, traceparent: str | None) -> str:
    try:
        data = _parse(body)
        msg: ScheduleMessage | ResumeMessage
        if isinstance(data, dict) and data.get("kind") == "resume":
            msg = ResumeMessage.model_validate(data)
        else:
            msg = ScheduleMessage.model_validate(data)
    except (ValueError, ValidationError) as exc:
        poison("scheduler", f"invalid schedule message: {exc}".splitlines()[0], body, message_id,
                      traceparent)
    # A resume that loses its race (the step's waiting reply, or a Supervisor, wrote first) is
    # decided again on fresh rows: it still applies if the lease still names its attempt. A
    # schedule message that loses its race means another instance claimed the order: done.
    for _ in range(REPLY_RACE_RETRIES if isinstance(msg, ResumeMessage) else 1):
        view = View.from_entities(rt.store.read_partition(msg.orderId))
        if view.state is None:
            poison("scheduler", f"unknown order {msg.orderId}", body, message_id, traceparent)
        if isinstance(msg, ResumeMessage):
            decide = partial(decide_resume, view, msg)
        else:
            decide = partial(decide_schedule, view, msg.seq)
        decision = decide_for_order(view, rt.ctx(), decide)
        if not rt.run(decision.effects).lost_race:
            return decision.verdict
    if isinstance(msg, ResumeMessage):
        # Never drop a resume: the step would wait until its longest wait. Redelivered instead.
        raise RuntimeError(f"resume of {msg.orderId} {msg.step}:{msg.attempt} lost {REPLY_RACE_RETRIES} races")
    return "lost-race"


def handle_reply(rt: Runtime, body: bytes, *, message_id: str | None = None,
                 traceparent: str | None = None) -> str:
    """An agent's reply, handled in a CONSUMER span of the order's trace (the message's context)."""
    with telemetry.consumer_span("process replies", traceparent, **{"messaging.message.id": message_id}):
        return _handle_reply(rt, body, message_id=message_id, traceparent=traceparent)


def _handle_reply(rt: Runtime, body: bytes, *, message_id: str | None, traceparent: str | None) -> str:
    try:
        reply = ReplyMessage.model_validate(_parse(body))
    except (ValueError, ValidationError) as exc:
        poison("replies", f"invalid reply: {exc}".splitlines()[0], body, message_id, traceparent)
    # The reply's fencing token first (shared.storage.fence): the rows its request's write left, no read.
    # Its decision is used only if it commits (its write is conditioned on the token's ETags) and
    # does nothing before that write; one that loses, or does not write first, is dropped unrun
    # and the reply is decided on a read.
    fenced = _fenced_view(reply, message_id)
    if fenced is not None:
        verdict = _decide_on_token(rt, fenced, reply, message_id)
        if verdict is not None:
            return verdict
    for _ in range(REPLY_RACE_RETRIES):
        view = View.from_entities(rt.store.read_partition(reply.orderId))
        if view.state is None:
            poison("replies", f"unknown order {reply.orderId}", body, message_id, traceparent)
        decision = decide_for_order(view, rt.ctx(), partial(decide_reply, view, reply))
        if decision.verdict == "poison":
            rt.run(decision.effects)
            poison("replies", f"unknown step {reply.step}", body, message_id, traceparent)
        if not _run_reply(rt, decision.effects, body, message_id, traceparent).lost_race:
            return decision.verdict
        # Lost the ETag race (a supervisor or a duplicate of this reply wrote first): decide
        # again on fresh rows; the reply is now stale or a duplicate, or still applies.
    return "lost-race"


def _decide_on_token(rt: Runtime, view: View, reply: ReplyMessage, message_id: str | None) -> str | None:
    """The reply decided and written on its token's rows, or None when a read must decide it: the
    rows make no decision, the decision does not write first, its write lost, or the result cannot
    be stored (decided on a read, a stale reply is stale there, not poison)."""
    try:
        decision = decide_for_order(view, rt.ctx(), partial(decide_reply, view, reply))
    except Exception as exc:  # noqa: BLE001 - rows no write of ours left: the read decides
        log_event(logging.INFO, "reply.fence_refused", order_id=reply.orderId, step=reply.step,
                  attempt=reply.attempt, messageId=message_id, reason=f"no decision on its rows: {exc!r}")
        return None
    if not _writes_first(decision.effects):
        return None
    try:
        outcome = rt.run(decision.effects)
    except TooLarge:
        return None  # raised before the write: nothing ran
    return None if outcome.lost_race else decision.verdict


def _writes_first(effects: list[Effect]) -> bool:
    """Whether a decision made on a token's rows may be run: it writes, and nothing but log lines
    comes before its write. An effect before the write (a failure's alert, a deadline row) would
    act on rows the token may no longer match; such a decision is dropped and made on a read."""
    for eff in effects:
        if isinstance(eff, Transact):
            return True
        if not isinstance(eff, Log):
            return False
    return False


def _run_reply(rt: Runtime, effects: list[Effect], body: bytes, message_id: str | None,
               traceparent: str | None) -> Outcome:
    try:
        return rt.run(effects)
    except TooLarge as exc:
        # e.g. a result too large for a Table property: retrying cannot help. The step
        # stays in flight; the Supervisor times it out (and alerts at the threshold).
        poison("replies", f"reply cannot be stored: {exc}", body, message_id, traceparent)


def _fenced_view(reply: ReplyMessage, message_id: str | None) -> View | None:
    """The rows the reply's token carries, if it is one this app issued for this order and the
    attempt that replies held the lease when it was written; else None (the handler reads)."""
    if reply.fence is None:
        return None
    try:
        view = View.from_entities(fence.decode(reply.orderId, reply.fence))
    except Exception as exc:  # noqa: BLE001 - any token that does not make a view is ignored, never poison
        log_event(logging.INFO, "reply.fence_refused", order_id=reply.orderId, step=reply.step,
                  attempt=reply.attempt, messageId=message_id, reason=str(exc))
        return None
    lease = (Lease.for_step(reply.step, reply.attempt) if reply.kind == "step"
             else Lease.for_compensation(reply.step, reply.attempt))
    if view.state is None or view.order is None or view.state.order_id != reply.orderId or view.state.lease != lease:
        log_event(logging.INFO, "reply.fence_refused", order_id=reply.orderId, step=reply.step,
                  attempt=reply.attempt, messageId=message_id, reason="not this attempt's lease")
        return None
    return view
