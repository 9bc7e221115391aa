"""A workflow as the core reads it: frozen dataclasses built from a validated file.

A step names the agent that serves it, the remote operation the agent calls, its timeout, the
compensating operation (if the step has an effect to undo), what to do when it fails for good,
whether it is a pivot (cannot be undone), and its retry policy. The scheduler walks the steps;
adding a step (or a workflow) is a change to ``workflows/*.yaml``, never to the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from shared.core.workflows.conditions import Condition, holds, to_json
from shared.core.workflows.durations import to_iso

OnFailure = Literal["compensate", "hold"]
OnTimeout = Literal["compensate", "hold", "continue"]
StepKind = Literal["call", "wait", "delay"]

DEFAULT_WORKFLOW = "order"  # what a POST without "workflow" runs (its highest version)
LEGACY_VERSION = 1  # orders written before workflows were recorded ran order v1


@dataclass(frozen=True)
class Retry:
    """A step's retry policy; ``None`` fields take the global defaults (settings, agent constants)."""

    agent_attempts: int | None = None  # tries the agent makes on transient errors (None: until completeBy)
    agent_backoff_seconds: float | None = None  # the agent's first wait between tries (doubles)
    max_failure_count: int | None = None  # supervisor: timeouts before the step fails for good
    backoff_base_seconds: float | None = None  # supervisor: first redrive delay past the threshold


@dataclass(frozen=True)
class Step:
    """A step of one of three kinds: ``call`` (an agent calls its remote: ``agent``, ``operation``,
    ``compensation``...), ``wait`` (for the external ``event``; ``decision``: the boolean field of
    its body whose false value compensates the order; ``on_timeout``: what its timeout does) or
    ``delay`` (a durable timer: ``delay`` long, or ``until`` the order's time field plus ``delay``).
    A call may be a branch of a parallel ``group``: the group's branches are consecutive steps,
    dispatched together (``shared.core.statemachine.groups``)."""

    name: str
    agent: str  # "" for a wait or a delay
    operation: str  # POST {service}/{operation}
    timeout_seconds: int  # a call's, or how long a wait waits; 0 for a delay
    compensation: str | None = None  # POST {service}/{compensation}, same agent
    on_failure: OnFailure = "compensate"
    pivot: bool = False  # cannot be undone: never has a compensation
    retry: Retry = field(default_factory=Retry)
    when: Condition | None = None  # run only for orders it holds for (``conditions``); else Skipped
    kind: StepKind = "call"
    event: str | None = None
    decision: str | None = None
    on_timeout: OnTimeout = "compensate"
    delay: timedelta | None = None
    until: str | None = None  # "createdAt": the delay ends ``delay`` after that time of the order
    group: str | None = None  # the parallel step this call is a branch of

    def runs_for(self, order: dict[str, Any]) -> bool:
        """Whether the step runs for ``order`` (its payload, priority and customerId), or is skipped."""
        return self.when is None or holds(self.when, order)

    def due(self, started: datetime, created_at: datetime) -> datetime:
        """When a delay step started at ``started`` ends, for an order created at ``created_at``."""
        assert self.kind == "delay" and self.delay is not None
        return (created_at if self.until == "createdAt" else started) + self.delay

    def to_json(self) -> dict[str, object]:
        """The step as ``GET /api/workflows`` shows it: its kind's fields."""
        out: dict[str, object] = {"name": self.name, "kind": self.kind}
        if self.kind == "call":
            out |= {"agent": self.agent, "timeoutSeconds": self.timeout_seconds, "compensation": self.compensation,
                    "onFailure": self.on_failure, "pivot": self.pivot}
        elif self.kind == "wait":
            out |= {"event": self.event, "decision": self.decision, "timeoutSeconds": self.timeout_seconds,
                    "onTimeout": self.on_timeout}
        else:
            assert self.delay is not None
            out |= ({"until": {"field": self.until, "plus": to_iso(self.delay)}} if self.until
                    else {"duration": to_iso(self.delay)})
        return out | {"when": to_json(self.when) if self.when is not None else None}


@dataclass(frozen=True)
class Workflow:
    """One version of a named workflow."""

    name: str
    version: int
    steps: tuple[Step, ...]
    description: str = ""

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.version)

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def to_json(self) -> dict[str, object]:
        """The workflow as ``GET /api/workflows`` shows it."""
        steps: list[dict[str, object]] = []
        for s in self.steps:
            if s.group is None:
                steps.append(s.to_json())
            elif steps and steps[-1]["name"] == s.group:
                branches = steps[-1]["branches"]
                assert isinstance(branches, list)
                branches.append({**s.to_json(), "when": None})
            else:
                steps.append({"name": s.group, "kind": "parallel", "branches": [{**s.to_json(), "when": None}],
                              "when": to_json(s.when) if s.when is not None else None})
        return {"name": self.name, "version": self.version, "description": self.description,
                "events": [s.event for s in self.steps if s.event is not None], "steps": steps}
