"""Workflows as data (issue 13): the loader and each rejection, the registry, the binding of each
order to the workflow (name, version) it started with, per-step policies, and the API."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.agent import AgentRuntime, parse_request
from shared.api.operator import retry_order
from shared.api.orders import get_order, list_workflows
from shared.core.messages import PoisonMessage
from shared.core.statemachine import OrderRow
from shared.core.workflows import (
    AGENTS_BY_NAME,
    Registry,
    Retry,
    Step,
    UnknownWorkflow,
    Workflow,
    WorkflowError,
    load_directory,
    load_registry,
    workflows_directory,
)
from shared.core.workflows.bounds import MAX_STEPS, TRANSACTION_ENTITIES, largest_write
from shared.messaging import MemoryBus
from shared.scheduler import handle_reply
from shared.supervisor import sweep
from tests.unit.harness import (
    BODY,
    WORKFLOW,
    AgentSim,
    Crash,
    deliver_schedules,
    drive,
    make_runtime,
    post,
    state,
    steps,
)

GOOD = """\
name: order
version: 1
description: test
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
"""


def _load(tmp_path: Path, files: dict[str, str]) -> Registry:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return load_directory(tmp_path, AGENTS_BY_NAME)


def _problems(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, str, str]]:
    with pytest.raises(WorkflowError) as caught:
        _load(tmp_path, files)
    return [(p.file, p.path, p.reason) for p in caught.value.problems]


# ------------------------------------------------------------------------------ the shipped files

def test_the_shipped_files_load_and_order_v1_is_todays_workflow() -> None:
    registry = load_registry()
    assert [wf.label for wf in registry.all()] == ["cooling-off v1", "digital v1", "express v1", "order v1",
                                                     "order v2"]
    order = registry.get("order", 1)
    assert [(s.name, s.agent, s.operation, s.timeout_seconds, s.compensation, s.on_failure) for s in order.steps] == [
        ("reserve-inventory", "inventory", "reserve", 30, "release", "compensate"),
        ("charge-payment", "payment", "charge", 30, "refund", "compensate"),
        ("create-shipment", "shipping", "ship", 30, None, "compensate"),
    ]
    assert [s.pivot for s in order.steps] == [False, False, True]
    assert WORKFLOW == order.steps


def test_order_v2_waits_for_approval_over_1000_and_cooling_off_delays_the_shipment() -> None:
    registry = load_registry()
    v2 = registry.latest("order")
    assert v2.version == 2 and [(s.name, s.kind) for s in v2.steps] == [
        ("reserve-inventory", "call"), ("approval", "wait"), ("charge-payment", "call"), ("create-shipment", "call")]
    approval = v2.steps[1]
    assert (approval.event, approval.decision, approval.on_timeout, approval.timeout_seconds) == (
        "approval", "approved", "compensate", 86400)
    assert not approval.runs_for({"total": "1000.00"}) and approval.runs_for({"total": "1000.01"})
    assert [s for s in v2.steps if s.kind == "call"] == [s for s in registry.get("order", 1).steps]
    cooling = registry.get("cooling-off", 1).step("cooling-off")
    assert cooling is not None and (cooling.kind, cooling.until, cooling.delay) == (
        "delay", "createdAt", timedelta(minutes=2))


def test_digital_differs_in_shape_and_policies() -> None:
    digital = load_registry().get("digital", 1)
    assert [(s.name, s.agent, s.operation, s.timeout_seconds, s.compensation, s.on_failure, s.pivot)
            for s in digital.steps] == [
        ("reserve-licence", "inventory", "reserve-licence", 20, "release-licence", "compensate", False),
        ("charge-payment", "payment", "charge", 45, "refund", "compensate", False),
        ("deliver", "delivery", "deliver", 60, None, "hold", True),
    ]
    assert digital.steps[1].retry.max_failure_count == 2


# ------------------------------------------------------------------------------ every rejection

@pytest.mark.parametrize(("text", "path", "reason"), [
    ("name: order\nversion: [1\n", "(line 3, column 1)", "not valid YAML"),
    (GOOD + "name: again\n", "(line 15, column 1)", "duplicate key 'name'"),
    (GOOD + "owner: me\n", "owner", "Extra inputs are not permitted"),
    (GOOD.replace("    compensation: refund\n", "    compensation: refund\n    colour: red\n"), "steps[1].colour",
     "Extra inputs are not permitted"),
    (GOOD.replace("timeoutSeconds: 30\n    compensation: refund", "timeoutSeconds: thirty\n    compensation: refund"),
     "steps[1].timeoutSeconds", "Input should be a valid integer"),
    (GOOD.replace("timeoutSeconds: 30\n    compensation: release", "timeoutSeconds: 0\n    compensation: release"),
     "steps[0].timeoutSeconds", "greater than or equal to 1"),
    (GOOD + "    onFailure: retry\n", "steps[1].onFailure", "Input should be 'compensate' or 'hold'"),
    (GOOD.replace("agent: inventory", "agent: warehouse"), "steps[0].agent", "unknown agent 'warehouse'"),
    (GOOD.replace("name: charge-payment", "name: reserve-inventory"), "steps[1].name",
     "duplicate step name 'reserve-inventory'"),
    (GOOD + "    pivot: true\n", "steps[1]", "a pivot step cannot be undone: it must not have a compensation"),
    (GOOD + "    retry:\n      attempts: 3\n", "steps[1].retry.attempts", "Extra inputs are not permitted"),
    (GOOD + "    retry:\n      maxFailureCount: 0\n", "steps[1].retry.maxFailureCount", "greater than or equal to 1"),
    (GOOD.replace("version: 1", "version: 0"), "version", "greater than or equal to 1"),
    ("name: order\nversion: 1\nsteps: []\n", "steps", "at least 1 item"),
    ("name: Order!\nversion: 1\nsteps: []\n", "name", "should match pattern"),
    ("- just\n- a list\n", "(file)", "Input should be a valid dictionary"),
])
def test_a_broken_file_is_rejected_with_its_path_and_reason(tmp_path: Path, text: str, path: str,
                                                            reason: str) -> None:
    problems = _problems(tmp_path, {"order.v1.yaml": text})
    assert any(f == "order.v1.yaml" and p == path and reason in r for f, p, r in problems), problems


def test_the_file_name_must_match_name_and_version(tmp_path: Path) -> None:
    assert _problems(tmp_path, {"order.v2.yaml": GOOD}) == [
        ("order.v2.yaml", "(file)", "the file name must be order.v1.yaml (its name and version)")]


def test_two_files_of_the_same_name_and_version_are_rejected(tmp_path: Path) -> None:
    assert _problems(tmp_path, {"order.v1.yaml": GOOD, "order.v1.yml": GOOD}) == [
        ("order.v1.yml", "(file)", "order v1 is also declared by order.v1.yaml")]


def test_a_workflow_over_one_transaction_is_rejected(tmp_path: Path) -> None:
    def steps_text(n: int) -> str:
        return "".join(f"  - name: s{i}\n    agent: payment\n    operation: op\n    timeoutSeconds: 5\n"
                        for i in range(n))

    assert largest_write(MAX_STEPS) == TRANSACTION_ENTITIES
    fits = _load(tmp_path, {"big.v1.yaml": f"name: big\nversion: 1\nsteps:\n{steps_text(MAX_STEPS)}"})
    assert len(fits.get("big", 1).steps) == MAX_STEPS
    problems = _problems(tmp_path, {"big.v1.yaml": f"name: big\nversion: 1\nsteps:\n{steps_text(MAX_STEPS + 1)}"})
    assert problems == [("big.v1.yaml", "steps", f"{MAX_STEPS + 1} steps: its largest transaction would write "
                         f"{TRANSACTION_ENTITIES + 1} entities, over the {TRANSACTION_ENTITIES} of one entity-group "
                         f"transaction (at most {MAX_STEPS} steps, each branch of a parallel step counting)")]
    # a parallel step's branches are rows too
    branches = "".join(f"      - name: b{i}\n        agent: payment\n        operation: op\n        timeoutSeconds: 5\n"
                       for i in range(2))
    grouped = f"  - name: g\n    kind: parallel\n    branches:\n{branches}"
    text = f"name: big\nversion: 1\nsteps:\n{steps_text(MAX_STEPS - 1)}{grouped}"
    problems = _problems(tmp_path, {"big.v1.yaml": text})
    assert problems[0][2].startswith(f"{MAX_STEPS + 1} steps")


def test_every_problem_of_every_file_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(WorkflowError) as caught:
        _load(tmp_path, {"a.v1.yaml": GOOD.replace("name: order", "name: a").replace("agent: payment", "agent: x"),
                         "b.v1.yaml": "name: b\nversion: 1\nsteps: []\nextra: 1\n"})
    message = str(caught.value)
    assert message.startswith("invalid workflow files:")
    assert "a.v1.yaml: steps[1].agent: unknown agent 'x'" in message
    assert "b.v1.yaml: steps:" in message and "b.v1.yaml: extra:" in message


def test_an_empty_or_missing_directory_is_rejected(tmp_path: Path) -> None:
    assert _problems(tmp_path, {}) == [(str(tmp_path), "(directory)", "no workflow file (*.yaml)")]
    with pytest.raises(WorkflowError, match="no such directory"):
        load_directory(tmp_path / "nope", AGENTS_BY_NAME)


def test_the_setting_names_a_directory_relative_to_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WorkflowsPath", raising=False)
    assert workflows_directory("") == workflows_directory("workflows") == workflows_directory(None)
    assert workflows_directory(str(tmp_path)) == tmp_path
    monkeypatch.setenv("WorkflowsPath", str(tmp_path))  # the app setting, as the worker sees it
    assert workflows_directory(None) == tmp_path


def test_load_registry_loads_a_directory_once_whatever_names_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every agent request asks for the registry: the same object each time, per directory (not per
    spelling of it), and the process setting is read on each call (a changed setting is obeyed)."""
    monkeypatch.delenv("WorkflowsPath", raising=False)
    shipped = load_registry()
    assert load_registry() is shipped and load_registry("") is shipped and load_registry("workflows") is shipped
    assert load_registry(str(workflows_directory("workflows"))) is shipped
    (tmp_path / "order.v1.yaml").write_text(GOOD)
    monkeypatch.setenv("WorkflowsPath", str(tmp_path))
    mine = load_registry()
    assert mine is not shipped and [wf.label for wf in mine.all()] == ["order v1"]
    assert load_registry() is mine and load_registry(str(tmp_path)) is mine
    (tmp_path / "order.v2.yaml").write_text(GOOD.replace("version: 1", "version: 2"))
    assert load_registry() is mine  # loaded once: a file added later is not seen by this process
    monkeypatch.delenv("WorkflowsPath")
    assert load_registry() is shipped
    with pytest.raises(WorkflowError, match="no such directory"):
        load_registry(str(tmp_path / "nope"))
    with pytest.raises(WorkflowError, match="no such directory"):
        load_registry(str(tmp_path / "nope"))  # a directory that failed is not remembered as loaded


