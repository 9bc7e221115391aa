"""The agent request message (docs/contracts.md, "Agent messages"): one model for both sides.

The scheduler builds an :class:`AgentRequest` from typed values and sends ``to_body()``; the
agent reads the same model back with :func:`read_agent_request`, which adds the request's
:class:`Envelope` (message id, reply queue, trace context: Service Bus properties, never read
from the body) and raises :class:`~shared.messaging.PoisonMessage` naming every problem.

Money: bodies are parsed with ``shared.models.loads`` (every non-integer number a Decimal), and
``order`` and ``context`` keep their Decimals; ``shared.models.dumps`` writes them as strings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    InstanceOf,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_serializer,
    field_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from shared.effects import iso
from shared.fence import MAX_FENCE_LENGTH
from shared.messaging import PoisonMessage
from shared.models import loads
from shared.telemetry import valid_traceparent

Kind = Literal["step", "compensation"]
KINDS: tuple[str, ...] = ("step", "compensation")
OPERATION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

# Wording of pydantic's own errors in a poison message's reason (the rest is ours, below).
_WORDING = {
    "missing": "required",
    "dict_type": "a JSON object is required",
    "model_type": "a JSON object is required",
}


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
JsonObject = Annotated[dict[str, Any], BeforeValidator(_json_object)]

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
    order: JsonObject  # {"customerId", "currency", "total", "items"}
    context: Annotated[dict[str, Any], BeforeValidator(_json_object_or_empty)] = Field(default_factory=dict)
    compensates: CompensationTarget | None = None  # a compensation's target (None for a step)
    # The workflow the order runs: the agent applies its step's retry policy. Absent (a request
    # sent before orders named one): order v1.
    workflow: NonBlank = "order"
    workflow_version: Annotated[int, BeforeValidator(_attempt)] = 1
    # The scheduler's fencing token (``shared.fence``), opaque to the agent: echoed unchanged in
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
        return iso(value.astimezone(UTC))

    def to_body(self) -> dict[str, Any]:
        """The message body: camelCase keys, ``completeBy`` ISO-8601 UTC, ``compensates`` and
        ``fence`` only when there is one. Amounts stay Decimal (``shared.models.dumps`` writes them as strings)."""
        absent = {name for name in ("compensates", "fence") if getattr(self, name) is None}
        return self.model_dump(by_alias=True, exclude=absent or None)


def _reraisable(error: ValidationError) -> list[InitErrorDetails]:
    """A caught error's details, fit to be raised again together with more."""
    return [InitErrorDetails(type=PydanticCustomError(e["type"], e["msg"]), loc=e["loc"], input=e["input"])
            for e in error.errors(include_url=False)]


# --------------------------------------------------------------------------- the envelope

@dataclass(frozen=True)
class Envelope:
    """A request's Service Bus properties: where to reply and the trace it belongs to."""

    message_id: str
    reply_to: str
    traceparent: str | None = None  # valid W3C traceparent, else None
    tracestate: str | None = None


class ReceivedRequest(AgentRequest):
    """A request as an agent received it: the body, plus its envelope (never sent in a body)."""

    envelope: InstanceOf[Envelope] = Field(exclude=True)


class RequestRoute(BaseModel):
    """Which workflow, step and operation a request asks for: what decides the agent that may serve it."""

    model_config = _MESSAGE_CONFIG

    kind: Annotated[Kind, BeforeValidator(_kind)]
    step: NonBlank
    operation: OperationName
    workflow: NonBlank = "order"
    workflow_version: Annotated[int, BeforeValidator(_attempt)] = 1
    # The scheduler's fencing token (``shared.fence``), opaque to the agent: echoed unchanged in
    # the reply. Absent (a request sent before tokens, or when none could be issued): none back.
    fence: Annotated[str, Field(min_length=1, max_length=MAX_FENCE_LENGTH)] | None = None


RouteCheck = Callable[[RequestRoute], list[str]]  # a route's problems, each "field: why"


# --------------------------------------------------------------------------- reading a request

def read_agent_request(body: bytes | str, *, message_id: str | None, reply_to: str | None,
                       application_properties: Mapping[Any, Any] | None = None,
                       route_check: RouteCheck | None = None) -> ReceivedRequest:
    """Validate a received request. Raises :class:`PoisonMessage` naming every problem.

    ``route_check`` (the reader's own rule) sees the kind, step and operation when those three
    are valid, whatever else is wrong, so that its problems are named with the others.
    """
    fields = _json_object_body(body)
    envelope, problems = _envelope(message_id, reply_to, application_properties)
    request: ReceivedRequest | None = None
    try:
        if envelope is None:
            AgentRequest.model_validate(fields)  # poison already: only to name the body's problems too
        else:  # the envelope given here wins over any "envelope" in the body
            request = ReceivedRequest.model_validate({**fields, "envelope": envelope})
    except ValidationError as e:
        problems = describe(e) + problems
    if route_check is not None:
        route = _route(fields)
        if route is not None:
            problems += route_check(route)
    if problems:
        raise PoisonMessage("; ".join(problems))
    assert request is not None  # a problem above when it is not
    return request


def describe(error: ValidationError) -> list[str]:
    """One ``"field: why"`` per problem (nested fields dotted: ``compensates.idempotencyKey``)."""
    return [f"{'.'.join(str(part) for part in e['loc']) or '(body)'}: {_WORDING.get(e['type'], e['msg'])}"
            for e in error.errors(include_url=False)]


def _json_object_body(body: bytes | str) -> dict[str, Any]:
    try:
        fields = loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise PoisonMessage(f"body is not JSON: {e}") from None
    if not isinstance(fields, dict):
        raise PoisonMessage("body is not a JSON object")
    return fields


def _envelope(message_id: str | None, reply_to: str | None,
              properties: Mapping[Any, Any] | None) -> tuple[Envelope | None, list[str]]:
    """The envelope, or None and what is missing from it."""
    problems = [] if message_id else ["message_id: missing"]
    if not reply_to:
        problems.append("reply_to: missing (nowhere to reply)")
    if not message_id or not reply_to:
        return None, problems
    return Envelope(message_id=message_id, reply_to=reply_to,
                    traceparent=valid_traceparent(_property(properties, "traceparent")),
                    tracestate=_property(properties, "tracestate")), problems


def _route(fields: dict[str, Any]) -> RequestRoute | None:
    try:
        return RequestRoute.model_validate(fields)
    except ValidationError:
        return None  # its problems are already named by the request's validation


def _property(properties: Mapping[Any, Any] | None, name: str) -> str | None:
    """An application property as text (Service Bus may hand keys and values over as bytes)."""
    for key, value in (properties or {}).items():
        if (key.decode() if isinstance(key, bytes) else key) == name:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            return str(value) if value is not None else None
    return None
