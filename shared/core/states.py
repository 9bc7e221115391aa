"""The states an order and its steps move through, as enums (stored as their plain values)."""

from __future__ import annotations

from enum import StrEnum

# The failure reason of a step an operator's terminate fenced while it was in flight.
TERMINATED_REASON = "terminated by operator"


class ProcessState(StrEnum):
    """The order's state as the pattern's state store records it."""

    PENDING = "Pending"  # redriven or retried: waits for a scheduler claim
    PROCESSING = "Processing"  # a step is dispatched and the claim is held
    PROCESSED = "Processed"  # every step done
    ERROR = "Error"  # a step failed for good, or the order was cancelled


class Mode(StrEnum):
    """What the order is doing, next to its ProcessState."""

    FORWARD = "forward"  # running its steps
    COMPENSATE = "compensate"  # undoing its steps, in reverse
    HELD = "held"  # waits for an operator (retry or cancel)
    FINISHED = "finished"  # nothing left to do


class Outcome(StrEnum):
    """How an order ended (or why it stopped)."""

    PROCESSED = "processed"
    FAILED = "failed"
    HELD = "held"
    CANCELLED = "cancelled"
    TERMINATED = "terminated"


class StepState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    DONE = "Done"
    FAILED = "Failed"
    SKIPPED = "Skipped"  # its ``when`` does not hold for the order: never run, never compensated


class CompensationState(StrEnum):
    """A step's compensation; ``NONE`` when the step is not being compensated."""

    NONE = ""
    PENDING = "Pending"
    RUNNING = "Running"
    DONE = "Done"
    FAILED = "Failed"


class OrderCompensation(StrEnum):
    """The order's compensation as a whole (the state row's ``CompensationState``)."""

    NONE = "none"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class Category(StrEnum):
    """Where an order is listed in search (``GET /api/orders?state=``): exactly one of these.

    ``processed`` and ``error`` are final: an order in them never moves again (it is only
    purged). ``in_flight`` and ``attention`` change, so a search verifies their rows."""

    IN_FLIGHT = "inFlight"  # running forward, or compensating
    ATTENTION = "attention"  # held; failed and not retried; a compensation failed for good
    PROCESSED = "processed"
    ERROR = "error"  # ended in Error with nothing left to do (cancelled, terminated)

    @property
    def final(self) -> bool:
        return self in (Category.PROCESSED, Category.ERROR)