# ------------------------------------------------------------------------------ the registry

def test_registry_versions() -> None:
    one = Workflow("w", 1, (Step("a", "payment", "charge", 5),))
    two = Workflow("w", 2, (Step("b", "payment", "charge", 5),))
    registry = Registry.of([two, one, Workflow("v", 1, one.steps)])
    assert registry.latest("w") is two and registry.get("w", 1) is one
    assert registry.names() == ["v", "w"]
    assert [wf.label for wf in registry.all()] == ["v v1", "w v1", "w v2"]
    with pytest.raises(UnknownWorkflow, match="workflow w v3 is not deployed"):
        registry.get("w", 3)
    with pytest.raises(UnknownWorkflow, match="workflow nope is not deployed"):
        registry.latest("nope")
    with pytest.raises(ValueError, match="declared twice"):
        Registry.of([one, one])


# ------------------------------------------------------------------------------ config and binding

def test_config_binds_to_a_workflow_and_its_policies() -> None:
    rt = make_runtime(registry=load_registry())
    cfg = rt.config
    assert (cfg.workflow_name, cfg.workflow_version) == ("order", 2)  # unbound: the default's highest
    digital = cfg.bound("digital", 1)
    assert [s.name for s in digital.workflow] == ["reserve-licence", "charge-payment", "deliver"]
    assert cfg.bound("order", 2) is cfg
    with pytest.raises(UnknownWorkflow):
        cfg.bound("digital", 9)
    # the index floor covers every workflow: digital's 20 s step is shorter than any of order's
    assert cfg.index_floor() == digital.index_floor() == timedelta(seconds=20)
    charge = digital.spec("charge-payment")
    assert (digital.max_failures_of(charge), cfg.max_failures_of(cfg.spec("charge-payment"))) == (2, 3)
    slow = Step("s", "payment", "charge", 5, retry=Retry(backoff_base_seconds=60))
    assert cfg.backoff(3, slow) == timedelta(seconds=120) and cfg.backoff(3) == timedelta(seconds=10)


