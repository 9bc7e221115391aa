"""The file format of ``workflows/<name>.v<version>.yaml``, as a pydantic schema (extra keys forbidden).

Rules of one value are checked here (types, ranges, a pivot with a compensation); the loader adds
those that look further (duplicate step names, known agents, the file name, the size bound).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

NAME = r"^[a-z][a-z0-9-]{0,62}$"  # a workflow or step name: lower-case, digits, '-'
OPERATION = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # as an agent request's operation
NAME_PATTERN = re.compile(NAME)

Name = Annotated[str, StringConstraints(pattern=NAME)]
Operation = Annotated[str, StringConstraints(pattern=OPERATION)]
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class RetryFile(BaseModel):
    """Every field optional: absent takes the global default (settings, agent constants)."""

    model_config = _STRICT

    agentAttempts: Annotated[int, Field(ge=1, le=100)] | None = None  # noqa: N815
    agentBackoffSeconds: Annotated[float, Field(gt=0, le=60)] | None = None  # noqa: N815
    maxFailureCount: Annotated[int, Field(ge=1, le=100)] | None = None  # noqa: N815
    backoffBaseSeconds: Annotated[float, Field(ge=0, le=3600)] | None = None  # noqa: N815


class StepFile(BaseModel):
    model_config = _STRICT

    name: Name
    agent: Name
    operation: Operation
    timeoutSeconds: Annotated[int, Field(ge=1, le=86400)]  # noqa: N815
    compensation: Operation | None = None
    onFailure: Literal["compensate", "hold"] = "compensate"  # noqa: N815
    pivot: bool = False
    retry: RetryFile = Field(default_factory=RetryFile)
    # a condition over the order's fields (shared.core.workflows.conditions, parsed by the loader)
    when: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _pivot_cannot_be_undone(self) -> StepFile:
        if self.pivot and self.compensation is not None:
            raise ValueError("a pivot step cannot be undone: it must not have a compensation")
        return self


class WorkflowFile(BaseModel):
    model_config = _STRICT

    name: Name
    version: Annotated[int, Field(ge=1)]
    description: str = ""
    steps: Annotated[list[StepFile], Field(min_length=1)]
