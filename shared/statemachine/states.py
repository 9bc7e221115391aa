"""The states an order and its steps move through, as enums (stored as their plain values)."""

from __future__ import annotations

from enum import StrEnum


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


class StepState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    DONE = "Done"
    FAILED = "Failed"


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
