"""Workflow versions on real Table Storage (Azurite): v1 orders in flight when v2 is deployed
(a step added, one removed) each finish on the steps they started with; new orders run v2.

A deployment is a workflows directory (the ``WorkflowsPath`` setting) and a process that loaded
it: the v1 deployment's directory has order.v1 and digital.v1; the v2 deployment's has the same
files plus order.v2. Both run against the same tables and bus, as two app versions would."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from shared.api.orders import get_order, list_workflows
from shared.core.statemachine import Config
from shared.core.workflows import workflows_directory
from shared.settings import Settings
from tests.unit.harness import (
    BODY,
    REQUIRED_VALUES,
    AgentSim,
    Clock,
    CrashRuntime,
    DedupBus,
    drive,
    post,
    state,
    steps,
)

pytestmark = pytest.mark.integration

ORDER_V2 = """\
# v2: the shipment is gone (collected in store), an invoice is sent after the charge.
name: order
version: 2
description: Physical goods collected in store - reserve stock, charge, invoice.
steps:
  - name: reserve-inventory
    agent: inventory
    operation: reserve
    timeoutSeconds: 30
    compensation: release
  - name: charge-payment
    agent: payment
    operation: charge
    timeoutSeconds: 30
    compensation: refund
  - name: send-invoice
    agent: payment
    operation: invoice
    timeoutSeconds: 15
    onFailure: hold
"""


def _deployment(directory: Path, store: Any, bus: DedupBus, clock: Clock, instance: str) -> CrashRuntime:
    """A process of the app whose ``WorkflowsPath`` is ``directory``."""
    settings = Settings.from_env({**REQUIRED_VALUES, "WorkflowsPath": str(directory)})
    return CrashRuntime(store=store, bus=bus, config=Config.from_settings(settings), keys=settings.token_keys,
                        instance_id=instance, clock=clock)


def _ops(agents: AgentSim, oid: str) -> list[str]:
    return [c[2] for c in agents.calls if c[0] == oid]


def test_orders_in_flight_finish_on_their_version_after_v2_is_deployed(table_store: Any, tmp_path: Path) -> None:
    v1_dir, v2_dir = tmp_path / "v1", tmp_path / "v2"
    for d in (v1_dir, v2_dir):
        d.mkdir()
        for shipped in workflows_directory().glob("*.yaml"):
            if shipped.name != "order.v2.yaml":  # this test deploys its own order v2, later
                shutil.copy(shipped, d)
    bus, clock = DedupBus(), Clock()
    v1 = _deployment(v1_dir, table_store, bus, clock, "v1-instance")
    agents_v1 = AgentSim(v1)

    # v1 orders of both workflows, each one step done and the next one in flight
    old_order = post(v1).body["orderId"]
    old_digital = post(v1, {**BODY, "workflow": "digital"}).body["orderId"]
    lost_order = post(v1).body["orderId"]
    agents_v1.work(clock())
    agents_v1.reply_all()
    for oid, running in ((old_order, "charge-payment"), (old_digital, "charge-payment"),
                         (lost_order, "charge-payment")):
        assert state(v1, oid)["StepName"] == running
    # lost_order's charge request is lost: only the v2 deployment's Supervisor can redrive it
    bus.sent["agent-payment"] = [m for m in bus.sent["agent-payment"] if m.body["orderId"] != lost_order]

    # deploy v2: the v1 files stay, order.v2 is added; a new process loads the new directory
    (v2_dir / "order.v2.yaml").write_text(ORDER_V2)
    v2 = _deployment(v2_dir, table_store, bus, clock, "v2-instance")
    listed = [(w["name"], w["version"]) for w in list_workflows(v2).body["workflows"]]
    before = [(w["name"], w["version"]) for w in list_workflows(v1).body["workflows"]]
    assert ("order", 2) not in before and listed == sorted([*before, ("order", 2)])
    new_order = post(v2).body["orderId"]
    assert get_order(v2, new_order).body["workflow"] == {"name": "order", "version": 2}

    agents = AgentSim(v2)
    agents.calls, agents.effects = agents_v1.calls, agents_v1.effects  # the same remote services
    for oid in (old_order, old_digital, lost_order, new_order):
        assert drive(v2, oid, agents, max_rounds=400)["ProcessState"] == "Processed", oid
    assert _ops(agents, old_order) == ["reserve", "charge", "ship"]
    assert _ops(agents, lost_order) == ["reserve", "charge", "ship"]
    assert _ops(agents, old_digital) == ["reserve-licence", "charge", "deliver"]
    assert _ops(agents, new_order) == ["reserve", "charge", "invoice"]
    assert list(steps(v2, old_order)) == ["reserve-inventory", "charge-payment", "create-shipment"]
    assert list(steps(v2, new_order)) == ["reserve-inventory", "charge-payment", "send-invoice"]
    assert state(v2, lost_order)["FailureCount"] == 1  # redriven once, under v1's steps
    for oid in (old_order, lost_order):
        assert get_order(v2, oid).body["workflow"] == {"name": "order", "version": 1}
    assert table_store.due_index("299912312359", 100) == []  # every deadline row is gone
