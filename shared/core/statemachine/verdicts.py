"""What a decision returns: its verdict and the effects that carry it out (``Decision``); the
verdicts themselves, and the error an operator action in the wrong state raises (``Rejected``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from shared.core.effects import Effect


class Verdict(StrEnum):
    """What a decision (or a handler) did: in logs, in tests, and as ``result`` of the operator
    routes. docs/operating.md, "Verdicts", lists them with these descriptions."""

    # The Scheduler: schedule messages, resumes, replies
    CLAIMED = "claimed"  # a scheduler claimed the order and put its step (or compensation) in flight
    RESUMED = "resumed"  # a redelivered message re-sent the request in flight, or a step's wait on a breaker ended
    IGNORED = "ignored"  # nothing to do: the order is not waiting for what the message asks
    STEP_DONE = "step-done"  # a step's reply recorded, the next step dispatched
    BRANCH_DONE = "branch-done"  # a branch of a parallel step done; other branches still in flight
    STEP_DONE_SUSPENDED = "step-done-suspended"  # a step's reply recorded; the order is suspended: nothing dispatched
    PROCESSED = "processed"  # the last step's reply recorded: the order is done
    DUPLICATE = "duplicate"  # the reply of an attempt already recorded (the request in flight is re-sent)
    STALE = "stale"  # a reply of an attempt no longer in flight, or a waiting reply from before the close: no write
    WAITING = "waiting"  # the step waits on its remote's open breaker
    WAITING_DUPLICATE = "waiting-duplicate"  # a waiting step's waiting reply again (a copy, or a failed probe's)
    PROBING = "probing"  # a waiting step carries the breaker's probe: its request sent again, nothing written
    RESENT = "resent"  # a close before the step's wait was recorded, or an older opening's close: request sent again
    LOST_RACE = "lost-race"  # another writer changed the order first, every time it was tried: nothing written
    POISON = "poison"  # the reply names an order or a step that does not exist (the message is poison)
    UNKNOWN_ORDER = "unknown-order"  # the order the message names does not exist
    INCONSISTENT = "inconsistent"  # the order's rows contradict each other (logged; nothing written)
    # Events (the ``result`` of ``POST /api/orders/{id}/events/{name}``), beside step-done and the failure verdicts
    EVENT_KEPT = "event-kept"  # an event came before its wait step started: kept for when it starts
    EVENT_DUPLICATE = "event-duplicate"  # the same event again (same key or body): nothing written
    # A step that failed for good, and compensation
    FAILED = "failed"  # a step failed for good and there is nothing to compensate: the order ends failed
    HELD = "held"  # a step failed for good (or its workflow is gone) and the order is held for an operator
    COMPENSATING = "compensating"  # a step failed for good: its done steps are compensated, latest first
    COMPENSATION_NEXT = "compensation-next"  # a compensation ended, the next one dispatched or handed on
    COMPENSATED = "compensated"  # the last compensation ended (done, or failed for good): the order is finished
    COMPENSATION_STOPPED = "compensation-stopped"  # a compensating order's workflow is gone: it stopped, failed
    WORKFLOW_UNKNOWN = "workflow-unknown"  # the order's workflow is gone and the order is stopped already
    # The Supervisor
    REDRIVEN = "redriven"  # an overdue step sent again (same idempotency key, next attempt)
    RESCHEDULED = "rescheduled"  # a lost schedule notice sent again, or a rate limit's overdue wake-up
    COMPENSATION_REDRIVEN = "compensation-redriven"  # an overdue (or, by an operator, failed) compensation again
    NOT_DUE = "not-due"  # the order moved on meanwhile: its deadline is ahead, a later index row covers it
    OBSOLETE = "obsolete"  # nothing is due on the order (its state changed, or the row was left over)
    # An operator (the ``result`` of retry, cancel, terminate, suspend and resume)
    RETRIED = "retried"  # a held order runs again from its failed step
    RESTARTED = "restarted"  # a failed, compensated order runs again from its first step (a new generation)
    CANCELLED = "cancelled"  # cancelled, with nothing to compensate
    CANCELLING = "cancelling"  # cancelled: its compensations are under way
    TERMINATED = "terminated"  # an order in flight stopped, with nothing to compensate
    TERMINATING = "terminating"  # an order in flight stopped: its compensations are under way
    SUSPENDED = "suspended"  # an order running its steps dispatches no new one until it is resumed
    UNSUSPENDED = "unsuspended"  # a suspended order goes on: its next step is dispatched (or the one in flight ends)


# After these an order's telemetry is kept whatever the sampling ratio (shared.observability.sampling):
# a step failed for good, the order is held or compensates, a Supervisor redrove an overdue step
KEEP_TELEMETRY = frozenset({Verdict.FAILED, Verdict.HELD, Verdict.COMPENSATING, Verdict.COMPENSATION_NEXT,
                            Verdict.COMPENSATED, Verdict.COMPENSATION_STOPPED, Verdict.WORKFLOW_UNKNOWN,
                            Verdict.INCONSISTENT, Verdict.REDRIVEN, Verdict.RESCHEDULED,
                            Verdict.COMPENSATION_REDRIVEN})

OPERATOR_RESULTS = (Verdict.RETRIED, Verdict.RESTARTED, Verdict.COMPENSATION_REDRIVEN, Verdict.CANCELLED,
                    Verdict.CANCELLING, Verdict.TERMINATED, Verdict.TERMINATING, Verdict.HELD, Verdict.SUSPENDED,
                    Verdict.UNSUSPENDED)


@dataclass
class Decision:
    """A verdict and the ordered effects that carry it out."""

    verdict: Verdict
    effects: list[Effect] = field(default_factory=list)

    def then(self, *effects: Effect) -> Decision:
        """The same decision with ``effects`` run after its own (after its write, if it wins)."""
        return Decision(self.verdict, [*self.effects, *effects]) if effects else self


class Rejected(Exception):
    """An operator action on an order in the wrong state (HTTP 409)."""
