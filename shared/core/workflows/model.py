"""A workflow as the core reads it: frozen dataclasses built from a validated file.

A step names the agent that serves it, the remote operation the agent calls, its timeout, the
compensating operation (if the step has an effect to undo), what to do when it fails for good,
whether it is a pivot (cannot be undone), and its retry policy. The scheduler walks the steps;
adding a step (or a workflow) is a change to ``workflows/*.yaml``, never to the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from shared.core.workflows.conditions import Condition, holds, to_json

OnFailure = Literal["compensate", "hold"]

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
    name: str
    agent: str
    operation: str  # POST {service}/{operation}
    timeout_seconds: int
    compensation: str | None = None  # POST {service}/{compensation}, same agent
    on_failure: OnFailure = "compensate"
    pivot: bool = False  # cannot be undone: never has a compensation
    retry: Retry = field(default_factory=Retry)
    when: Condition | None = None  # run only for orders it holds for (``conditions``); else Skipped

    def runs_for(self, order: dict[str, Any]) -> bool:
        """Whether the step runs for ``order`` (its payload, priority and customerId), or is skipped."""
        return self.when is None or holds(self.when, order)


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
        return {"name": self.name, "version": self.version, "description": self.description,
                "steps": [{"name": s.name, "kind": "call", "agent": s.agent, "timeoutSeconds": s.timeout_seconds,
                           "compensation": s.compensation, "onFailure": s.on_failure, "pivot": s.pivot,
                           "when": to_json(s.when) if s.when is not None else None}
                          for s in self.steps]}
