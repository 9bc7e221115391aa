"""The file format of ``workflows/<name>.v<version>.yaml``, as a pydantic schema (extra keys forbidden).

Rules of one value are checked here (types, ranges, a pivot with a compensation, the keys each step
kind takes); the loader adds those that look further (duplicate step names and events, known
agents, the file name, the size bound).

A step's ``kind``: ``call`` (the default: an agent calls a remote), ``wait`` (for a named external
event, ``POST /api/orders/{id}/events/{name}``), ``delay`` (a durable timer) or ``parallel`` (call
steps dispatched together: its ``branches``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from shared.core.workflows.durations import parse_duration

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


class UntilFile(BaseModel):
    """A ``delay`` until a time taken from the order: its ``field`` plus ``plus`` (ISO 8601)."""

    model_config = _STRICT

    field: Literal["createdAt"]
    plus: str = "PT0S"

    @model_validator(mode="after")
    def _plus_is_a_duration(self) -> UntilFile:
        if self.plus != "PT0S":
            parse_duration(self.plus)
        return self


# The keys each kind takes besides name, kind and when (anything else set is refused).
_KEYS = {
    "call": {"agent", "operation", "timeoutSeconds", "compensation", "onFailure", "pivot", "retry"},
    "wait": {"event", "decision", "timeoutSeconds", "onTimeout"},
    "delay": {"duration", "until"},
    "parallel": {"branches"},
}
_REQUIRED = {"call": ("agent", "operation", "timeoutSeconds"), "wait": ("event", "timeoutSeconds"), "delay": (),
             "parallel": ("branches",)}
MAX_BRANCHES = 8


class StepFile(BaseModel):
    model_config = _STRICT

    name: Name
    kind: Literal["call", "wait", "delay", "parallel"] = "call"
    # call: an agent's remote operation
    agent: Name | None = None
    operation: Operation | None = None
    timeoutSeconds: Annotated[int, Field(ge=1, le=30 * 86400)] | None = None  # noqa: N815 (call, wait)
    compensation: Operation | None = None
    onFailure: Literal["compensate", "hold"] = "compensate"  # noqa: N815
    pivot: bool = False
    retry: RetryFile = Field(default_factory=RetryFile)
    # wait: the event's name, the boolean field of its body that decides (false: compensate), and
    # what a timeout does
    event: Name | None = None
    decision: Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$")] | None = None
    onTimeout: Literal["compensate", "hold", "continue"] = "compensate"  # noqa: N815
    # delay: for a duration, or until a time taken from the order
    duration: str | None = None
    until: UntilFile | None = None
    # parallel: 2 to 8 call steps, dispatched together; the group is done when every one is
    branches: list[StepFile] | None = None
    # a condition over the order's fields (shared.core.workflows.conditions, parsed by the loader)
    when: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _keys_of_its_kind(self) -> StepFile:
        given = self.model_fields_set - {"name", "kind", "when"}
        foreign = sorted(given - _KEYS[self.kind])
        if foreign:
            raise ValueError(f"a {self.kind} step does not take {', '.join(foreign)} "
                             f"(it takes {', '.join(sorted(_KEYS[self.kind]))})")
        missing = [k for k in _REQUIRED[self.kind] if getattr(self, k) is None]
        if missing:
            raise ValueError(f"a {self.kind} step needs {', '.join(missing)}")
        if self.kind == "delay":
            if (self.duration is None) == (self.until is None):
                raise ValueError("a delay step needs either duration (ISO 8601, e.g. PT1H) or until, not both")
            if self.duration is not None:
                parse_duration(self.duration)
        if self.kind == "parallel":
            assert self.branches is not None
            if not 2 <= len(self.branches) <= MAX_BRANCHES:
                raise ValueError(f"a parallel step has 2 to {MAX_BRANCHES} branches, not {len(self.branches)}")
            odd = [b.name for b in self.branches if b.kind != "call" or b.when is not None]
            if odd:
                raise ValueError(f"a branch is a call step without its own when (its group's when applies to all): "
                                 f"{', '.join(odd)}")
        if self.kind == "wait" and self.timeoutSeconds is not None and self.timeoutSeconds > 30 * 86400:
            raise ValueError("a wait lasts at most 30 days")
        if self.kind == "call" and self.timeoutSeconds is not None and self.timeoutSeconds > 86400:
            raise ValueError("a call's timeoutSeconds is at most 86400")
        if self.pivot and self.compensation is not None:
            raise ValueError("a pivot step cannot be undone: it must not have a compensation")
        return self


class WorkflowFile(BaseModel):
    model_config = _STRICT

    name: Name
    version: Annotated[int, Field(ge=1)]
    description: str = ""
    steps: Annotated[list[StepFile], Field(min_length=1)]
