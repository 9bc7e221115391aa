"""A step's ``when`` (``shared.core.workflows.conditions``): the declarative form, what it refuses
(naming the file and the step, so the app does not start), and a skipped step in an order's life:
never called, never compensated, shown Skipped, kept so by a restart."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shared.api.operator import retry_order
from shared.api.orders import get_order
from shared.core.workflows import Registry, Workflow, load_registry
from shared.core.workflows.conditions import ConditionError, holds, parse, to_json
from tests.unit.core.workflows.test_workflows import GOOD, _load, _problems
from tests.unit.harness import BODY, WORKFLOW, AgentSim, drive, make_runtime, post, state, steps

ORDER = {"customerId": "c-1", "currency": "EUR", "total": "1000.01", "priority": "high",
         "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": "1000.01"}]}


@pytest.mark.parametrize(("raw", "expected"), [
    ({"total": {"gt": 1000}}, True),
    ({"total": {"gt": "1000.01"}}, False),
    ({"total": {"gte": 1000.01}}, True),
    ({"total": {"lte": 1000}}, False),
    ({"currency": {"eq": "EUR"}}, True),
    ({"currency": {"ne": "EUR"}}, False),
    ({"priority": {"in": ["high", "normal"]}}, True),
    ({"customerId": {"in": ["c-2"]}}, False),
    ({"items": {"contains": "SKU-1"}}, True),
    ({"items": {"contains": "SKU-2"}}, False),
    ({"all": [{"currency": {"eq": "EUR"}}, {"total": {"gt": 100}}]}, True),
    ({"all": [{"currency": {"eq": "EUR"}}, {"total": {"lt": 100}}]}, False),
    ({"any": [{"currency": {"eq": "USD"}}, {"items": {"contains": "SKU-1"}}]}, True),
    ({"not": {"priority": {"eq": "low"}}}, True),
])
def test_a_condition_holds_or_not_for_the_order(raw: dict[str, Any], expected: bool) -> None:
    condition = parse(raw)
    assert holds(condition, ORDER) is expected
    assert parse(to_json(condition)) == condition  # listed as declared


@pytest.mark.parametrize(("raw", "reason"), [
    ("total > 1000", "must be a mapping with exactly one key"),
    ({"total": {"gt": 1}, "currency": {"eq": "EUR"}}, "exactly one key"),
    ({"weight": {"gt": 1}}, "unknown key 'weight'"),
    ({"total": {"contains": 1}}, "total: unknown comparison 'contains'"),
    ({"total": {"gt": True}}, "total.gt: must be a number"),
    ({"total": {"gt": "lots"}}, "total.gt: must be a number"),
    ({"total": {"gt": "NaN"}}, "must be a finite number"),
    ({"currency": {"in": []}}, "currency.in: must be a non-empty list of strings"),
    ({"currency": {"eq": 1}}, "currency.eq: must be a string"),
    ({"all": []}, "all: must be a non-empty list"),
    ({"not": {"nope": 1}}, "unknown key 'nope'"),
    ({"__import__": {"eq": "os"}}, "unknown key '__import__'"),
])
def test_anything_else_is_refused_with_the_reason(raw: Any, reason: str) -> None:
    with pytest.raises(ConditionError, match=None) as caught:
        parse(raw)
    assert reason in str(caught.value)


def test_a_bad_when_stops_start_up_naming_the_file_and_the_step(tmp_path: Path) -> None:
    bad = GOOD.replace("    compensation: refund\n", "    compensation: refund\n    when: {total: {over: 10}}\n")
    assert _problems(tmp_path, {"order.v1.yaml": bad}) == [
        ("order.v1.yaml", "steps[1].when", "total: unknown comparison 'over' (use eq, ne, gt, gte, lt, lte)")]


def test_a_workflow_whose_every_step_has_a_when_is_refused(tmp_path: Path) -> None:
    both = GOOD.replace("    timeoutSeconds: 30\n", "    timeoutSeconds: 30\n    when: {currency: {eq: EUR}}\n")
    problems = _problems(tmp_path, {"order.v1.yaml": both})
    assert [p[1] for p in problems] == ["steps"] and "at least one must run" in problems[0][2]


def test_a_when_is_loaded_and_listed(tmp_path: Path) -> None:
    text = GOOD.replace("    compensation: refund\n", "    compensation: refund\n    when: {total: {gt: 1000}}\n")
    workflow = _load(tmp_path, {"order.v1.yaml": text}).get("order", 1)
    assert workflow.steps[1].when == parse({"total": {"gt": 1000}})
    assert workflow.to_json()["steps"][1]["when"] == {"total": {"gt": 1000}}
    assert workflow.to_json()["steps"][1]["kind"] == "call"


def runtime(**when: dict[str, Any]) -> Any:
    """order v1 (reserve, charge, ship) with a ``when`` on the named steps."""
    conditioned = tuple(replace(s, when=parse(when[s.name])) if s.name in when else s for s in WORKFLOW)
    return make_runtime(registry=Registry.of([Workflow("order", 1, conditioned), load_registry().get("digital", 1)]))


def test_a_step_whose_when_does_not_hold_is_skipped_never_called() -> None:
    rt = runtime(**{"charge-payment": {"total": {"gt": 1000}}})
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]  # 19.98 EUR
    final = drive(rt, oid, agents)
    assert final["ProcessState"] == "Processed"
    assert [c[2] for c in agents.calls if c[0] == oid] == ["reserve", "ship"]
    assert steps(rt, oid)["charge-payment"]["State"] == "Skipped"
    view = get_order(rt, oid).body
    assert [s["state"] for s in view["steps"]] == ["Done", "Skipped", "Done"]
    assert view["history"][0]["detail"]["skipped"] == ["charge-payment"]
    # an order the condition holds for runs the step
    big = post(rt, {**BODY, "items": [{"sku": "SKU-1", "quantity": 200, "unitPrice": 9.99}]}).body["orderId"]
    drive(rt, big, agents)
    assert [c[2] for c in agents.calls if c[0] == big] == ["reserve", "charge", "ship"]


def test_a_skipped_first_step_lets_the_next_one_start_the_order() -> None:
    rt = runtime(**{"reserve-inventory": {"currency": {"eq": "USD"}}})
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    assert state(rt, oid)["LeaseKey"] == "charge-payment:1"
    drive(rt, oid, agents)
    assert [c[2] for c in agents.calls if c[0] == oid] == ["charge", "ship"]


def test_a_skipped_step_is_not_compensated_and_stays_skipped_in_a_restart() -> None:
    rt = runtime(**{"reserve-inventory": {"currency": {"eq": "USD"}}})
    agents = AgentSim(rt, reject={"create-shipment": "no address"})
    oid = post(rt).body["orderId"]
    final = drive(rt, oid, agents)
    assert (final["Outcome"], final["CompensationState"]) == ("failed", "completed")
    assert [c[2] for c in agents.calls if c[0] == oid] == ["charge", "refund"]
    agents.reject.clear()
    assert retry_order(rt, oid).status == 202  # failed and compensated: restarted as a new generation
    drive(rt, oid, agents)
    assert state(rt, oid)["ProcessState"] == "Processed"
    assert steps(rt, oid)["reserve-inventory"]["State"] == "Skipped"
    assert [c[2] for c in agents.calls if c[0] == oid] == ["charge", "refund", "charge", "ship"]
