"""Poison messages on every queue the app consumes, through the real host with the app.

Queues: the scheduler queue, the replies queue and each agent queue (from shared.core.workflows).
Kinds: bad JSON, a wrong schema, an unknown order, an unknown step, a stale attempt (what each
means on each queue is in ``poison_messages``). All are sent at once to the session stack,
then a normal order is submitted after them. Required (issue 5; issue 30, deliverable 5):

* none changes state: the rows of a finished reference order (ETags included) are unchanged,
  no row appears for any other order than the normal one, and the remote services' ledger
  gains no effect for any poison message (an agent request for an unknown order included);
* none causes a crash loop: the host instance is the same process, the normal order submitted
  after the poison is Processed, and no poison message is still being redelivered;
* each poison message ends in its queue's dead-letter queue at its FIRST delivery, with the
  specific reason of ``EXPECTED_REASON`` and a description, within POISON_WAIT seconds;
* a stale schedule notice (scheduler/stale-attempt) and a late reply of a finished attempt
  (replies/stale-attempt) are not poison: normal at-least-once traffic, completed quietly with
  their logged verdict, never dead-lettered (``STALE_NOT_POISON``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.core.workflows import AGENTS, load_registry
from tests.hostile.stackutil import Tables, submit, wait_settled
from tests.unit.harness import WORKFLOW

pytestmark = pytest.mark.integration

POISON_WAIT = float(os.environ.get("POISON_WAIT", "30"))
KINDS = ("bad-json", "wrong-schema", "unknown-order", "unknown-step", "stale-attempt")


@dataclass
class Poison:
    queue: str
    kind: str
    body: bytes
    message_id: str
    reply_to: str | None = None
    order_id: str | None = None

    @property
    def label(self) -> str:
        return f"{self.queue}-{self.kind}"


@dataclass
class PoisonRun:
    poison: list[Poison]
    ref: str
    ref_before: dict[str, Any]
    ref_after: dict[str, Any]
    normal: str | None
    normal_state: str | None
    new_state_rows: list[tuple[str, str]]
    new_deadline_orders: list[str]
    new_effects: list[dict[str, Any]]
    dead_lettered: dict[str, dict[str, Any]] = field(default_factory=dict)  # message_id -> reason, description
    still_active: list[str] = field(default_factory=list)
    host_pids_before: dict[str, int] = field(default_factory=dict)
    host_pids_after: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="microseconds")


def _queues(settings: dict[str, str]) -> dict[str, str]:
    """role -> queue name: scheduler, replies, and one per agent."""
    out = {"scheduler": settings["SchedulerQueue"], "replies": settings["RepliesQueue"]}
    for agent in AGENTS:
        out[f"agent:{agent.name}"] = settings[agent.queue_setting]
    return out


def poison_messages(settings: dict[str, str], ref: str) -> list[Poison]:
    """Every poison kind on every consumed queue. ``ref`` is a finished order."""
    q = _queues(settings)
    replies = q["replies"]
    unknown = uuid.uuid4().hex
    future = _iso(datetime.now(UTC) + timedelta(minutes=10))
    past = _iso(datetime.now(UTC) - timedelta(minutes=10))
    order = {"customerId": "c-1", "currency": "EUR", "total": "19.98",
             "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}]}
    out: list[Poison] = []

    def add(role: str, kind: str, body: Any, reply_to: str | None = None, order_id: str | None = None) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        out.append(Poison(q[role], kind, raw, f"poison-{kind}-{uuid.uuid4().hex[:12]}", reply_to, order_id))

    # scheduler: {"kind": "schedule", "orderId", "seq"}; a schedule message names no step, so
    # its "unknown step" is a step-shaped message (a request for a step the workflow lacks).
    add("scheduler", "bad-json", b'{"kind": "schedule", "orderId": ')
    add("scheduler", "wrong-schema", {"kind": "schedule", "orderId": 12345, "seq": "zero"})
    add("scheduler", "unknown-order", {"kind": "schedule", "orderId": unknown, "seq": 0}, order_id=unknown)
    add("scheduler", "unknown-step", {"kind": "schedule", "orderId": ref, "seq": 0, "step": "no-such-step"},
        order_id=ref)
    add("scheduler", "stale-attempt", {"kind": "schedule", "orderId": ref, "seq": 0}, order_id=ref)
    # replies: a finished order's step replied to again (attempt 1, now with an error) is stale.
    reply = {"kind": "step", "orderId": ref, "step": WORKFLOW[1].name, "attempt": 1, "outcome": "success",
             "result": {"paymentId": "forged"}, "reason": None}
    add("replies", "bad-json", b"\xff\xfe not json")
    add("replies", "wrong-schema", {**reply, "attempt": "one", "outcome": "maybe"})
    add("replies", "unknown-order", {**reply, "orderId": unknown}, order_id=unknown)
    add("replies", "unknown-step", {**reply, "step": "no-such-step"}, order_id=ref)
    add("replies", "stale-attempt", {**reply, "outcome": "error", "result": None, "reason": "late"}, order_id=ref)
    for agent in AGENTS:
        role = f"agent:{agent.name}"
        # a step the agent serves: of order v1, else of another loaded workflow (delivery: digital's)
        registry = load_registry()
        wf, step = next((wf, s) for wf in (registry.get("order", 1), *registry.all()) for s in wf.steps
                        if s.agent == agent.name)
        req = {"kind": "step", "orderId": ref, "step": step.name, "operation": step.operation, "attempt": 1,
               "idempotencyKey": f"{ref}:{step.name}", "completeBy": future, "order": order, "context": {},
               "workflow": wf.name, "workflowVersion": wf.version}
        add(role, "bad-json", b"[1, 2,", reply_to=replies)
        add(role, "wrong-schema", {**req, "attempt": 0, "completeBy": "tomorrow", "order": "x"}, reply_to=replies)
        add(role, "unknown-order", {**req, "orderId": unknown, "idempotencyKey": f"{unknown}:{step.name}"},
            reply_to=replies, order_id=unknown)
        add(role, "unknown-step", {**req, "step": "no-such-step", "operation": "steal"}, reply_to=replies,
            order_id=ref)
        add(role, "stale-attempt", {**req, "completeBy": past}, reply_to=replies, order_id=ref)
    return out


def _send(client: Any, poison: list[Poison]) -> None:
    from azure.servicebus import ServiceBusMessage

    by_queue: dict[str, list[Poison]] = {}
    for p in poison:
        by_queue.setdefault(p.queue, []).append(p)
    for queue, items in by_queue.items():
        with client.get_queue_sender(queue) as sender:
            for p in items:
                sender.send_messages(ServiceBusMessage(p.body, message_id=p.message_id, reply_to=p.reply_to,
                                                       correlation_id=p.message_id,
                                                       application_properties={"poisonTest": p.kind}))


def _drain_dead_letters(client: Any, queues: set[str], ids: set[str], found: dict[str, dict[str, Any]]) -> None:
    from azure.servicebus import ServiceBusSubQueue

    for queue in queues:
        with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=1) as dlq:
            while True:
                batch = dlq.receive_messages(max_message_count=50, max_wait_time=1)
                if not batch:
                    break
                for m in batch:
                    if m.message_id in ids:
                        # deliveryCount as Functions and the .NET SDK count it (1 = the first
                        # delivery); the Python SDK gives the AMQP header's prior deliveries
                        found[m.message_id] = {"reason": m.dead_letter_reason,
                                               "description": m.dead_letter_error_description,
                                               "deliveryCount": m.delivery_count + 1}
                    dlq.complete_message(m)


def _active(client: Any, queues: set[str], ids: set[str]) -> list[str]:
    out = []
    for queue in queues:
        with client.get_queue_receiver(queue) as r:
            out += [m.message_id for m in r.peek_messages(max_message_count=250) if m.message_id in ids]
    return out


def _host_pids(stack: Any) -> dict[str, int]:
    """Instance id -> pid, from the host's /admin/host/status (one instance in this stack)."""
    from tests.hostile.stackutil import send

    out = {}
    for _ in range(3):
        doc = send(stack, "GET", "/admin/host/status").json()  # the master key's
        out[str(doc["id"])] = int(doc["pid"])
    return out


