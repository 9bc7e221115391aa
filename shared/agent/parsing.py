"""Reading a request on an agent's queue: the shared model's rules (``shared.core.messages.AgentRequest``),
its Service Bus envelope, plus this agent's route.

:func:`read_agent_request` adds the request's :class:`Envelope` (message id, reply queue, trace
context: Service Bus properties, never read from the body) and raises ``PoisonMessage`` naming
every problem. A request on the wrong queue (a step or operation its workflow does not route to
this agent) is poison: it must never reach another service's endpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import Field, InstanceOf, ValidationError

from shared.core.jsonio import loads
from shared.core.messages import AgentRequest, PoisonMessage, RequestRoute
from shared.core.workflows import (
    DEFAULT_WORKFLOW,
    LEGACY_VERSION,
    Registry,
    Step,
    UnknownWorkflow,
    Workflow,
    load_registry,
)
from shared.observability.telemetry import valid_traceparent

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


# Wording of pydantic's own errors in a poison message's reason (the rest is the model's own).
_WORDING = {
    "missing": "required",
    "dict_type": "a JSON object is required",
    "model_type": "a JSON object is required",
}


# --------------------------------------------------------------------------- the envelope

@dataclass(frozen=True)
class Envelope:
    """A request's Service Bus properties: where to reply and the trace it belongs to."""

    message_id: str
    reply_to: str
    traceparent: str | None = None  # valid W3C traceparent, else None
    tracestate: str | None = None


class ReceivedRequest(AgentRequest):
    """A request as an agent received it: the body, plus its envelope (never sent in a body)."""

    envelope: InstanceOf[Envelope] = Field(exclude=True)


RouteCheck = Callable[[RequestRoute], list[str]]  # a route's problems, each "field: why"


# --------------------------------------------------------------------------- reading a request

def read_agent_request(body: bytes | str, *, message_id: str | None, reply_to: str | None,
                       application_properties: Mapping[Any, Any] | None = None,
                       route_check: RouteCheck | None = None) -> ReceivedRequest:
    """Validate a received request. Raises :class:`PoisonMessage` naming every problem.

    ``route_check`` (the reader's own rule) sees the kind, step and operation when those three
    are valid, whatever else is wrong, so that its problems are named with the others.
    """
    fields = _json_object_body(body)
    envelope, problems = _envelope(message_id, reply_to, application_properties)
    request: ReceivedRequest | None = None
    try:
        if envelope is None:
            AgentRequest.model_validate(fields)  # poison already: only to name the body's problems too
        else:  # the envelope given here wins over any "envelope" in the body
            request = ReceivedRequest.model_validate({**fields, "envelope": envelope})
    except ValidationError as e:
        problems = describe(e) + problems
    wrong_route: list[str] = []
    if route_check is not None:
        route = _route(fields)
        if route is not None:
            wrong_route = route_check(route)
    if problems or wrong_route:
        # a schema's problem first; a valid request for a step this agent does not serve: UnknownStep
        raise PoisonMessage("; ".join(problems + wrong_route), "SchemaViolation" if problems else "UnknownStep")
    assert request is not None  # a problem above when it is not
    return request


def describe(error: ValidationError) -> list[str]:
    """One ``"field: why"`` per problem (nested fields dotted: ``compensates.idempotencyKey``)."""
    return [f"{'.'.join(str(part) for part in e['loc']) or '(body)'}: {_WORDING.get(e['type'], e['msg'])}"
            for e in error.errors(include_url=False)]


def _json_object_body(body: bytes | str) -> dict[str, Any]:
    try:
        fields = loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise PoisonMessage(f"body is not JSON: {e}", "InvalidJson") from None
    if not isinstance(fields, dict):
        raise PoisonMessage("body is not a JSON object", "SchemaViolation")
    return fields


def _envelope(message_id: str | None, reply_to: str | None,
              properties: Mapping[Any, Any] | None) -> tuple[Envelope | None, list[str]]:
    """The envelope, or None and what is missing from it."""
    problems = [] if message_id else ["message_id: missing"]
    if not reply_to:
        problems.append("reply_to: missing (nowhere to reply)")
    if not message_id or not reply_to:
        return None, problems
    return Envelope(message_id=message_id, reply_to=reply_to,
                    traceparent=valid_traceparent(_property(properties, "traceparent")),
                    tracestate=_property(properties, "tracestate")), problems


def _route(fields: dict[str, Any]) -> RequestRoute | None:
    try:
        return RequestRoute.model_validate(fields)
    except ValidationError:
        return None  # its problems are already named by the request's validation


def _property(properties: Mapping[Any, Any] | None, name: str) -> str | None:
    """An application property as text (Service Bus may hand keys and values over as bytes)."""
    for key, value in (properties or {}).items():
        if (key.decode() if isinstance(key, bytes) else key) == name:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            return str(value) if value is not None else None
    return None