def test_an_order_records_and_runs_its_workflow() -> None:
    rt = make_runtime(registry=load_registry())
    agents = AgentSim(rt)
    order = post(rt).body["orderId"]
    digital = post(rt, {**BODY, "workflow": "digital"}).body["orderId"]
    assert drive(rt, order, agents)["ProcessState"] == "Processed"
    assert drive(rt, digital, agents)["ProcessState"] == "Processed"
    ops = {oid: [c[2] for c in agents.calls if c[0] == oid] for oid in (order, digital)}
    assert ops == {order: ["reserve", "charge", "ship"], digital: ["reserve-licence", "charge", "deliver"]}
    assert get_order(rt, digital).body["workflow"] == {"name": "digital", "version": 1}
    assert get_order(rt, order).body["workflow"] == {"name": "order", "version": 2}
    row = rt.store.read_row(digital, "order")
    assert row is not None and (row["Workflow"], row["WorkflowVersion"]) == ("digital", 1)


def test_an_order_row_without_a_workflow_reads_as_order_v1() -> None:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    entity = dict(rt.store.read_row(oid, "order") or {})
    del entity["Workflow"], entity["WorkflowVersion"]
    row = OrderRow.from_entity(entity)
    assert (row.workflow, row.workflow_version) == ("order", 1)


