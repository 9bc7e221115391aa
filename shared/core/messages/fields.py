"""The messages' field rules and shared types: what a field must be, and the problem named when it is not."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from shared.core.jsonio import JsonObject

Body = JsonObject  # a message's JSON body (every one is made by a model's ``to_body()``)
MAX_FENCE_LENGTH = 32 * 1024  # characters of a fencing token (``shared.core.fence``) a request may carry

Kind = Literal["step", "compensation"]
KINDS: tuple[str, ...] = ("step", "compensation")
OPERATION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def problem(message: str) -> PydanticCustomError:
    return PydanticCustomError("agent_request", message)


def check_kind(value: object) -> object:
    if value not in KINDS:
        raise problem(f"must be one of {list(KINDS)}")
    return value


def check_non_blank(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise problem("a non-empty string is required")
    return value


def check_operation_name(value: object) -> str:
    name = check_non_blank(value)
    if not OPERATION_NAME.fullmatch(name):
        raise problem("not a valid operation name")
    return name


def check_attempt(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise problem("an integer >= 1 is required")
    return value


def check_aware_timestamp(value: object) -> datetime:
    """An ISO-8601 text with a UTC offset (``Z`` allowed), or an aware datetime (the scheduler's)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise problem("not an ISO-8601 timestamp") from None
    if not isinstance(value, datetime):
        raise problem("an ISO-8601 timestamp with a UTC offset is required")
    if value.tzinfo is None or value.utcoffset() is None:
        raise problem("a UTC offset is required")
    return value


def check_json_object(value: object) -> object:
    if not isinstance(value, dict):
        raise problem("a JSON object is required")
    return value


def check_json_object_or_empty(value: object) -> object:
    return {} if value is None else check_json_object(value)


def check_names_a_step(value: object) -> object:
    if not isinstance(value, str):
        raise problem("must name the request's step")
    return value


NonBlank = Annotated[str, BeforeValidator(check_non_blank)]
OperationName = Annotated[str, BeforeValidator(check_operation_name)]
ObjectField = Annotated[JsonObject, BeforeValidator(check_json_object)]

MESSAGE_CONFIG = ConfigDict(frozen=True, extra="ignore", alias_generator=to_camel,
                             validate_by_name=True, validate_by_alias=True)


def reraisable(error: ValidationError) -> list[InitErrorDetails]:
    """A caught error's details, fit to be raised again together with more."""
    return [InitErrorDetails(type=PydanticCustomError(e["type"], e["msg"]), loc=e["loc"], input=e["input"])
            for e in error.errors(include_url=False)]
