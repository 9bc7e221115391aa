"""The order workflow, as data.

A step names the agent that serves it, the remote operation the agent calls, its timeout,
the compensating operation (if the step has an effect to undo), and what to do when it fails
for good. The scheduler walks this tuple; adding a step means adding a row here (and, for a
new remote service, an agent row), never touching the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OnFailure = Literal["compensate", "hold"]


@dataclass(frozen=True)
class Agent:
    name: str
    queue_setting: str  # app setting naming the agent's request queue (%InventoryQueue%)
    service_url_setting: str  # app setting holding the remote service's base URL


@dataclass(frozen=True)
class Step:
    name: str
    agent: str
    operation: str  # POST {service}/{operation}
    timeout_seconds: int
    compensation: str | None = None  # POST {service}/{compensation}, same agent
    on_failure: OnFailure = "compensate"


AGENTS: tuple[Agent, ...] = (
    Agent("inventory", "InventoryQueue", "InventoryServiceUrl"),
    Agent("payment", "PaymentQueue", "PaymentServiceUrl"),
    Agent("shipping", "ShippingQueue", "ShippingServiceUrl"),
)

WORKFLOW: tuple[Step, ...] = (
    Step("reserve-inventory", agent="inventory", operation="reserve", timeout_seconds=30, compensation="release"),
    Step("charge-payment", agent="payment", operation="charge", timeout_seconds=30, compensation="refund"),
    Step("create-shipment", agent="shipping", operation="ship", timeout_seconds=30),
)

AGENTS_BY_NAME = {a.name: a for a in AGENTS}
STEPS_BY_NAME = {s.name: s for s in WORKFLOW}


def step_index(name: str) -> int:
    for i, step in enumerate(WORKFLOW):
        if step.name == name:
            return i
    raise KeyError(name)


def agent_for(step: Step) -> Agent:
    return AGENTS_BY_NAME[step.agent]


def _check() -> None:
    names = [s.name for s in WORKFLOW]
    assert len(names) == len(set(names)), "step names must be unique"
    for s in WORKFLOW:
        assert s.agent in AGENTS_BY_NAME, f"step {s.name} names unknown agent {s.agent}"


_check()
