"""What operators and clients receive: status messages and alerts (docs/contracts.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_serializer
from pydantic.alias_generators import to_camel

from shared.core.messages.fields import Body
from shared.core.states import OrderCompensation, Outcome, ProcessState
from shared.core.times import iso

_OUT = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, validate_by_name=True, validate_by_alias=True)


class StatusMessage(BaseModel):
    """A change of an order, sent to the ``statusQueue`` the order named (docs/contracts.md):
    ``received``, ``step-done`` per step, and how it ended (``processed``, ``failed``,
    ``compensated``, ``cancelled``, ``terminated``, ``held``)."""

    model_config = _OUT

    kind: Literal["status"] = "status"
    order_id: str
    event: str
    at: datetime
    step: str | None = None
    process_state: ProcessState | None = None
    reason: str | None = None
    outcome: Outcome | None = None
    compensation: OrderCompensation | None = None

    @field_serializer("at")
    def _at(self, value: datetime) -> str:
        return iso(value)

    def to_body(self) -> Body:
        return self.model_dump(by_alias=True, exclude_none=True)


class AlertMessage(BaseModel):
    """An operator alert about an order (the alerts queue): a step failed for good, a
    compensation failed, or its workflow is gone."""

    model_config = _OUT

    kind: Literal["alert"] = "alert"
    order_id: str
    step: str | None
    reason: str
    failure_count: int
    at: datetime

    @field_serializer("at")
    def _at(self, value: datetime) -> str:
        return iso(value)

    def to_body(self) -> Body:
        return self.model_dump(by_alias=True)


class BreakerAlert(BaseModel):
    """An operator alert about a remote (the alerts queue): its circuit breaker opened or closed."""

    model_config = _OUT

    kind: Literal["breaker"] = "breaker"
    remote: str
    state: Literal["open", "closed"]
    at: datetime
    opens: int
    reason: str | None
    failures: int | None = None  # opened: the failures that opened it
    retry_at: datetime | None = None  # opened: when one instance probes
    open_seconds: float | None = None  # closed: how long it was open

    @field_serializer("at", "retry_at")
    def _times(self, value: datetime | None) -> str | None:
        return None if value is None else iso(value)

    def to_body(self) -> Body:
        absent = {name for name in ("failures", "retry_at", "open_seconds") if getattr(self, name) is None}
        return self.model_dump(by_alias=True, exclude=absent)