def test_the_step_policy_decides_when_a_timed_out_step_fails() -> None:
    """digital's charge-payment fails at its own maxFailureCount (2), not the settings' (3)."""
    rt = make_runtime(registry=load_registry())
    agents = AgentSim(rt, hang={"charge-payment"})
    oid = post(rt, {**BODY, "workflow": "digital"}).body["orderId"]
    final = drive(rt, oid, agents)
    assert (final["Outcome"], final["FailureCount"], final["FailedStep"]) == ("failed", 2, "charge-payment")
    assert "reached 2" in final["Reason"]


# ------------------------------------------------------------------------------ a version no longer deployed

def _without_digital(rt: Any) -> Any:
    """The same store and bus, after a deployment that dropped digital v1 (unsafe, but survivable)."""
    only_order = Registry.of([load_registry().get("order", 1)])
    return make_runtime(store=rt.store, bus=rt.bus, clock=rt.clock, registry=only_order)


def test_an_order_whose_version_is_gone_is_held_once_with_an_alert() -> None:
    rt = make_runtime(registry=load_registry())
    oid = post(rt, {**BODY, "workflow": "digital"}).body["orderId"]
    gone = _without_digital(rt)
    agents = AgentSim(gone)
    agents.work(gone.clock())
    assert agents.reply_all() == ["held"]
    st = state(gone, oid)
    assert (st["ProcessState"], st["Mode"], st["FailedStep"]) == ("Error", "held", "reserve-licence")
    assert st["Reason"].startswith("workflow digital v1 is not deployed")
    step = steps(gone, oid)["reserve-licence"]
    assert (step["State"], step["OutcomeUnknown"]) == ("Failed", True)
    [alert] = gone.bus.peek("alerts")
    assert alert.body["reason"] == st["Reason"]
    # nothing else moves it, and nothing raises: a duplicate reply, the sweep, a schedule
    writes = gone.store.writes
    gone.clock.advance(600)
    sweep(gone)
    deliver_schedules(gone)
    assert state(gone, oid)["Mode"] == "held" and len(gone.bus.peek("alerts")) == 1
    assert gone.store.writes == writes
    # the operator cannot act on it until the version is back, then it finishes on its own steps
    assert retry_order(gone, oid).status == 409
    assert retry_order(gone, oid).body["type"].endswith("/workflow-not-deployed")
    back = make_runtime(store=rt.store, bus=rt.bus, clock=rt.clock, registry=load_registry())
    assert retry_order(back, oid).status == 202
    assert drive(back, oid, AgentSim(back))["ProcessState"] == "Processed"


