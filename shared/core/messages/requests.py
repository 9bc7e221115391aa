"""A step's request to its agent (docs/contracts.md, "Agent messages"): the body and where it goes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_serializer,
    field_validator,
)
from pydantic_core import InitErrorDetails

from shared.core.jsonio import JsonObject
from shared.core.messages.fields import (
    MAX_FENCE_LENGTH,
    MESSAGE_CONFIG,
    Body,
    Kind,
    NonBlank,
    ObjectField,
    OperationName,
    check_attempt,
    check_aware_timestamp,
    check_json_object_or_empty,
    check_kind,
    check_names_a_step,
    problem,
    reraisable,
)


class CompensationTarget(BaseModel):
    """The effect a compensation undoes: the step, and the key every attempt of it was sent with."""

    model_config = MESSAGE_CONFIG

    step: Annotated[str, BeforeValidator(check_names_a_step)]
    idempotency_key: NonBlank  # ORDERID:STEP


class AgentRequest(BaseModel):
    """The JSON body of a request to an agent, camelCase on the wire (``orderId`` ...).

    Build it with field names (``AgentRequest(kind="step", order_id=..., ...)``) and send
    ``to_body()``; the agent validates a received body with the same rules.
    """

    model_config = MESSAGE_CONFIG

    kind: Annotated[Kind, BeforeValidator(check_kind)]
    order_id: NonBlank
    step: NonBlank
    operation: OperationName  # the step's operation, or its compensation's
    attempt: Annotated[int, BeforeValidator(check_attempt)]
    idempotency_key: NonBlank  # ORDERID:STEP, or ORDERID:STEP:compensate
    complete_by: Annotated[datetime, BeforeValidator(check_aware_timestamp)]  # timezone-aware
    order: ObjectField  # {"customerId", "currency", "total", "items"}
    context: Annotated[JsonObject, BeforeValidator(check_json_object_or_empty)] = Field(default_factory=dict)
    compensates: CompensationTarget | None = None  # a compensation's target (None for a step)
    # The workflow the order runs: the agent applies its step's retry policy. Absent (a request
    # sent before orders named one): order v1.
    workflow: NonBlank = "order"
    workflow_version: Annotated[int, BeforeValidator(check_attempt)] = 1
    # The scheduler's fencing token (``shared.core.fence``), opaque to the agent: echoed unchanged in
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
            raise problem("only a compensation request has one")
        target_step = value.step if isinstance(value, CompensationTarget) else (
            value.get("step") if isinstance(value, dict) else None)
        request_step = info.data.get("step")  # absent when the step itself is invalid
        problems: list[InitErrorDetails] = []
        if isinstance(target_step, str) and request_step is not None and target_step != request_step:
            problems.append(InitErrorDetails(type=problem("must name the request's step"), loc=("step",),
                                             input=target_step))
        try:
            target: CompensationTarget = handler(value)
        except ValidationError as e:
            raise ValidationError.from_exception_data(cls.__name__, [*reraisable(e), *problems]) from None
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

    model_config = MESSAGE_CONFIG

    kind: Annotated[Kind, BeforeValidator(check_kind)]
    step: NonBlank
    operation: OperationName
    workflow: NonBlank = "order"
    workflow_version: Annotated[int, BeforeValidator(check_attempt)] = 1
