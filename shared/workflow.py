"""Compatibility: the order workflow v1 and the agents, for code that predates ``shared.workflows``.

New code reads workflows through ``shared.workflows`` (every loaded (name, version)) and
decisions through ``ctx.config`` (bound to the order's workflow).
"""

from __future__ import annotations

from shared.workflows import (
    AGENTS,
    AGENTS_BY_NAME,
    DEFAULT_WORKFLOW,
    LEGACY_VERSION,
    Agent,
    Step,
    agent_for,
    load_registry,
)
from shared.workflows.model import OnFailure

WORKFLOW: tuple[Step, ...] = load_registry().get(DEFAULT_WORKFLOW, LEGACY_VERSION).steps
STEPS_BY_NAME = {s.name: s for s in WORKFLOW}


def step_index(name: str) -> int:
    for i, step in enumerate(WORKFLOW):
        if step.name == name:
            return i
    raise KeyError(name)


__all__ = ["AGENTS", "AGENTS_BY_NAME", "WORKFLOW", "STEPS_BY_NAME", "Agent", "OnFailure", "Step", "agent_for",
           "step_index"]
