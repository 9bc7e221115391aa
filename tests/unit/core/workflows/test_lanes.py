"""Priority lanes (workflows/lanes.json, shared/core/workflows/lanes.py): every message the core sends for an
order goes on its priority's lane, and every function handles a message from any lane alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from azure.functions.servicebus import ServiceBusMessage

import functions.scheduler as sched_fn
from shared.api.operator import cancel_order, retry_order, terminate_order
from shared.core.messages import OutMessage
from shared.core.workflows.lanes import (
    DEFAULT_LANE,
    FAST_LANES,
    LANED_QUEUES,
    LANES,
    LanesError,
    lane_of,
    load_lanes,
    with_lane_queues,
)
from shared.supervisor import sweep
from tests.unit.core.statemachine.test_statemachine import HOLD_WORKFLOW
from tests.unit.functions.test_settlement import RecordingActions
from tests.unit.harness import BODY, WORKFLOW, AgentSim, drive, make_runtime, post, state, steps

# The work queues of each lane, as the settings name them by default.
NORMAL_QUEUES = {q for _, q in LANED_QUEUES}
HIGH_QUEUES = {f"{q}-high" for _, q in LANED_QUEUES}
NOT_WORK = {"alerts", "order-status"}


def recorded(rt: Any) -> list[OutMessage]:
    """Every message ``rt`` sends from now on (the bus still gets them)."""
    sent: list[OutMessage] = []
    send = rt.bus.send

    def recording(message: OutMessage) -> None:
        sent.append(message)
        send(message)

    rt.bus.send = recording
    return sent


def work_queues(sent: list[OutMessage]) -> set[str]:
    """The queues the messages went to, and the replies queues they asked for."""
    return {m.queue for m in sent if m.queue not in NOT_WORK} | {m.reply_to for m in sent if m.reply_to}


def new_order(rt: Any, priority: str | None, **fields: Any) -> str:
    body = {**BODY, "priority": priority, **fields}
    r = post(rt, body)
    assert r.status == 202, r.body
    return str(r.body["orderId"])


# --- the declaration -----------------------------------------------------------------------------


def test_the_declared_lanes() -> None:
    assert [(lane.name, lane.priorities, lane.default) for lane in LANES] == [
        ("normal", ("normal", "low"), True), ("high", ("high",), False)]
    assert lane_of("high").name == "high"
    assert lane_of("normal") is lane_of("low") is DEFAULT_LANE  # low shares normal's lane
    # an order row from before priorities were read, or anything unknown: the default lane
    assert lane_of(None) is lane_of("") is lane_of("urgent") is DEFAULT_LANE
    high = lane_of("high")
    assert (high.setting("SchedulerQueue"), high.queue("scheduler"), high.function("scheduler")) == (
        "SchedulerQueueHigh", "scheduler-high", "scheduler_high")
    assert (DEFAULT_LANE.setting("SchedulerQueue"), DEFAULT_LANE.queue("scheduler")) == ("SchedulerQueue", "scheduler")


@pytest.mark.parametrize(("text", "reason"), [
    ('{"lanes": [{"name": "normal", "priorities": ["normal", "low"]}]}', "exactly one lane"),
    ('{"lanes": [{"name": "normal", "priorities": ["normal", "low", "high"]}, '
     '{"name": "high", "priorities": ["high"]}]}', "exactly one lane"),
    ('{"lanes": [{"name": "a", "priorities": ["normal", "low"]}, {"name": "a", "priorities": ["high"]}]}', "twice"),
    ('{"lanes": [{"name": "High", "priorities": ["normal", "low", "high"]}]}', "pattern"),
    ("not json", "lanes.json"),
])
def test_a_broken_declaration_stops_the_start(tmp_path: Path, text: str, reason: str) -> None:
    file = tmp_path / "lanes.json"
    file.write_text(text)
    with pytest.raises(LanesError, match=reason):
        load_lanes(file)


def test_the_emulator_config_gets_a_copy_of_every_work_queue_per_fast_lane() -> None:
    props = {"MaxDeliveryCount": 10, "LockDuration": "PT30S"}
    config = {"UserConfig": {"Namespaces": [{"Name": "ns", "Queues": [
        {"Name": "scheduler", "Properties": props}, {"Name": "alerts", "Properties": {"MaxDeliveryCount": 3}},
        {"Name": "agent-payment", "Properties": {"MaxDeliveryCount": 7}}]}]}}
    queues = {q["Name"]: q["Properties"] for q in with_lane_queues(config)["UserConfig"]["Namespaces"][0]["Queues"]}
    assert queues == {"scheduler": props, "alerts": {"MaxDeliveryCount": 3}, "agent-payment": {"MaxDeliveryCount": 7},
                      "scheduler-high": props, "agent-payment-high": {"MaxDeliveryCount": 7}}
    assert config["UserConfig"]["Namespaces"][0]["Queues"][-1]["Name"] == "agent-payment"  # not changed in place
    assert len(FAST_LANES) == 1


# --- the core sends on the order's lane ------------------------------------------------------------


@pytest.mark.parametrize(("priority", "inventory", "replies"), [
    ("high", "agent-inventory-high", "replies-high"),
    ("normal", "agent-inventory", "replies"),
    ("low", "agent-inventory", "replies"),
    (None, "agent-inventory", "replies"),  # the contract's default priority is normal
])
def test_the_submission_sends_the_first_request_on_the_orders_lane(priority: str | None, inventory: str,
                                                                   replies: str) -> None:
    rt = make_runtime()
    sent = recorded(rt)
    new_order(rt, priority)
    [request] = [m for m in sent if m.queue not in NOT_WORK]
    assert (request.queue, request.reply_to) == (inventory, replies)


@pytest.mark.parametrize("priority", ["high", "normal", "low"])
def test_every_message_of_an_order_stays_on_its_lane(priority: str) -> None:
    """Forward steps, replies, and a rejection's compensations."""
    for reject in ({}, {"charge-payment": "card declined"}):
        rt = make_runtime()
        sent = recorded(rt)
        oid = new_order(rt, priority)
        st = drive(rt, oid, AgentSim(rt, reject=dict(reject)))
        assert st["ProcessState"] == ("Error" if reject else "Processed"), st
        lane = HIGH_QUEUES if priority == "high" else NORMAL_QUEUES
        assert work_queues(sent) <= lane, work_queues(sent)
        if reject:  # the release went on the lane too
            assert [m.queue for m in sent if m.subject == "compensation"] == [
                "agent-inventory-high" if priority == "high" else "agent-inventory"]


