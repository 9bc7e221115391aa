"""What every decision is given: the settings it obeys (Config) and its moment (Ctx)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shared.effects import Effect, PutIndex, Transact
from shared.workflow import AGENTS_BY_NAME, WORKFLOW, Step


@dataclass(frozen=True)
class Config:
    queues: Mapping[str, str]  # queue setting name -> queue name
    workflow: tuple[Step, ...] = WORKFLOW
    max_failures: int = 3
    backoff_threshold: int = 1
    backoff_base_seconds: float = 5.0
    backoff_cap_seconds: float = 900.0
    grace_seconds: float = 30.0
    step_timeout_override: float | None = None
    retention_days: int = 30

    @classmethod
    def from_settings(cls, settings: Any, workflow: tuple[Step, ...] = WORKFLOW) -> Config:
        from shared.settings import QUEUE_SETTINGS

        override = settings["StepTimeoutSeconds"].strip()
        return cls(
            queues={s.name: settings[s.name] for s in QUEUE_SETTINGS},
            workflow=workflow,
            max_failures=max(1, settings.int("MaxFailureCount")),
            backoff_threshold=settings.int("BackoffThreshold"),
            backoff_base_seconds=float(settings.decimal("BackoffBaseSeconds")),
            grace_seconds=float(settings.decimal("UnclaimedGraceSeconds")),
            step_timeout_override=float(override) if override else None,
            retention_days=max(1, settings.int("RetentionDays")),
        )

    def spec(self, name: str) -> Step:
        for step in self.workflow:
            if step.name == name:
                return step
        raise KeyError(f"step {name} is not in the workflow")

    def timeout(self, step: Step) -> timedelta:
        return timedelta(seconds=self.step_timeout_override or step.timeout_seconds)

    @property
    def grace(self) -> timedelta:
        """How long an order may wait unclaimed before the Supervisor re-sends its schedule message."""
        return timedelta(seconds=self.grace_seconds)

    def index_floor(self) -> timedelta:
        """The shortest time from any write to the deadline it sets (see ``deadlines``)."""
        return min([self.timeout(s) for s in self.workflow] + [self.grace])

    def agent_queue(self, step: Step) -> str:
        return self.queues[AGENTS_BY_NAME[step.agent].queue_setting]

    def backoff(self, failure_count: int) -> timedelta:
        """Delay of the redrive notice: none up to the threshold, then base * 2^k, capped."""
        if failure_count <= self.backoff_threshold:
            return timedelta(0)
        k = failure_count - self.backoff_threshold - 1
        return timedelta(seconds=min(self.backoff_cap_seconds, self.backoff_base_seconds * (2 ** k)))


@dataclass(frozen=True)
class Ctx:
    now: datetime
    config: Config
    instance_id: str = "local"
    token: str = "0"  # a fresh claim token per event


@dataclass
class Decision:
    """A verdict (for logs and tests) and the ordered effects that carry it out."""

    verdict: str
    effects: list[Effect] = field(default_factory=list)

    @property
    def writes(self) -> list[Effect]:
        return [e for e in self.effects if isinstance(e, (Transact, PutIndex))]


class Rejected(Exception):
    """An operator action on an order in the wrong state (HTTP 409)."""
