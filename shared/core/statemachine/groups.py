"""Parallel steps: a group of call steps (its branches) dispatched together.

The branches are consecutive steps of the workflow, each with its own row, attempt, deadline,
request and reply. The order's lease names the group (``Lease.for_step(group, n)``); a branch's
reply is live while its row is Running with the reply's attempt. The group is done when every
branch is: the last reply dispatches the next step. A branch that fails for good fails the group:
the branches still in flight are stopped (Failed, their outcome unknown, compensated by their
keys), and the order's policy applies, compensating the done branches in reverse order of
completion, then the steps before the group (:func:`rank`). When the group's deadline passes,
the Supervisor redrives the branches not done, together (FailureCount + 1).

A branch whose remote's breaker is open does not wait in the one quiet state of a step: its
``waiting`` reply is ignored, and it is redriven at the group's deadline like a lost request.
"""

from __future__ import annotations

from dataclasses import replace

from shared.core.lease import Lease, LeaseKind
from shared.core.rows import StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.view import View
from shared.core.states import StepState

STOPPED_REASON = "stopped: another branch of its parallel step failed for good"


def group_of(step: StepRow, ctx: Ctx) -> str | None:
    return ctx.config.spec(step.name).group


def members(view: View, step: StepRow, ctx: Ctx) -> list[StepRow]:
    """The branches of ``step``'s group (``step`` among them), or ``[step]``."""
    group = group_of(step, ctx)
    if group is None:
        return [step]
    return [s for s in view.steps if ctx.config.spec(s.name).group == group]


def in_flight(view: View, ctx: Ctx) -> list[StepRow]:
    """The steps the order's step lease names that are Running: a step's attempt, or a group's
    running branches."""
    state = view.state
    lease = state.lease if state is not None else None
    if lease is None or lease.is_unclaimed:
        return []
    step = view.step(lease.step)
    if step is not None:
        return [step] if step.state is StepState.RUNNING and step.attempt == lease.attempt else []
    return [s for s in view.steps if ctx.config.spec(s.name).group == lease.step and s.state is StepState.RUNNING]


def lease_names(state: StateRow, step: StepRow, attempt: int, ctx: Ctx) -> bool:
    """Whether the order's lease is ``step``'s attempt ``attempt``, or ``step``'s group's."""
    group = group_of(step, ctx)
    if group is None:
        return state.lease == Lease.for_step(step.name, attempt)
    return state.lease is not None and state.lease.kind is LeaseKind.STEP and state.lease.step == group


def fence(others: list[StepRow], ctx: Ctx, reason: str) -> list[StepRow]:
    """The running branches among ``others``, stopped: Failed, their outcome unknown (their
    requests may have been applied), finished now (so they are compensated first)."""
    return [replace(s, state=StepState.FAILED, failure_reason=reason, outcome_unknown=True, complete_by=None,
                    finished_at=ctx.now, waiting_on=None)
            for s in others if s.state is StepState.RUNNING]


def rank(step: StepRow, ctx: Ctx) -> tuple[int, float, int]:
    """A step's place in the order its effect was applied: its index, or, for a branch, its
    group's first index and then when it finished (still running: last). Compensations run in
    reverse of this order."""
    spec = ctx.config.spec(step.name)
    if spec.group is None:
        return (step.index, 0.0, step.index)
    first = next(i for i, s in enumerate(ctx.config.workflow) if s.group == spec.group)
    finished = step.finished_at.timestamp() if step.finished_at is not None else float("inf")
    return (first, finished, step.index)