@pytest.fixture(scope="module")
def poison_run(hostile_stack: Any, tables: Tables) -> PoisonRun:
    from azure.servicebus import ServiceBusClient

    stack = hostile_stack
    ref = submit(stack, key=f"poison-ref-{uuid.uuid4().hex}")
    ref_before = wait_settled(tables, ref)
    assert ref_before["state"]["ProcessState"] == "Processed"
    time.sleep(1.0)  # let the index's lazy deletes of the reference order land
    before = tables.snapshot()
    ledger_before = {(e["service"], e["idempotencyKey"], e["operation"]) for e in stack.remotes.ledger()}
    pids_before = _host_pids(stack)
    poison = poison_messages(stack.settings, ref)
    ids = {p.message_id for p in poison}
    queues = {p.queue for p in poison}
    t0 = time.monotonic()
    found: dict[str, dict[str, Any]] = {}
    with ServiceBusClient.from_connection_string(stack.servicebus_connection_string) as client:
        _send(client, poison)
        normal = submit(stack, key=f"poison-normal-{uuid.uuid4().hex}")  # must be processed despite the poison
        normal_rows = wait_settled(tables, normal, timeout=POISON_WAIT + 60)
        deadline = time.monotonic() + POISON_WAIT
        while True:
            # Settled for good: dead-lettered, or gone from the queue (completed). Peek first,
            # then drain, so a message moving to the DLQ in between is still seen.
            active = set(_active(client, queues, ids))
            _drain_dead_letters(client, queues, ids, found)
            if not active or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        still = _active(client, queues, ids)
    seconds = time.monotonic() - t0
    ref_after = tables.partition(ref)
    after = tables.snapshot()
    diff = before.new_rows(after)
    ledger_after = stack.remotes.ledger()
    new_effects = [e for e in ledger_after
                   if (e["service"], e["idempotencyKey"], e["operation"]) not in ledger_before
                   and e["orderId"] != normal]
    return PoisonRun(poison=poison, ref=ref, ref_before=ref_before, ref_after=ref_after, normal=normal,
                     normal_state=normal_rows["state"]["ProcessState"],
                     new_state_rows=[k for k in diff["state"] if k[0] != normal],
                     new_deadline_orders=[o for o in diff["deadlineOrders"] if o != normal],
                     new_effects=new_effects, dead_lettered=found, still_active=still,
                     host_pids_before=pids_before, host_pids_after=_host_pids(stack), seconds=seconds)


