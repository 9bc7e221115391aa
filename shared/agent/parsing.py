"""Reading a request on an agent's queue: the shared model's rules, plus this agent's route.

A request on the wrong queue (a step or operation the workflow does not route to this agent)
is poison: it must never reach another service's endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from shared.agent_messages import ReceivedRequest, RequestRoute, read_agent_request
from shared.workflow import WORKFLOW, Step


def parse_request(
    body: bytes | str,
    *,
    message_id: str | None,
    reply_to: str | None,
    application_properties: Mapping[Any, Any] | None = None,
    agent: str | None = None,
    workflow: Sequence[Step] = WORKFLOW,
) -> ReceivedRequest:
    """Parse and validate a request message. Raises ``PoisonMessage`` naming every problem.

    With ``agent`` given, the step and operation must be ones ``workflow`` routes to that agent.
    """
    route_check = None if agent is None else partial(route_problems, agent=agent, workflow=workflow)
    return read_agent_request(body, message_id=message_id, reply_to=reply_to,
                              application_properties=application_properties, route_check=route_check)


def route_problems(route: RequestRoute, agent: str, workflow: Sequence[Step] = WORKFLOW) -> list[str]:
    """Why ``agent`` must not serve ``route`` (empty when it may), each ``"field: why"``."""
    step = next((s for s in workflow if s.name == route.step), None)
    if step is None:
        return [f"step: {route.step!r} is not a workflow step"]
    if step.agent != agent:
        return [f"step: {route.step!r} is served by agent {step.agent!r}, not {agent!r}"]
    expected = step.operation if route.kind == "step" else step.compensation
    if route.operation != expected:
        return [f"operation: {route.kind} {route.step!r} expects {expected!r}, got {route.operation!r}"]
    return []
