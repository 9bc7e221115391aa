"""What every decision is given: the settings it obeys (Config) and its moment (Ctx). What it
returns is in ``verdicts``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from shared.core.room import customer_cap
from shared.core.webhooks import DEFAULT_SCHEDULE, parse_schedule
from shared.core.workflows import (
    AGENTS,
    AGENTS_BY_NAME,
    DEFAULT_WORKFLOW,
    LEGACY_VERSION,
    Registry,
    Step,
    Workflow,
    load_registry,
)
from shared.core.workflows.lanes import lane_of
from shared.core.workflows.ratelimits import RateLimit, effective_limits


def _default_steps() -> tuple[Step, ...]:
    return load_registry().get(DEFAULT_WORKFLOW, LEGACY_VERSION).steps


@dataclass(frozen=True)
class Config:
    """The settings, and the workflow a decision obeys.

    ``workflow`` is the steps of (``workflow_name``, ``workflow_version``); the drivers bind it to
    the order's own workflow before deciding (:meth:`bound`). ``workflows`` is every loaded
    workflow (None: only the one given, as tests build it)."""

    queues: Mapping[str, str]  # queue setting name -> queue name
    workflow: tuple[Step, ...] = field(default_factory=_default_steps)
    workflow_name: str = DEFAULT_WORKFLOW
    workflow_version: int = LEGACY_VERSION
    workflows: Registry | None = None
    max_failures: int = 3
    backoff_threshold: int = 1
    backoff_base_seconds: float = 5.0
    backoff_cap_seconds: float = 900.0
    grace_seconds: float = 30.0
    step_timeout_override: float | None = None
    retention_days: int = 30
    breaker_max_wait_seconds: float = 300.0  # longest a step waits on an open breaker (BreakerMaxWaitSeconds)
    bulk_slice: int = 100  # orders a bulk operation acts on per Supervisor tick (BulkOrdersPerTick)
    bulk_max_in_flight: int = 5  # a bulk operation puts no order in flight past this many in all (BulkMaxInFlight)
    # a customer's orders past submission and not yet ended, at most (CustomerMaxInFlight; 0: no cap)
    customer_max_in_flight: int = 0
    # each limited remote's rate (workflows/agents.json's rateLimit, RemoteRateLimits over it)
    rate_limits: Mapping[str, RateLimit] = field(default_factory=dict)
    webhooks: bool = False  # WebhookUrl is set: an ending writes a delivery (shared.core.webhooks)
    # the delays after each failed try of a webhook (WebhookRetrySchedule)
    webhook_schedule: tuple[float, ...] = field(default_factory=lambda: parse_schedule(DEFAULT_SCHEDULE))

    @classmethod
    def from_settings(cls, settings: Any, workflow: tuple[Step, ...] | None = None,
                      registry: Registry | None = None) -> Config:
        """The config of ``settings`` (``shared.settings.Settings``). ``workflow`` (tests): the steps
        of the only workflow, order v1; else every workflow of ``registry`` (default: the
        ``WorkflowsPath`` directory's), unbound: the default workflow's highest version."""
        if workflow is not None:
            registry = Registry.of([Workflow(DEFAULT_WORKFLOW, LEGACY_VERSION, tuple(workflow))])
        elif registry is None:
            registry = load_registry(settings["WorkflowsPath"])
        default = registry.latest(DEFAULT_WORKFLOW)
        override = settings["StepTimeoutSeconds"].strip()
        return cls(
            queues=settings.queues(),
            workflow=default.steps, workflow_name=default.name, workflow_version=default.version,
            workflows=registry,
            max_failures=max(1, settings.int("MaxFailureCount")),
            backoff_threshold=settings.int("BackoffThreshold"),
            backoff_base_seconds=float(settings.decimal("BackoffBaseSeconds")),
            grace_seconds=float(settings.decimal("UnclaimedGraceSeconds")),
            step_timeout_override=float(override) if override else None,
            retention_days=max(1, settings.int("RetentionDays")),
            breaker_max_wait_seconds=float(settings.int("BreakerMaxWaitSeconds")),
            bulk_slice=max(1, settings.int("BulkOrdersPerTick")),
            bulk_max_in_flight=max(1, settings.int("BulkMaxInFlight")),
            customer_max_in_flight=customer_cap(settings["CustomerMaxInFlight"]),
            rate_limits=effective_limits({a.name: a.rate_limit for a in AGENTS}, settings["RemoteRateLimits"]),
            webhooks=bool(settings["WebhookUrl"].strip()),
            webhook_schedule=parse_schedule(settings["WebhookRetrySchedule"]),
        )

    @property
    def registry(self) -> Registry:
        """Every workflow this config may bind to (only its own when built without a registry)."""
        if self.workflows is not None:
            return self.workflows
        return Registry.of([Workflow(self.workflow_name, self.workflow_version, self.workflow)])

    def bound(self, name: str, version: int) -> Config:
        """This config for an order of workflow (``name``, ``version``); raises ``UnknownWorkflow``."""
        if (name, version) == (self.workflow_name, self.workflow_version):
            return self
        found = self.registry.get(name, version)
        return replace(self, workflow=found.steps, workflow_name=found.name, workflow_version=found.version)

    def spec(self, name: str) -> Step:
        for step in self.workflow:
            if step.name == name:
                return step
        raise KeyError(f"step {name} is not in workflow {self.workflow_name} v{self.workflow_version}")

    def timeout(self, step: Step) -> timedelta:
        """A call's timeout (StepTimeoutSeconds overrides every call's), or how long a wait waits
        (its own: a person's or a webhook's time is not a remote's)."""
        if step.kind == "wait":
            return timedelta(seconds=step.timeout_seconds)
        return timedelta(seconds=self.step_timeout_override or step.timeout_seconds)

    @property
    def grace(self) -> timedelta:
        """How long an order may wait unclaimed before the Supervisor re-sends its schedule message."""
        return timedelta(seconds=self.grace_seconds)

    def index_floor(self) -> timedelta:
        """The shortest time from any write to the deadline it sets (see ``deadlines``), over
        every loaded workflow: a sweep's row may guard an order of any of them."""
        return self._floor

    @cached_property
    def _floor(self) -> timedelta:
        steps = [s for wf in self.registry.all() for s in wf.steps] + list(self.workflow)
        # a delay sets no deadline shorter than this floor (``shared.core.statemachine.kinds``)
        return min([self.timeout(s) for s in steps if s.kind != "delay"] + [self.grace])

    def max_failures_of(self, step: Step) -> int:
        """Timeouts before ``step`` fails for good: its own policy, else MaxFailureCount."""
        return step.retry.max_failure_count or self.max_failures

    def agent_queue(self, step: Step, priority: str | None = None) -> str:
        """The request queue of ``step``'s agent, on the lane of an order of ``priority``."""
        return self.lane_queue(AGENTS_BY_NAME[step.agent].queue_setting, priority)

    def lane_queue(self, base_setting: str, priority: str | None) -> str:
        """The queue of work-queue setting ``base_setting`` (``SchedulerQueue``, ``RepliesQueue``,
        an agent's) on the lane of an order of ``priority`` (``shared.core.workflows.lanes``)."""
        return self.queues[lane_of(priority).setting(base_setting)]

    def backoff(self, failure_count: int, step: Step | None = None) -> timedelta:
        """Delay of the redrive notice: none up to the threshold, then base * 2^k, capped; the
        base is the step's own (``retry.backoffBaseSeconds``), else BackoffBaseSeconds."""
        if failure_count <= self.backoff_threshold:
            return timedelta(0)
        own = step.retry.backoff_base_seconds if step is not None else None
        base = self.backoff_base_seconds if own is None else own
        k = failure_count - self.backoff_threshold - 1
        return timedelta(seconds=min(self.backoff_cap_seconds, base * (2 ** k)))


@dataclass(frozen=True)
class Ctx:
    now: datetime
    config: Config
    instance_id: str = "local"
    token: str = "0"  # a fresh claim token per event
    actor: str | None = None  # who asked (an operator route's caller): every event recorded says ``by``
    operation: str | None = None  # the bulk operation that asked: said on its events, kept on the state row
