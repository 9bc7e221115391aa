"""The delivery agent (workflows/agents.json), as the worker runs it: the digital workflow's
``deliver`` step reaches the delivery service, and the inventory agent serves the licences."""

from __future__ import annotations

import json
from typing import Any

import pytest

from functions import agents as agent_functions
from shared.agent import AgentRuntime, worker
from shared.core.messages import PoisonMessage
from shared.core.workflows.catalog import AGENTS_BY_NAME
from tests.unit.agent.test_runtime import RecordingSender, Scripted, mid_for, remote, request_body, sb_message

__all__ = ["remote"]  # the fixture, imported for pytest


def digital(step: str, operation: str, **over: Any) -> dict[str, Any]:
    return request_body(step=step, operation=operation, workflow="digital", workflowVersion=1, **over)


@pytest.mark.parametrize("agent, step, operation, result", [
    ("delivery", "deliver", "deliver", {"deliveryId": "dlv-1"}),
    ("inventory", "reserve-licence", "reserve-licence", {"licenceId": "lic-1"}),
])
def test_the_worker_path_serves_the_digital_steps(monkeypatch: pytest.MonkeyPatch, remote: Scripted, agent: str,
                                                  step: str, operation: str, result: dict[str, Any]) -> None:
    """process_message as the generated function calls it (no runtime given: the worker's)."""
    sender = RecordingSender()
    rt = AgentRuntime(agent, remote.base, sender)
    monkeypatch.setattr(worker, "runtime_for", lambda a: rt)
    checked = []
    monkeypatch.setattr(worker, "check_in_flight", lambda orders, request: checked.append(request.step))
    remote.script = [(200, result)]
    body = digital(step, operation)
    outcome = agent_functions.process_message(AGENTS_BY_NAME[agent],
                                              sb_message(json.dumps(body).encode(), message_id=mid_for(body)))
    assert outcome is not None and outcome.outcome == "success"
    [call] = remote.requests
    assert call["path"].endswith(f"/{operation}")
    assert call["headers"]["Idempotency-Key"] == f"{body['orderId']}:{step}"
    assert sender.replies[0].correlation_id == mid_for(body)
    assert checked == [step]  # the worker's path checks the order has the step in flight


def test_a_digital_step_on_another_agents_queue_is_poison(monkeypatch: pytest.MonkeyPatch, remote: Scripted) -> None:
    monkeypatch.setattr(worker, "runtime_for", lambda a: pytest.fail("never reaches a runtime"))
    body = digital("deliver", "deliver")
    with pytest.raises(PoisonMessage, match="served by agent 'delivery'"):
        agent_functions.process_message(AGENTS_BY_NAME["shipping"], sb_message(json.dumps(body).encode()))
    assert remote.requests == []
