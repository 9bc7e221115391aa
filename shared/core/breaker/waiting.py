"""The steps waiting on a remote's open breaker, as data: partition ``waiting-{remote}`` of the
state table (its rows: ``shared.storage.waiting``), and the resume message that wakes one.

One row per waiting step attempt, RowKey ``{orderId}:{attempt:06d}:{step}`` (a compensation's:
``...:{step}:compensation``). The instance that closes the breaker lists them and sends each a
``resume`` message on the SchedulerQueue (``shared.runtime.resume.resume_waiting``), which
re-dispatches the step if it still waits on that attempt (``shared.core.statemachine.waiting``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from shared.core.messages import OutMessage, ResumeMessage

WAITING_PREFIX = "waiting-"
MAX_LISTED = 5000  # rows the closer lists per pass (the rest: the next pass, see the design)


def waiting_partition(remote: str) -> str:
    return f"{WAITING_PREFIX}{remote}"


@dataclass(frozen=True, order=True)
class WaitingStep:
    """A step attempt waiting on a breaker: what a resume names."""

    order_id: str
    attempt: int
    step: str
    kind: Literal["step", "compensation"] = "step"

    @property
    def row_key(self) -> str:
        key = f"{self.order_id}:{self.attempt:06d}:{self.step}"
        return key if self.kind == "step" else f"{key}:compensation"

    @classmethod
    def from_row_key(cls, row_key: str) -> WaitingStep:
        order_id, attempt, step, *rest = row_key.split(":", 3)
        return cls(order_id, int(attempt), step, "compensation" if rest else "step")


def resume_message(step: WaitingStep, queue: str, *, not_before: datetime | None = None,
                   tag: str = "") -> OutMessage:
    """The SchedulerQueue message that re-dispatches ``step`` if it still waits on that attempt.
    Its id names the attempt (and ``tag``, e.g. a wake): duplicates are dropped."""
    message_id = f"resume:{step.row_key}" + (f":{tag}" if tag else "")
    body = ResumeMessage.model_validate({"kind": "resume", "orderId": step.order_id, "step": step.step,
                                         "attempt": step.attempt, "for": step.kind}).to_body()
    return OutMessage(queue=queue, body=body, message_id=message_id, correlation_id=step.order_id,
                      subject="resume", scheduled_enqueue_time=not_before,
                      application_properties={"kind": "resume"})