# ------------------------------------------------------------------------------ the API

def test_post_names_a_workflow_or_gets_400_naming_the_field() -> None:
    rt = make_runtime(registry=load_registry())
    for bad, message in (("gift", "unknown workflow (loaded: cooling-off, digital, express, order)"),
                         ("Bad Name", "must be a workflow name")):
        r = post(rt, {**BODY, "workflow": bad})
        assert r.status == 400 and r.content_type == "application/problem+json"
        assert [e["field"] for e in r.body["errors"]] == ["workflow"], r.body
        assert message in r.body["errors"][0]["message"]
    assert post(rt, {**BODY, "workflow": None}).status == 202


def test_get_workflows_lists_every_loaded_version() -> None:
    r = list_workflows(make_runtime(registry=load_registry()))
    assert r.status == 200
    listed = {(w["name"], w["version"]): w for w in r.body["workflows"]}
    assert list(listed) == [("cooling-off", 1), ("digital", 1), ("express", 1), ("order", 1), ("order", 2)]
    assert listed[("digital", 1)]["steps"][2] == {"name": "deliver", "kind": "call", "agent": "delivery",
                                                  "timeoutSeconds": 60, "compensation": None, "onFailure": "hold",
                                                  "pivot": True, "when": None}
    assert listed[("order", 2)]["events"] == ["approval"] and listed[("order", 2)]["steps"][1] == {
        "name": "approval", "kind": "wait", "event": "approval", "decision": "approved", "timeoutSeconds": 86400,
        "onTimeout": "compensate", "when": {"total": {"gt": 1000}}}
    assert listed[("cooling-off", 1)]["steps"][2] == {"name": "cooling-off", "kind": "delay",
                                                      "until": {"field": "createdAt", "plus": "PT2M"}, "when": None}
    prepare = listed[("express", 1)]["steps"][0]
    assert (prepare["name"], prepare["kind"], [b["name"] for b in prepare["branches"]]) == (
        "prepare", "parallel", ["reserve-inventory", "charge-payment"])
    assert json.loads(r.encoded())["workflows"][3]["description"].startswith("Physical goods")


def test_a_named_default_hashes_like_an_unnamed_order() -> None:
    rt = make_runtime(registry=load_registry())
    first = post(rt, headers={"Idempotency-Key": "k-1"})
    again = post(rt, {**BODY, "workflow": "order"}, headers={"Idempotency-Key": "k-1"})
    assert (first.status, again.status) == (202, 200)
    other = post(rt, {**BODY, "workflow": "digital"}, headers={"Idempotency-Key": "k-1"})
    assert other.status == 409


# ------------------------------------------------------------------------------ the agent side

def _request(workflow: str, version: int, step: str, operation: str) -> bytes:
    return json.dumps({"kind": "step", "orderId": "o-1", "step": step, "operation": operation, "attempt": 1,
                       "idempotencyKey": f"o-1:{step}", "completeBy": "2030-01-01T00:00:00+00:00",
                       "order": {"customerId": "c"}, "workflow": workflow, "workflowVersion": version}).encode()


def test_the_agent_routes_by_the_requests_workflow() -> None:
    ok = parse_request(_request("digital", 1, "deliver", "deliver"), message_id="m", reply_to="replies",
                       agent="delivery")
    assert (ok.workflow, ok.workflow_version) == ("digital", 1)
    with pytest.raises(PoisonMessage, match="workflow: 'digital' v7 is not deployed"):
        parse_request(_request("digital", 7, "deliver", "deliver"), message_id="m", reply_to="replies",
                      agent="delivery")
    with pytest.raises(PoisonMessage, match="not a workflow step"):
        parse_request(_request("order", 1, "deliver", "deliver"), message_id="m", reply_to="replies",
                      agent="delivery")