def test_a_supervisor_redrive_goes_to_the_high_scheduler_queue() -> None:
    rt = make_runtime()
    rt.bus.fail.add("agent-inventory-high")  # the first request is lost
    oid = new_order(rt, "high")
    rt.bus.fail.clear()
    sent = recorded(rt)
    rt.clock.advance(31)
    assert sweep(rt).acted == {"redriven": 1}
    assert [m.queue for m in sent if m.subject == "schedule"] == ["scheduler-high"]
    assert drive(rt, oid, AgentSim(rt))["ProcessState"] == "Processed"
    assert work_queues(sent) <= HIGH_QUEUES, work_queues(sent)


@pytest.mark.parametrize("action", ["retry", "cancel"])
def test_operator_actions_on_a_held_high_order_stay_on_its_lane(action: str) -> None:
    rt = make_runtime(workflow=HOLD_WORKFLOW)
    oid = new_order(rt, "high")
    agents = AgentSim(rt, reject={"charge-payment": "card declined"})
    assert drive(rt, oid, agents)["Mode"] == "held"
    agents.reject.clear()
    sent = recorded(rt)
    r = (retry_order if action == "retry" else cancel_order)(rt, oid)
    assert r.status == 202, r.body
    assert [m.queue for m in sent if m.subject == "schedule"] == ["scheduler-high"]
    st = drive(rt, oid, agents)
    assert st["Outcome"] == ("processed" if action == "retry" else "cancelled"), st
    assert work_queues(sent) <= HIGH_QUEUES, work_queues(sent)


def test_terminate_of_a_high_order_compensates_on_its_lane() -> None:
    rt = make_runtime(workflow=WORKFLOW)
    agents = AgentSim(rt)
    oid = new_order(rt, "high")
    drive(rt, oid, agents, until=lambda st: st.get("LeaseKey") == "charge-payment:1")
    sent = recorded(rt)
    assert terminate_order(rt, oid).status == 202
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("terminated", "completed")
    assert {m.queue for m in sent if m.subject == "compensation"} == {"agent-payment-high", "agent-inventory-high"}
    assert work_queues(sent) <= HIGH_QUEUES, work_queues(sent)


# --- any function takes a message from any lane ---------------------------------------------------------


def _sb(message: OutMessage) -> ServiceBusMessage:
    return ServiceBusMessage(body=json.dumps(message.body).encode(), message_id=message.message_id,
                             application_properties={}, user_properties={})


def test_a_message_on_the_wrong_lane_is_handled_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A high order's reply read by the normal lane's replies function (or sent before lanes
    existed, to ``replies``), and a normal order's by the high lane's: the same transitions."""
    rt = make_runtime()
    monkeypatch.setattr(sched_fn, "get_runtime", lambda: rt)
    agents = AgentSim(rt)
    high, normal = new_order(rt, "high"), new_order(rt, "normal")
    agents.work(rt.clock())
    replies = {m.body["orderId"]: m for m in agents.pending_replies}
    assert {m.queue for m in replies.values()} == {"replies-high", "replies"}
    agents.pending_replies.clear()
    actions = RecordingActions()
    sched_fn.FUNCTIONS["scheduler_replies"]._function.get_user_function()(_sb(replies[high]), actions)
    sched_fn.FUNCTIONS["scheduler_replies_high"]._function.get_user_function()(_sb(replies[normal]), actions)
    assert actions.actions == []  # neither is poison; the host completes both
    for oid, next_queue in ((high, "agent-payment-high"), (normal, "agent-payment")):
        assert steps(rt, oid)["reserve-inventory"]["State"] == "Done"
        assert state(rt, oid)["LeaseKey"] == "charge-payment:1"
        # the next request still goes on the order's own lane, whichever lane the reply came by
        assert [m.body["orderId"] for m in rt.bus.peek(next_queue)] == [oid]
