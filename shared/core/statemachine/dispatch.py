"""Putting a step (or its compensation) in flight, and finding what is in flight."""

from __future__ import annotations

from dataclasses import replace

from shared.core.effects import Send
from shared.core.lease import Lease, LeaseKind
from shared.core.rows import StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.groups import in_flight, members, rank
from shared.core.statemachine.history import Event, EventKind, event
from shared.core.statemachine.outbox import compensation_request
from shared.core.statemachine.start import deadline, step_sends
from shared.core.statemachine.view import View
from shared.core.states import CompensationState, Mode, StepState
from shared.core.times import iso


def dispatch_step(step: StepRow, state: StateRow, ctx: Ctx) -> tuple[StepRow, StateRow]:
    """The step Running with its next attempt, and the state row that says so."""
    running = _running(step, state, ctx)
    assert running.complete_by is not None
    return running, replace(state, step_index=step.index, step_name=step.name, attempt=running.attempt,
                            complete_by=running.complete_by, lease=Lease.for_step(step.name, running.attempt),
                            updated_at=ctx.now)


def dispatch(view: View, step: StepRow, state: StateRow, ctx: Ctx) -> tuple[list[StepRow], StateRow]:
    """``step`` put in flight, or, for a branch of a parallel step, every branch of its group not
    done yet (``groups``): the rows Running, and the state row whose lease names the step or the
    group, with the latest of their deadlines. No branch left to run: no rows."""
    group = ctx.config.spec(step.name).group
    if group is None:
        running, new_state = dispatch_step(step, state, ctx)
        return [running], new_state
    branches = members(view, step, ctx)
    rows = [_running(s, state, ctx) for s in branches if s.state not in (StepState.DONE, StepState.SKIPPED)]
    if not rows:
        return [], state
    complete_by = max(r.complete_by for r in rows if r.complete_by is not None)
    attempt = max(r.attempt for r in rows)
    return rows, replace(state, step_index=branches[0].index, step_name=group, attempt=attempt,
                         complete_by=complete_by, lease=Lease.for_step(group, attempt), updated_at=ctx.now)


def _running(step: StepRow, state: StateRow, ctx: Ctx) -> StepRow:
    return replace(step, state=StepState.RUNNING, attempt=step.attempt + 1, complete_by=deadline(step, state, ctx),
                   started_at=ctx.now, finished_at=None, waiting_on=None, waiting_since=None,
                   waiting_opening=None)


def dispatch_compensation(step: StepRow, state: StateRow, ctx: Ctx) -> tuple[StepRow, StateRow]:
    """The step's compensation Running with its next attempt, and the state row that says so."""
    attempt = step.compensation_attempt + 1
    complete_by = ctx.now + ctx.config.timeout(ctx.config.spec(step.name))
    running = replace(step, compensation=CompensationState.RUNNING, compensation_attempt=attempt,
                      compensation_complete_by=complete_by, compensation_started_at=ctx.now,
                      compensation_finished_at=None, waiting_on=None, waiting_since=None,
                      waiting_opening=None)
    return running, replace(state, comp_index=step.index, complete_by=complete_by,
                            lease=Lease.for_compensation(step.name, attempt), updated_at=ctx.now)


def dispatched(step: StepRow) -> Event:
    """The history event of a step put in flight (its attempt and deadline)."""
    deadline = step.complete_by
    return event(EventKind.DISPATCHED, step.name, step.attempt, completeBy=iso(deadline) if deadline else None)


def compensation_dispatched(step: StepRow) -> Event:
    deadline = step.compensation_complete_by
    return event(EventKind.COMPENSATION_DISPATCHED, step.name, step.compensation_attempt,
                 completeBy=iso(deadline) if deadline else None)


def outcome_unknown(step: StepRow, ctx: Ctx) -> bool:
    """A step not Done whose last attempt ended without an answer (timed out): the remote may
    have applied its effect. It is compensated too (by its idempotency key), if it has a
    compensation. An error reply settles it: the remote rejected the key, applied nothing."""
    return (step.state is not StepState.DONE and step.outcome_unknown
            and bool(ctx.config.spec(step.name).compensation))


def to_compensate(view: View, ctx: Ctx) -> list[StepRow]:
    """Every step to compensate, in compensation (reverse) order: the Done steps with a
    compensation, and a step whose outcome is unknown (the latest one: it comes first). A
    parallel step's branches come in reverse order of completion (``groups.rank``)."""
    chosen = [s for s in view.steps if (s.state is StepState.DONE and ctx.config.spec(s.name).compensation)
              or outcome_unknown(s, ctx)]
    return sorted(chosen, key=lambda s: rank(s, ctx), reverse=True)


def inflight_requests(view: View, ctx: Ctx) -> list[Send]:
    """The requests the state row says are in flight (to re-send after a crash), if still live:
    a step's (a wait with no event kept sends nothing), a parallel step's running branches', or
    a compensation's."""
    state = view.state
    if state is None or not state.claimed or state.lease is None or state.complete_by is None:
        return []
    lease = state.lease
    if state.complete_by <= ctx.now or lease.is_unclaimed:
        return []
    if lease.kind is LeaseKind.STEP:
        return [replace(send, what=f"{send.what} (resume)") for step in in_flight(view, ctx)
                for send in step_sends(view, step, ctx)]
    step = view.step(lease.step)
    if (step is not None and step.compensation is CompensationState.RUNNING
            and step.compensation_attempt == lease.attempt):
        return [replace(compensation_request(view, step, ctx), what="compensation (resume)")]
    return []


def request_not_in_flight(view: View, kind: str, step_name: str, attempt: int, ctx: Ctx) -> str | None:
    """Why an agent request (``kind`` "step" or "compensation", its step and attempt) is not one the
    order has in flight, or None when it is: the same rows :func:`inflight_requests` re-sends from
    (a step's or a parallel step's Running branch with that attempt under the order's step lease; a
    Running compensation with that attempt under its lease), time aside (the request's own
    completeBy is the agent's to check). ``ctx``: bound to the order's workflow (``bound``)."""
    state = view.state
    if state is None:
        return "no such order"
    if state.mode is Mode.FINISHED:
        return f"the order is finished ({state.process_state})"
    lease = state.lease
    if not state.claimed or lease is None or lease.is_unclaimed:
        return "the order has nothing in flight"
    step = view.step(step_name)
    if step is None:
        return f"the order has no step {step_name!r}"
    if kind == "compensation":
        if (lease == Lease.for_compensation(step_name, attempt) and step.compensation is CompensationState.RUNNING
                and step.compensation_attempt == attempt):
            return None
    elif lease.kind is LeaseKind.STEP and any(s.name == step_name and s.attempt == attempt
                                                for s in in_flight(view, ctx)):
        return None
    return (f"{kind} {step_name!r} attempt {attempt} is not in flight (the order's lease: "
            f"{lease.kind} {lease.step!r} attempt {lease.attempt})")
