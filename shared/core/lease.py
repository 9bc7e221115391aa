"""What an order has in flight: the state row's lease.

Stored as text in ``LeaseKey``: ``unclaimed`` (waiting for a scheduler claim), ``STEP:N``
(attempt N of a step), ``STEP:compensate:N`` (attempt N of its compensation), or absent
(nothing: the order is finished or held). The core only ever sees :class:`Lease`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class LeaseKind(StrEnum):
    UNCLAIMED = "unclaimed"
    STEP = "step"
    COMPENSATION = "compensation"


@dataclass(frozen=True, slots=True)
class Lease:
    kind: LeaseKind
    step: str = ""
    attempt: int = 0

    @classmethod
    def unclaimed(cls) -> Lease:
        return _UNCLAIMED

    @classmethod
    def for_step(cls, step: str, attempt: int) -> Lease:
        return cls(LeaseKind.STEP, step, attempt)

    @classmethod
    def for_compensation(cls, step: str, attempt: int) -> Lease:
        return cls(LeaseKind.COMPENSATION, step, attempt)

    @property
    def is_unclaimed(self) -> bool:
        return self.kind is LeaseKind.UNCLAIMED

    def __str__(self) -> str:
        if self.kind is LeaseKind.UNCLAIMED:
            return "unclaimed"
        if self.kind is LeaseKind.STEP:
            return f"{self.step}:{self.attempt}"
        return f"{self.step}:compensate:{self.attempt}"

    @classmethod
    def parse(cls, text: str | None) -> Lease | None:
        """The stored text back into a lease; ``None`` for no lease. Raises ``ValueError``
        for text no version of the app writes."""
        if not text:
            return None
        if text == "unclaimed":
            return _UNCLAIMED
        step, _, rest = text.partition(":")
        head, _, attempt = rest.rpartition(":")
        if step and head == "compensate":
            return cls.for_compensation(step, int(attempt))
        if step and not head:
            return cls.for_step(step, int(attempt))
        raise ValueError(f"not a lease: {text!r}")


_UNCLAIMED = Lease(LeaseKind.UNCLAIMED)
