"""The Scheduler queue's notices and the agents' replies (docs/contracts.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, field_serializer

from shared.core.jsonio import JsonObject
from shared.core.messages.fields import MAX_FENCE_LENGTH, Body
from shared.core.orders import ORDER_ID
from shared.core.times import iso


class ScheduleMessage(BaseModel):
    """Scheduler queue: 'dispatch whatever this order needs next'. Nothing else: a field it does
    not have (a ``step``...) makes it poison (it is not the message its sender meant)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["schedule"]
    orderId: Annotated[str, Field(pattern=ORDER_ID.pattern)]  # noqa: N815
    seq: Annotated[StrictInt, Field(ge=0)]

    def to_body(self) -> Body:
        return self.model_dump()


def _usable_fence(value: object) -> str | None:
    """A reply's token as it came, or None when it cannot be one (wrong type, too long): the
    reply is still processed, with a read, as one without a token."""
    return value if isinstance(value, str) and 0 < len(value) <= MAX_FENCE_LENGTH else None


class ReplyMessage(BaseModel):
    """An agent's reply (docs/contracts.md)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Literal["step", "compensation"]
    orderId: Annotated[str, Field(pattern=ORDER_ID.pattern)]  # noqa: N815
    step: Annotated[str, Field(min_length=1, max_length=100)]
    attempt: Annotated[StrictInt, Field(ge=1)]
    outcome: Literal["success", "error", "waiting"]
    result: JsonObject | None = None
    reason: str | None = None
    # outcome "waiting": the remote's breaker is open; no call was made. ``until``: when it is looked at
    # again; ``wake``: this step is re-dispatched then; ``opening``: the breaker's Opens the agent read.
    breaker: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    until: datetime | None = None
    wake: bool = False
    opening: Annotated[StrictInt, Field(ge=1)] | None = None
    # The request's fencing token, echoed (``shared.core.fence``): the rows the scheduler decides on
    # instead of reading them. Checked there; a token it cannot use is ignored, never poison.
    fence: Annotated[str | None, BeforeValidator(_usable_fence)] = None

    @field_serializer("until")
    def _until(self, value: datetime | None) -> str | None:
        return None if value is None else iso(value)

    def to_body(self) -> Body:
        """The reply as sent: ``result`` and ``reason`` always; the breaker's fields only on a
        ``waiting`` reply (``opening`` when known); the token only when the request had one."""
        absent = {name for name in ("fence", "opening") if getattr(self, name) is None}
        if self.outcome != "waiting":
            absent |= {"breaker", "until", "wake", "opening"}
        return self.model_dump(exclude=absent)


class ResumeMessage(BaseModel):
    """Scheduler queue: re-dispatch a step (or compensation) attempt that waits on a breaker."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    kind: Literal["resume"]
    orderId: Annotated[str, Field(pattern=ORDER_ID.pattern)]  # noqa: N815
    step: Annotated[str, Field(min_length=1, max_length=100)]
    attempt: Annotated[StrictInt, Field(ge=1)]
    target: Literal["step", "compensation"] = Field("step", alias="for")
    # ``closed``: the breaker closed, the wait ends. ``probe``: the breaker's cool-down is over and
    # this waiting step carries the probe; it goes on waiting unless the probe succeeds.
    why: Literal["closed", "probe"] = "closed"
    # What makes this resume unique (the opening it ends, or the probe's time): the request it
    # sends again is named by it, so a copy of the resume sends no second request.
    tag: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9.:-]*$")] = ""
    # The remote whose waiting row names this step: a stale resume forgets that row.
    remote: Annotated[str, Field(min_length=1, max_length=100)] | None = None

    def to_body(self) -> Body:
        return self.model_dump(by_alias=True)