def test_the_agent_applies_the_steps_retry_policy(tmp_path: Path) -> None:
    for shipped in workflows_directory().glob("*.yaml"):
        shutil.copy(shipped, tmp_path)
    text = (tmp_path / "digital.v1.yaml").read_text()
    (tmp_path / "digital.v1.yaml").write_text(text.replace(
        "    retry:\n      maxFailureCount: 2\n",
        "    retry:\n      maxFailureCount: 2\n      agentAttempts: 3\n      agentBackoffSeconds: 0.5\n"))
    agent = AgentRuntime("payment", "http://payment.invalid", MemoryBus(),
                         workflow=load_directory(tmp_path, AGENTS_BY_NAME))
    request = parse_request(_request("digital", 1, "charge-payment", "charge"), message_id="m", reply_to="r",
                            agent="payment", workflow=agent.workflow)
    policy = agent.policy_for(request)
    assert (policy.max_attempts, policy.initial_backoff) == (3, 0.5)
    plain = parse_request(_request("order", 1, "charge-payment", "charge"), message_id="m", reply_to="r",
                          agent="payment", workflow=agent.workflow)
    assert agent.policy_for(plain) == agent.policy  # no retry block: the agent's own constants


@pytest.mark.parametrize("crash_after", range(7))
def test_a_crash_while_holding_for_a_missing_version_converges(crash_after: int) -> None:
    """The hold is one decision like any other: cut after any effect, a redelivered reply and a
    sweep leave the order held once, one alert, one held event, its search rows right and no
    deadline row."""
    rt = make_runtime(registry=load_registry())
    oid = post(rt, {**BODY, "workflow": "digital"}).body["orderId"]
    gone = _without_digital(rt)
    agents = AgentSim(gone)
    agents.work(gone.clock())
    [reply] = agents.pending_replies
    body = json.dumps(reply.body).encode()
    gone.crash_at = crash_after
    try:
        handle_reply(gone, body, message_id=reply.message_id)
    except Crash:
        pass
    gone.crash_at = None
    assert handle_reply(gone, body, message_id=reply.message_id) in ("held", "workflow-unknown")
    gone.clock.advance(600)
    sweep(gone)
    st = state(gone, oid)
    assert (st["ProcessState"], st["Mode"], st["Outcome"]) == ("Error", "held", "held")
    assert len(gone.bus.peek("alerts")) == 1
    events = [r.event for r in gone.store.read_history(oid, 0, 100)]
    assert events.count("held") == 1
    assert [r for r in gone.store.index_rows() if r["OrderId"] == oid] == []
    assert get_order(gone, oid).body["category"] == "attention"


def test_a_compensating_order_whose_version_is_gone_stops_and_a_retry_redrives_its_compensations() -> None:
    rt = make_runtime(registry=load_registry())
    oid = post(rt, {**BODY, "workflow": "digital"}).body["orderId"]
    sim = AgentSim(rt, reject={"charge-payment": "declined"})
    drive(rt, oid, sim, until=lambda st: st.get("Mode") == "compensate" and bool(st.get("LockedBy")))
    gone = _without_digital(rt)
    agents = AgentSim(gone)
    agents.effects, agents.calls = sim.effects, sim.calls
    agents.work(gone.clock())
    assert agents.reply_all() == ["compensation-stopped"]
    st = state(gone, oid)
    assert (st["Mode"], st["CompensationState"], st.get("LockedBy")) == ("finished", "failed", None)
    assert steps(gone, oid)["reserve-licence"]["Compensation"] == "Failed"
    assert get_order(gone, oid).body["category"] == "attention"
    assert len(gone.bus.peek("alerts")) == 2  # the declined charge, then the stop
    back = make_runtime(store=rt.store, bus=rt.bus, clock=rt.clock, registry=load_registry())
    assert retry_order(back, oid).body["result"] == "compensation-redriven"
    served = AgentSim(back)
    served.effects, served.calls = sim.effects, sim.calls  # the same remote services
    final = drive(back, oid, served)
    assert (final["Mode"], final["CompensationState"], final["Outcome"]) == ("finished", "completed", "failed")
    assert [c[2] for c in served.calls if c[0] == oid] == ["reserve-licence", "release-licence"]
