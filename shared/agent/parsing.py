"""Reading a request on an agent's queue: the shared model's rules, plus this agent's route.

A request on the wrong queue (a step or operation its workflow does not route to this agent)
is poison: it must never reach another service's endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from shared.agent_messages import ReceivedRequest, RequestRoute, read_agent_request
from shared.workflows import DEFAULT_WORKFLOW, LEGACY_VERSION, Registry, Step, UnknownWorkflow, Workflow, load_registry

Workflows = Registry | Sequence[Step] | None  # a registry; the steps of order v1 only; None: the loaded ones


def as_registry(workflows: Workflows) -> Registry:
    """``workflows`` as a registry (a bare step sequence is order v1; None: the loaded workflows)."""
    if workflows is None:
        return load_registry()
    if isinstance(workflows, Registry):
        return workflows
    return Registry.of([Workflow(DEFAULT_WORKFLOW, LEGACY_VERSION, tuple(workflows))])


def parse_request(
    body: bytes | str,
    *,
    message_id: str | None,
    reply_to: str | None,
    application_properties: Mapping[Any, Any] | None = None,
    agent: str | None = None,
    workflow: Workflows = None,
) -> ReceivedRequest:
    """Parse and validate a request message. Raises ``PoisonMessage`` naming every problem.

    With ``agent`` given, the step and operation must be ones the request's workflow routes to
    that agent.
    """
    route_check = None if agent is None else partial(route_problems, agent=agent, workflow=workflow)
    return read_agent_request(body, message_id=message_id, reply_to=reply_to,
                              application_properties=application_properties, route_check=route_check)


def step_of(registry: Registry, workflow: str, version: int, step: str) -> Step | None:
    """The step of a request (None if its workflow or step is not loaded)."""
    try:
        return registry.get(workflow, version).step(step)
    except UnknownWorkflow:
        return None


def route_problems(route: RequestRoute, agent: str, workflow: Workflows = None) -> list[str]:
    """Why ``agent`` must not serve ``route`` (empty when it may), each ``"field: why"``."""
    registry = as_registry(workflow)
    if (route.workflow, route.workflow_version) not in registry:
        return [f"workflow: {route.workflow!r} v{route.workflow_version} is not deployed"]
    step = step_of(registry, route.workflow, route.workflow_version, route.step)
    if step is None:
        return [f"step: {route.step!r} is not a workflow step"]
    if step.agent != agent:
        return [f"step: {route.step!r} is served by agent {step.agent!r}, not {agent!r}"]
    expected = step.operation if route.kind == "step" else step.compensation
    if route.operation != expected:
        return [f"operation: {route.kind} {route.step!r} expects {expected!r}, got {route.operation!r}"]
    return []
