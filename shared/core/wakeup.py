"""The scheduler queue's wake-up message (``shared.core.statemachine.dispatch``, ``.events``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from shared.core.messages import Body
from shared.core.orders import ORDER_ID


class WakeMessage(BaseModel):
    """Scheduler queue: a step that waits (``wait``, ``delay``) may go on. A delay's timer (a
    scheduled message, due when the delay ends), or a wait's event kept before the step started.
    The step's attempt names it: a copy, or one for an earlier attempt, changes nothing."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Literal["wake"]
    orderId: Annotated[str, Field(pattern=ORDER_ID.pattern)]  # noqa: N815
    step: Annotated[str, Field(min_length=1, max_length=100)]
    attempt: Annotated[StrictInt, Field(ge=1)]

    def to_body(self) -> Body:
        return self.model_dump()
