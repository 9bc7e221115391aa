"""Steps that wait: a ``wait`` for a named external event, and a ``delay``.

An event (``POST /api/orders/{id}/events/{name}``, :func:`decide_event`) is written to its wait
step's row, with when it came and its key (its Idempotency-Key, else its body's hash), in the
same ETag-conditioned transaction as every state change:

* the wait step is in flight: the event ends it (the step is Done with the event's body as its
  result, and the next step is dispatched), or, when the step names a ``decision`` field whose
  value is false, the step fails and the order is compensated;
* the wait step has not started (an earlier step runs, or the order is held): the event is kept,
  and the step, once started, sends itself a wake-up that ends it (``dispatch``);
* the same event again (same key): nothing is written, and the request in flight is sent again
  (a client retrying after a crash past the write heals the order at once); another one: refused.

A wake-up (:func:`decide_wake`) ends a delay, or a wait whose event was kept, if its attempt is
still the one in flight; anything else is stale. Past a step's CompleteBy the Supervisor decides
(:func:`waited_out`): a delay ends, a kept event ends its wait (the wake-up was lost), and a wait
with no event times out by its ``onTimeout``: ``continue`` (Done, ``{"timedOut": true}``),
``compensate`` or ``hold`` (the step fails, nothing was applied).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from shared.core.jsonio import dumps
from shared.core.lease import Lease
from shared.core.rows import StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.dispatch import inflight_requests
from shared.core.statemachine.failure import fail_step
from shared.core.statemachine.forward import step_done
from shared.core.statemachine.history import Event, EventKind, commit, event
from shared.core.statemachine.operator import why_not
from shared.core.statemachine.outbox import info, log
from shared.core.statemachine.verdicts import Decision, Rejected, Verdict
from shared.core.statemachine.view import View
from shared.core.states import Mode, StepState
from shared.core.times import iso
from shared.core.wakeup import WakeMessage
from shared.core.workflows import Step


class BadEvent(ValueError):
    """An event whose body the wait step cannot use (HTTP 400)."""


def event_key(body: dict[str, Any], idempotency_key: str | None) -> str:
    """What makes a copy of an event a copy: its Idempotency-Key, else its body's hash."""
    if idempotency_key is not None:
        return f"key:{idempotency_key}"
    return "sha256:" + hashlib.sha256(dumps(body).encode("utf-8")).hexdigest()


def decide_event(view: View, name: str, body: dict[str, Any], key: str, ctx: Ctx) -> Decision:
    """The event ``name`` with ``body`` for the order (module docstring); ``ctx`` is bound to the
    order's workflow. Raises :class:`Rejected` (409) or :class:`BadEvent` (400)."""
    state = view.state
    assert state is not None
    config = ctx.config
    spec = next((s for s in config.workflow if s.kind == "wait" and s.event == name), None)
    if spec is None:
        awaited = [s.event for s in config.workflow if s.event is not None]
        raise Rejected(f"{config.workflow_name} v{config.workflow_version} waits for no event {name!r}"
                       + (f"; it waits for {', '.join(map(repr, awaited))}" if awaited else "; it has no wait step"))
    step = view.step(spec.name)
    assert step is not None
    if step.event_key is not None:
        if step.event_key == key:
            # A client's retry after its first call died past the write: the request in flight
            # (the next step's, or a compensation's) is sent again (same id: deduplicated).
            return Decision(Verdict.EVENT_DUPLICATE, [info("event.duplicate", view, step=step.name, eventName=name),
                                                      *inflight_requests(view, ctx)])
        raise Rejected(f"event {name!r} was received already, at {iso(step.event_at) if step.event_at else '?'}; "
                       "a wait takes one event (send the same one again, or with the same Idempotency-Key)")
    if state.mode is Mode.FINISHED or state.mode is Mode.COMPENSATE:
        raise Rejected(why_not(state, f"send {name!r}", "events go to an order running its steps or held"))
    if step.state is StepState.SKIPPED:
        raise Rejected(f"this order skips step {step.name!r} (its when does not hold), so it waits for no {name!r}")
    if step.state is StepState.DONE:
        raise Rejected(f"the wait for {name!r} is over: step {step.name!r} is Done ({step.result})")
    _check(spec, body)
    received = replace(step, event_body=body, event_at=ctx.now, event_key=key)
    live = (state.mode is Mode.FORWARD and state.claimed and state.lease == Lease.for_step(step.name, step.attempt)
            and step.state is StepState.RUNNING)
    if live:
        return _ends_wait(view, received, spec, ctx, before=[event(EventKind.EVENT_RECEIVED, step.name, step.attempt,
                                                                   event=name)])
    new_state = replace(state, updated_at=ctx.now)
    return Decision(Verdict.EVENT_KEPT, [
        # Crash after this: the event is kept; the step, once started, wakes itself with it.
        commit(view, new_state, [received.replacing(step)],
               [event(EventKind.EVENT_RECEIVED, step.name, None, event=name, kept=True)], ctx, note="event kept"),
        info("event.kept", view, step=step.name, eventName=name, stepState=step.state),
    ])