def test_poison_changes_no_state(poison_run: PoisonRun) -> None:
    assert poison_run.ref_after == poison_run.ref_before  # every row, ETags included
    assert poison_run.new_state_rows == []
    assert poison_run.new_deadline_orders == []


def _unknown_orders(run: PoisonRun) -> set[str]:
    return {p.order_id for p in run.poison if p.kind == "unknown-order" and p.order_id}


def test_poison_causes_no_remote_effect(poison_run: PoisonRun) -> None:
    """No poison message reaches a remote service (bad JSON, wrong schema, unknown step, stale)."""
    unknown = _unknown_orders(poison_run)
    assert [e for e in poison_run.new_effects if e["orderId"] not in unknown] == []


def test_request_for_an_unknown_order_causes_no_remote_effect(poison_run: PoisonRun) -> None:
    unknown = _unknown_orders(poison_run)
    assert [e for e in poison_run.new_effects if e["orderId"] in unknown] == []


def test_poison_causes_no_crash_loop(poison_run: PoisonRun) -> None:
    assert poison_run.normal_state == "Processed"
    assert poison_run.host_pids_before
    assert poison_run.host_pids_after == poison_run.host_pids_before  # no instance died and restarted
    assert poison_run.still_active == []  # nothing is redelivered forever


# The dead-letter reason of each poison message (shared/core/messages/sending.py PoisonMessage, docs/reliability.md).
EXPECTED_REASON = {
    "scheduler/bad-json": "InvalidJson",
    "scheduler/wrong-schema": "SchemaViolation",
    "scheduler/unknown-order": "UnknownOrder",
    "scheduler/unknown-step": "SchemaViolation",  # a schedule notice names no step: a "step" field is not its schema
    "replies/bad-json": "InvalidJson",
    "replies/wrong-schema": "SchemaViolation",
    "replies/unknown-order": "UnknownOrder",
    "replies/unknown-step": "UnknownStep",
    **{f"agent:{a.name}/{kind}": reason for a in AGENTS for kind, reason in (
        ("bad-json", "InvalidJson"), ("wrong-schema", "SchemaViolation"), ("unknown-order", "UnknownOrder"),
        ("unknown-step", "UnknownStep"),
        # a finished order's step, past completeBy: the order has no such attempt in flight
        ("stale-attempt", "StepNotInFlight"))},
}
# Not poison (docs/reliability.md, "Poison messages"): under at-least-once delivery a schedule notice
# can arrive after its order was claimed or finished, and a reply after its attempt was superseded (a
# redrive, a timeout) or its order finished. Each is decided against the order's rows, changes nothing
# (``test_poison_changes_no_state``) and is completed with its verdict logged (stale / lost race).
# Dead-lettering them would fill the dead-letter queue with the ordinary noise of every redrive and
# duplicate, and the alert with it. (Agent requests are different: a stale copy is refused before it
# can reach a remote service, and the dead-letter queue keeps it with StepNotInFlight.)
STALE_NOT_POISON = ("scheduler/stale-attempt", "replies/stale-attempt")


