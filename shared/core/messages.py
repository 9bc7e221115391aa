"""The messages between the roles, typed (docs/contracts.md, "Agent messages"), and what a
message to send is (:class:`OutMessage`, a :class:`Bus` to send it on).

* :class:`AgentRequest`: the Scheduler's request to an agent. The Scheduler builds it from typed
  values and sends ``to_body()``; the agent reads the same model back
  (``shared.agent.parsing.read_agent_request``, which adds the Service Bus envelope).
* :class:`ReplyMessage`: an agent's reply. :class:`ScheduleMessage` and :class:`ResumeMessage`:
  the Scheduler queue's notices (claim an order; re-dispatch a step that waited on a breaker).
* :class:`PoisonMessage`: a message that can never be processed.

Money: bodies are parsed with ``shared.core.jsonio.loads`` (every non-integer number a Decimal),
and ``order`` and ``context`` keep their Decimals; ``shared.core.jsonio.dumps`` writes them as strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_serializer,
    field_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from shared.core.jsonio import JsonObject, dumps
from shared.core.orders import ORDER_ID
from shared.core.states import OrderCompensation, Outcome, ProcessState
from shared.core.times import iso

Body = JsonObject  # a message's JSON body (every one is made by a model's ``to_body()``)
MAX_FENCE_LENGTH = 32 * 1024  # characters of a fencing token (``shared.storage.fence``) a request may carry

Kind = Literal["step", "compensation"]
KINDS: tuple[str, ...] = ("step", "compensation")
OPERATION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

# --------------------------------------------------------------------------- field rules

def _problem(message: str) -> PydanticCustomError:
    return PydanticCustomError("agent_request", message)


def _kind(value: object) -> object:
    if value not in KINDS:
        raise _problem(f"must be one of {list(KINDS)}")
    return value


def _non_blank(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _problem("a non-empty string is required")
    return value


def _operation_name(value: object) -> str:
    name = _non_blank(value)
    if not OPERATION_NAME.fullmatch(name):
        raise _problem("not a valid operation name")
    return name


def _attempt(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _problem("an integer >= 1 is required")
    return value


def _aware_timestamp(value: object) -> datetime:
    """An ISO-8601 text with a UTC offset (``Z`` allowed), or an aware datetime (the scheduler's)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise _problem("not an ISO-8601 timestamp") from None
    if not isinstance(value, datetime):
        raise _problem("an ISO-8601 timestamp with a UTC offset is required")
    if value.tzinfo is None or value.utcoffset() is None:
        raise _problem("a UTC offset is required")
    return value


def _json_object(value: object) -> object:
    if not isinstance(value, dict):
        raise _problem("a JSON object is required")
    return value


def _json_object_or_empty(value: object) -> object:
    return {} if value is None else _json_object(value)


def _names_a_step(value: object) -> object:
    if not isinstance(value, str):
        raise _problem("must name the request's step")
    return value


NonBlank = Annotated[str, BeforeValidator(_non_blank)]
OperationName = Annotated[str, BeforeValidator(_operation_name)]
ObjectField = Annotated[JsonObject, BeforeValidator(_json_object)]

_MESSAGE_CONFIG = ConfigDict(frozen=True, extra="ignore", alias_generator=to_camel,
                             validate_by_name=True, validate_by_alias=True)


# --------------------------------------------------------------------------- the body

class CompensationTarget(BaseModel):
    """The effect a compensation undoes: the step, and the key every attempt of it was sent with."""

    model_config = _MESSAGE_CONFIG

    step: Annotated[str, BeforeValidator(_names_a_step)]
    idempotency_key: NonBlank  # ORDERID:STEP


class AgentRequest(BaseModel):
    """The JSON body of a request to an agent, camelCase on the wire (``orderId`` ...).

    Build it with field names (``AgentRequest(kind="step", order_id=..., ...)``) and send
    ``to_body()``; the agent validates a received body with the same rules.
    """

    model_config = _MESSAGE_CONFIG

    kind: Annotated[Kind, BeforeValidator(_kind)]
    order_id: NonBlank
    step: NonBlank
    operation: OperationName  # the step's operation, or its compensation's
    attempt: Annotated[int, BeforeValidator(_attempt)]
    idempotency_key: NonBlank  # ORDERID:STEP, or ORDERID:STEP:compensate
    complete_by: Annotated[datetime, BeforeValidator(_aware_timestamp)]  # timezone-aware
    order: ObjectField  # {"customerId", "currency", "total", "items"}
    context: Annotated[JsonObject, BeforeValidator(_json_object_or_empty)] = Field(default_factory=dict)
    compensates: CompensationTarget | None = None  # a compensation's target (None for a step)
    # The workflow the order runs: the agent applies its step's retry policy. Absent (a request
    # sent before orders named one): order v1.
    workflow: NonBlank = "order"
    workflow_version: Annotated[int, BeforeValidator(_attempt)] = 1
    # The scheduler's fencing token (``shared.storage.fence``), opaque to the agent: echoed unchanged in
    # the reply. Absent (a request sent before tokens, or when none could be issued): none back.
    fence: Annotated[str, Field(min_length=1, max_length=MAX_FENCE_LENGTH)] | None = None

    @field_validator("compensates", mode="wrap")
    @classmethod
    def _compensates_this_request(cls, value: Any, handler: ValidatorFunctionWrapHandler,
                                  info: ValidationInfo) -> CompensationTarget | None:
        """Only a compensation has a target, and it is the request's own step.

        The step rule is reported together with the target's own problems (not instead of them).
        """
        if value is None:
            return None
        if info.data.get("kind") != "compensation":
            raise _problem("only a compensation request has one")
        target_step = value.step if isinstance(value, CompensationTarget) else (
            value.get("step") if isinstance(value, dict) else None)
        request_step = info.data.get("step")  # absent when the step itself is invalid
        problems: list[InitErrorDetails] = []
        if isinstance(target_step, str) and request_step is not None and target_step != request_step:
            problems.append(InitErrorDetails(type=_problem("must name the request's step"), loc=("step",),
                                             input=target_step))
        try:
            target: CompensationTarget = handler(value)
        except ValidationError as e:
            raise ValidationError.from_exception_data(cls.__name__, [*_reraisable(e), *problems]) from None
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        return target

    @field_serializer("complete_by")
    def _iso_utc(self, value: datetime) -> str:
        return value.astimezone(UTC).isoformat(timespec="microseconds")

    def to_body(self) -> Body:
        """The message body: camelCase keys, ``completeBy`` ISO-8601 UTC, ``compensates`` and
        ``fence`` only when there is one. Amounts stay Decimal (``shared.core.jsonio.dumps`` writes them as strings)."""
        absent = {name for name in ("compensates", "fence") if getattr(self, name) is None}
        return self.model_dump(by_alias=True, exclude=absent or None)


class RequestRoute(BaseModel):
    """Which workflow, step and operation a request asks for: what decides the agent that may serve it."""

    model_config = _MESSAGE_CONFIG

    kind: Annotated[Kind, BeforeValidator(_kind)]
    step: NonBlank
    operation: OperationName
    workflow: NonBlank = "order"
    workflow_version: Annotated[int, BeforeValidator(_attempt)] = 1


def _reraisable(error: ValidationError) -> list[InitErrorDetails]:
    """A caught error's details, fit to be raised again together with more."""
    return [InitErrorDetails(type=PydanticCustomError(e["type"], e["msg"]), loc=e["loc"], input=e["input"])
            for e in error.errors(include_url=False)]


# --------------------------------------------------------------------------- Scheduler queue and replies

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
    # The request's fencing token, echoed (``shared.storage.fence``): the rows the scheduler decides on
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


# --------------------------------------------------------------------------- what operators and clients receive

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


# --------------------------------------------------------------------------- a message to send

@dataclass(frozen=True)
class OutMessage:
    """A message to send: every message the app sends carries ``traceparent`` (a child of the
    order's trace) as an application property, a deterministic ``message_id`` (so the queues'
    duplicate detection drops re-sends after a crash or redelivery) and a JSON body (UTF-8,
    decimals as strings)."""

    queue: str  # the queue's name (already resolved from its setting)
    body: Body  # the JSON body, as a message model's ``to_body()`` makes it
    message_id: str
    correlation_id: str | None = None
    reply_to: str | None = None
    subject: str | None = None
    time_to_live: timedelta | None = None
    scheduled_enqueue_time: datetime | None = None
    application_properties: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        return dumps(self.body).encode("utf-8")


class Bus(Protocol):
    def send(self, message: OutMessage) -> None: ...


class PoisonMessage(ValueError):
    """A message that can never be processed: ``reason`` is a short code (docs/reliability.md), the text
    names the problem. The trigger dead-letters it at its first delivery with both (functions/settlement.py)."""

    def __init__(self, description: str, reason: str = "PoisonMessage") -> None:
        super().__init__(description)
        self.reason = reason