def _check(spec: Step, body: dict[str, Any]) -> None:
    if spec.decision is not None and not isinstance(body.get(spec.decision), bool):
        raise BadEvent(f"event {spec.event!r} decides by its field {spec.decision!r}, which must be true or false "
                       f"(got {dumps(body.get(spec.decision))})")


def _ends_wait(view: View, step: StepRow, spec: Step, ctx: Ctx, *, before: Sequence[Event],
               by_supervisor: bool = False) -> Decision:
    """The wait step in flight ends with its event (``step`` carries it): Done, or, when its
    decision field is false, failed for good (the order is compensated: nothing to retry)."""
    body = step.event_body if isinstance(step.event_body, dict) else {}
    if spec.decision is not None and body.get(spec.decision) is False:
        declined = replace(step, result=body)
        return fail_step(view, declined, f"{spec.event}: {spec.decision} is false", ctx, timed_out=False,
                         before=before, hold=False, by_supervisor=by_supervisor)
    return step_done(view, step, body, ctx, before=before, by_supervisor=by_supervisor)


def decide_wake(view: View, msg: WakeMessage, ctx: Ctx) -> Decision:
    """A wake-up (module docstring)."""
    state = view.state
    assert state is not None
    step = view.step(msg.step)
    if step is None or not _in_flight(state, step, msg.attempt):
        return Decision(Verdict.STALE, [info("wake.stale", view, step=msg.step, attempt=msg.attempt,
                                             lease=str(state.lease))])
    spec = ctx.config.spec(step.name)
    if spec.kind == "delay":
        return step_done(view, step, {"firedAt": iso(ctx.now)}, ctx)
    if spec.kind == "wait" and step.event_key is not None:
        return _ends_wait(view, step, spec, ctx, before=[])
    return Decision(Verdict.STALE, [log(logging.WARNING, "wake.nothing_to_do", view, step=step.name,
                                        attempt=msg.attempt, kind=spec.kind)])


def _in_flight(state: StateRow, step: StepRow, attempt: int) -> bool:
    return (state.mode is Mode.FORWARD and state.claimed and state.lease == Lease.for_step(step.name, attempt)
            and step.state is StepState.RUNNING and step.attempt == attempt)


def waited_out(view: View, step: StepRow, ctx: Ctx) -> Decision:
    """The Supervisor on a wait or a delay in flight past its CompleteBy (module docstring)."""
    spec = ctx.config.spec(step.name)
    # The Supervisor hands whatever comes next to a scheduler, with an index row for its deadline:
    # the row it is handling is deleted after its decision.
    if spec.kind == "delay":  # its timer was lost (or is late): the Supervisor ends the delay
        return step_done(view, step, {"firedAt": iso(ctx.now), "by": "supervisor"}, ctx, by_supervisor=True)
    if step.event_key is not None:  # its event was kept, but the wake-up was lost
        return _ends_wait(view, step, spec, ctx, before=[], by_supervisor=True)
    timed_out = event(EventKind.WAIT_TIMED_OUT, step.name, step.attempt, event=spec.event, onTimeout=spec.on_timeout)
    if spec.on_timeout == "continue":
        return step_done(view, step, {"timedOut": True}, ctx, before=[timed_out], by_supervisor=True)
    reason = f"no {spec.event!r} event within {spec.timeout_seconds} s (onTimeout: {spec.on_timeout})"
    return fail_step(view, step, reason, ctx, timed_out=False, before=[timed_out], hold=spec.on_timeout == "hold",
                     by_supervisor=True)