def _labels() -> list[str]:
    queues = ["scheduler", "replies", *(f"agent:{a.name}" for a in AGENTS)]
    return [f"{q}/{k}" for q in queues for k in KINDS if f"{q}/{k}" not in STALE_NOT_POISON]


def _poison(run: PoisonRun, stack: Any, label: str) -> Poison:
    role, kind = label.split("/")
    queue = _queues(stack.settings)[role]
    return next(p for p in run.poison if p.queue == queue and p.kind == kind)


@pytest.mark.parametrize("label", _labels())
def test_poison_is_dead_lettered_with_a_reason(poison_run: PoisonRun, hostile_stack: Any, label: str) -> None:
    p = _poison(poison_run, hostile_stack, label)
    got = poison_run.dead_lettered.get(p.message_id)
    assert got is not None, f"{label} ({p.message_id}) not in {p.queue}/$DeadLetterQueue after {POISON_WAIT}s"
    assert got["reason"] == EXPECTED_REASON[label], got
    assert got["description"], got  # names the problem
    assert got["deliveryCount"] == 1, got  # at its first delivery, never redelivered


@pytest.mark.parametrize("label", STALE_NOT_POISON)
def test_stale_traffic_is_completed_not_dead_lettered(poison_run: PoisonRun, hostile_stack: Any, label: str) -> None:
    """The documented contract for at-least-once leftovers (see ``STALE_NOT_POISON``): completed
    (gone from the queue), not dead-lettered, and no state change (``test_poison_changes_no_state``)."""
    p = _poison(poison_run, hostile_stack, label)
    assert p.message_id not in poison_run.dead_lettered, poison_run.dead_lettered[p.message_id]
    assert p.message_id not in poison_run.still_active


def test_every_label_is_either_poison_or_stale_traffic() -> None:
    queues = ["scheduler", "replies", *(f"agent:{a.name}" for a in AGENTS)]
    assert sorted([*_labels(), *STALE_NOT_POISON]) == sorted(f"{q}/{k}" for q in queues for k in KINDS)
    assert set(_labels()) == set(EXPECTED_REASON)


def test_dead_letter_detection_works(hostile_stack: Any) -> None:
    """The detection above finds a message that IS dead-lettered with a reason (on the alerts
    queue, which the app does not consume), so an empty result means 'not dead-lettered'."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    queue = hostile_stack.settings["AlertsQueue"]
    mid = f"dlq-probe-{uuid.uuid4().hex[:12]}"
    found: dict[str, dict[str, Any]] = {}
    with ServiceBusClient.from_connection_string(hostile_stack.servicebus_connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"{}", message_id=mid))
        with client.get_queue_receiver(queue, max_wait_time=5) as r:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                msgs = r.receive_messages(max_message_count=50, max_wait_time=2)
                for m in msgs:
                    if m.message_id == mid:
                        r.dead_letter_message(m, reason="PoisonMessage", error_description="probe")
                        deadline = 0
                    else:
                        r.abandon_message(m)
        _drain_dead_letters(client, {queue}, {mid}, found)
    assert found.get(mid, {}).get("reason") == "PoisonMessage", found
