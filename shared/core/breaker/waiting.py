"""The steps waiting on a remote's open breaker, as data: partition ``waiting-{remote}`` of the
state table (its rows: ``shared.storage.waiting``), and the resume message that wakes one.

One row per waiting step, RowKey ``{orderId}:{attempt:06d}:{step}`` (a compensation's:
``...:{step}:compensation``); a wait never moves the attempt, so the row stays the same however
many probes the breaker makes. The instance that closes the breaker lists them and sends each a
``resume`` message on the SchedulerQueue (``shared.runtime.resume.resume_waiting``), which ends
the wait if the step still waits on that attempt (``shared.core.statemachine.waiting``).
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


def resume_message(step: WaitingStep, queue: str, *, remote: str, why: Literal["closed", "probe"], tag: str,
                   not_before: datetime | None = None) -> OutMessage:
    """The SchedulerQueue message that moves ``step`` on if it still waits on that attempt: ``closed``
    ends the wait, ``probe`` has it carry the breaker's probe. ``tag`` names the occasion (the
    opening that closed, the probe's time): a copy of the same resume has the same id and is
    dropped, while the next opening's or probe's is a new message."""
    body = ResumeMessage.model_validate({"kind": "resume", "orderId": step.order_id, "step": step.step,
                                         "attempt": step.attempt, "for": step.kind, "why": why, "tag": tag,
                                         "remote": remote}).to_body()
    return OutMessage(queue=queue, body=body, message_id=f"resume:{step.row_key}:{tag}", correlation_id=step.order_id,
                      subject="resume", scheduled_enqueue_time=not_before,
                      application_properties={"kind": "resume"})


def closed_tag(opening: int) -> str:
    """The tag of the resumes that end the waits on a breaker's ``opening``."""
    return f"o{opening}"


def closed_opening(tag: str) -> int | None:
    """The opening a ``closed`` resume's tag names (:func:`closed_tag`), or None (not such a tag)."""
    return int(tag[1:]) if tag[:1] == "o" and tag[1:].isdigit() else None


def probe_tag(at: datetime) -> str:
    """The tag of a resume that carries the probe due at ``at``."""
    return f"probe-{at:%Y%m%dT%H%M%S%f}"
