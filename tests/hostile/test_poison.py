"""Poison messages on every queue the app consumes, through the real host with the app.

Queues: the scheduler queue, the replies queue and each agent queue (from shared.core.workflows).
Kinds: bad JSON, a wrong schema, an unknown order, an unknown step, a stale attempt (what each
means on each queue is in ``poison_messages``). All are sent at once to the session stack,
then a normal order is submitted after them. Required (issue 5):

* none changes state: the rows of a finished reference order (ETags included) are unchanged,
  no row appears for any other order than the normal one, and the remote services' ledger
  gains no effect for any poison message;
* none causes a crash loop: the host instance is the same process, the normal order submitted
  after the poison is Processed, and no poison message is still being redelivered;
* each ends in its queue's dead-letter queue with a reason (at once, or after MaxDeliveryCount
  with MaxDeliveryCountExceeded), within POISON_WAIT seconds.
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
FINDING_UNKNOWN_ORDER = ("finding 7: an agent request for an order that does not exist (valid schema) is executed "
                         "against the remote service and replied to (shared/agent/__init__.py never consults the state "
                         "store), so it is neither refused nor dead-lettered")


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
                        found[m.message_id] = {"reason": m.dead_letter_reason,
                                               "description": m.dead_letter_error_description,
                                               "deliveryCount": m.delivery_count}
                    dlq.complete_message(m)


def _active(client: Any, queues: set[str], ids: set[str]) -> list[str]:
    out = []
    for queue in queues:
        with client.get_queue_receiver(queue) as r:
            out += [m.message_id for m in r.peek_messages(max_message_count=250) if m.message_id in ids]
    return out


def _host_pids(stack: Any) -> dict[str, int]:
    """Instance id -> pid, from the host's /admin/host/status (one instance in this stack)."""
    from tests.hostile.stackutil import raw_request

    out = {}
    for _ in range(3):
        doc = raw_request(stack.base_url, "GET", "/admin/host/status").json()
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


@pytest.mark.xfail(strict=True, reason=FINDING_UNKNOWN_ORDER)
def test_request_for_an_unknown_order_causes_no_remote_effect(poison_run: PoisonRun) -> None:
    unknown = _unknown_orders(poison_run)
    assert [e for e in poison_run.new_effects if e["orderId"] in unknown] == []


def test_poison_causes_no_crash_loop(poison_run: PoisonRun) -> None:
    assert poison_run.normal_state == "Processed"
    assert poison_run.host_pids_before
    assert poison_run.host_pids_after == poison_run.host_pids_before  # no instance died and restarted
    assert poison_run.still_active == []  # nothing is redelivered forever


FINDING_NOT_POISON = ("finding 8: a stale or no-op message (stale attempt/seq, a schedule message naming a step, an "
                      "agent request past completeBy) is accepted as a no-op and completed, not dead-lettered; "
                      "issue 5 lists 'a stale attempt' among the messages to dead-letter with a reason")
# What the current app does not dead-letter (strict: an unexpected pass fails, so un-xfail it).
NOT_DEAD_LETTERED = {
    "scheduler/unknown-step": FINDING_NOT_POISON,
    "scheduler/stale-attempt": FINDING_NOT_POISON,
    "replies/stale-attempt": FINDING_NOT_POISON,
    **{f"agent:{a.name}/stale-attempt": FINDING_NOT_POISON for a in AGENTS},
    **{f"agent:{a.name}/unknown-order": FINDING_UNKNOWN_ORDER for a in AGENTS},
}


def _labels() -> list[Any]:
    queues = ["scheduler", "replies", *(f"agent:{a.name}" for a in AGENTS)]
    labels = [f"{q}/{k}" for q in queues for k in KINDS]
    return [pytest.param(x, marks=pytest.mark.xfail(strict=True, reason=NOT_DEAD_LETTERED[x]))
            if x in NOT_DEAD_LETTERED else x for x in labels]


@pytest.mark.parametrize("label", _labels())
def test_poison_is_dead_lettered_with_a_reason(poison_run: PoisonRun, hostile_stack: Any, label: str) -> None:
    role, kind = label.split("/")
    queue = _queues(hostile_stack.settings)[role]
    p = next(p for p in poison_run.poison if p.queue == queue and p.kind == kind)
    got = poison_run.dead_lettered.get(p.message_id)
    assert got is not None, f"{label} ({p.message_id}) not in {queue}/$DeadLetterQueue after {POISON_WAIT}s"
    assert got["reason"], got


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
