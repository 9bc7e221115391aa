"""The core against real Table Storage (Azurite): submission, races, recovery, compensation,
operator actions. The agents' side is played by hand (tests/unit/harness.AgentSim); messages
go through the in-memory bus here (the Service Bus emulator tests are in test_servicebus.py)."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import Any

import pytest

from shared.api.operator import cancel_order, retry_order
from shared.api.orders import get_order
from shared.core.effects import Transact
from shared.core.orders import order_id_for_key
from shared.core.rows import Op
from shared.core.statemachine import View, plan_submission
from shared.scheduler import handle_reply, handle_schedule
from shared.supervisor import sweep
from tests.integration.conftest import BarrierStore
from tests.unit.harness import (
    BODY,
    WORKFLOW,
    AgentSim,
    deliver_schedules,
    drive,
    make_runtime,
    post,
    redriven,
    state,
    steps,
)

pytestmark = pytest.mark.integration

HOLD = tuple(replace(s, on_failure="hold") if s.name == "charge-payment" else s for s in WORKFLOW)


def _rows(store: Any, oid: str) -> dict[str, Any]:
    return store.read_partition(oid)


def test_happy_path_on_table_storage(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    r = post(rt)
    oid = r.body["orderId"]
    st = drive(rt, oid, AgentSim(rt))
    assert st["ProcessState"] == "Processed" and "LockedBy" not in st
    view = get_order(rt, oid).body
    assert [s["state"] for s in view["steps"]] == ["Done"] * 3
    assert view["order"]["total"] == "19.98"
    assert rt.store.due_index("299912312359", 100) == []  # every index row is gone


def test_atomic_submission_failing_transaction_leaves_no_row(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    oid = "ab" * 16
    # a row already in the partition makes the one transaction fail (its create conflicts)
    rt.store.transact(oid, [Op("create", {"RowKey": "step-02-create-shipment", "Name": "x", "Index": 2})])
    from shared.core.jsonio import loads
    from shared.core.orders import OrderRequest

    order = OrderRequest.model_validate(loads(json.dumps(BODY)))
    effects = plan_submission(oid, order.canonical(), total="19.98", body_hash=order.body_hash(),
                              idempotency_key=None, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
                              ctx=rt.ctx())
    outcome = rt.run(effects)
    assert outcome.lost_race  # the create conflicted
    assert set(_rows(rt.store, oid)) == {"step-02-create-shipment"}  # no order, state or other step row
    assert rt.bus.peek("scheduler") == []  # nothing after the failed write ran


def test_atomic_submission_oversize_batch_writes_nothing(table_store) -> None:  # type: ignore[no-untyped-def]
    """The service refuses the whole transaction when one entity is too large (the store checks
    strings before sending; a binary property is left to the service here)."""
    from azure.core.exceptions import HttpResponseError

    from shared.storage.store import TooLarge
    from shared.storage.tables import Write

    oid = "cd" * 16
    batch = [Write("create", "order", {"a": "x"}), Write("create", "state", {"a": "y"}),
             Write("create", "big", {"b": b"x" * (70 * 1024)})]  # > 64 KiB binary
    with pytest.raises((HttpResponseError, TooLarge)):
        table_store.state.transact(oid, batch)
    assert table_store.read_partition(oid) == {}


def test_idempotent_submit(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    a = post(rt, headers={"Idempotency-Key": "order-77"})
    b = post(rt, headers={"Idempotency-Key": "order-77"})
    assert a.status == 202 and b.status == 200
    assert a.body["orderId"] == b.body["orderId"] == order_id_for_key("order-77")
    c = post(rt, {**BODY, "customerId": "other"}, headers={"Idempotency-Key": "order-77"})
    assert c.status == 409 and c.content_type == "application/problem+json"
    rows = _rows(rt.store, a.body["orderId"])
    assert rows["order"]["CustomerId"] == "c-1"
    assert len(rows) == 5


def test_concurrent_idempotent_submits_create_one_order(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    results: list[Any] = []
    barrier = threading.Barrier(8)

    def client() -> None:
        barrier.wait()
        results.append(post(rt, headers={"Idempotency-Key": "burst"}))

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status for r in results) == [200] * 7 + [202]
    assert {r.body["orderId"] for r in results} == {order_id_for_key("burst")}


def test_two_schedulers_race_exactly_one_wins(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    oid = redriven(rt)  # a claim on a schedule message: a redrive
    [msg] = rt.bus.take("scheduler")
    racers = 4
    store = BarrierStore(rt.store, racers)
    runtimes = [make_runtime(store, rt.bus, rt.clock, instance=f"instance-{i}") for i in range(racers)]
    verdicts: dict[str, str] = {}

    def run(r: Any) -> None:
        verdicts[r.instance_id] = handle_schedule(r, json.dumps(msg.body).encode())

    threads = [threading.Thread(target=run, args=(r,)) for r in runtimes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, v in verdicts.items() if v == "claimed"]
    assert len(winners) == 1, verdicts
    assert sorted(verdicts.values()) == ["claimed"] + ["lost-race"] * (racers - 1)
    st = state(rt, oid)
    assert st["LockedBy"] == winners[0]
    assert steps(rt, oid)["reserve-inventory"]["Attempt"] == 2
    assert len(rt.bus.peek("agent-inventory")) == 1  # only the winner dispatched


def test_two_supervisors_race_count_failure_once(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    oid = post(rt).body["orderId"]
    deliver_schedules(rt)
    rt.bus.take("agent-inventory")  # the agent hangs
    rt.clock.advance(31)
    store = BarrierStore(rt.store, 2)
    sups = [make_runtime(store, rt.bus, rt.clock, instance=f"sup-{i}") for i in range(2)]
    reports: list[Any] = []
    threads = [threading.Thread(target=lambda s=s: reports.append(sweep(s))) for s in sups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sum(r.acted.values()) for r in reports) == [0, 1]
    assert sum(r.lost_races for r in reports) == 1
    st = state(rt, oid)
    assert st["FailureCount"] == 1 and st["ProcessState"] == "Pending"
    assert len(rt.bus.peek("scheduler")) == 1


def test_stale_reply_is_ignored(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    oid = post(rt).body["orderId"]
    deliver_schedules(rt)
    [old] = rt.bus.take("agent-inventory")
    rt.clock.advance(31)
    sweep(rt)
    deliver_schedules(rt)  # attempt 2 in flight
    before = _rows(rt.store, oid)
    late = {"kind": "step", "orderId": oid, "step": "reserve-inventory", "attempt": old.body["attempt"],
            "outcome": "success", "result": {"reservationId": "late"}, "reason": None}
    assert handle_reply(rt, json.dumps(late).encode()) == "stale"
    after = _rows(rt.store, oid)
    assert {k: v["_etag"] for k, v in after.items()} == {k: v["_etag"] for k, v in before.items()}


def test_hung_agent_recovered_by_supervisor(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    oid = post(rt).body["orderId"]
    agents = AgentSim(rt, hang={"charge-payment"})
    drive(rt, oid, agents, until=lambda st: st.get("FailureCount") == 1)
    agents.hang.clear()  # the agent comes back
    st = drive(rt, oid, agents)
    assert st["ProcessState"] == "Processed" and st["FailureCount"] == 1
    s = steps(rt, oid)
    assert s["charge-payment"]["Attempt"] == 2 and s["reserve-inventory"]["Attempt"] == 1


def test_permanent_failure_compensated_in_reverse_order(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    oid = post(rt).body["orderId"]
    agents = AgentSim(rt, reject={"create-shipment": "undeliverable"})
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"], st["CompensationState"]) == ("Error", "failed", "completed")
    assert [c[2] for c in agents.calls] == ["reserve", "charge", "refund", "release"]
    view = get_order(rt, oid).body
    assert view["compensation"]["done"] == 2
    assert view["steps"][2]["failureReason"] == "undeliverable"
    assert [a.body["orderId"] for a in rt.bus.peek("alerts")] == [oid]


def test_operator_retry_and_cancel(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime(workflow=HOLD)
    agents = AgentSim(rt, reject={"charge-payment": "declined"})
    a = post(rt, headers={"Idempotency-Key": "a"}).body["orderId"]
    b = post(rt, headers={"Idempotency-Key": "b"}).body["orderId"]
    for oid in (a, b):
        assert drive(rt, oid, agents)["Mode"] == "held"
    assert cancel_order(rt, "nothex").status == 400
    agents.reject.clear()
    assert retry_order(rt, a).status == 202
    assert retry_order(rt, a).status == 409  # now Pending: not retryable
    assert drive(rt, a, agents)["ProcessState"] == "Processed"
    assert state(rt, a)["FailureCount"] == 0
    assert cancel_order(rt, b).status == 202
    st = drive(rt, b, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("cancelled", "completed")
    assert (b, "reserve-inventory", "release") in agents.calls
    assert (a, "reserve-inventory", "release") not in agents.calls
    r = cancel_order(rt, a)
    assert r.status == 409 and "Processed" in r.body["detail"]


def test_lost_schedule_message_recovered(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    rt.bus.fail.add("scheduler")  # the redrive's schedule message is lost
    oid = redriven(rt)  # (so was the first request)
    rt.bus.fail.clear()
    assert rt.bus.peek("scheduler") == []
    rt.clock.advance(31)
    assert sweep(rt).acted == {"rescheduled": 1}
    st = drive(rt, oid, AgentSim(rt))
    assert st["ProcessState"] == "Processed" and st["FailureCount"] == 1


def test_crash_between_writes_on_table_storage(table_runtime) -> None:  # type: ignore[no-untyped-def]
    """A claim and a reply, crashed after every effect, redelivered: converges on Azurite too."""
    from tests.unit.harness import Crash

    for k in range(6):
        rt = table_runtime()
        agents = AgentSim(rt)
        oid = redriven(rt)
        [msg] = rt.bus.take("scheduler")
        rt.crash_at = k
        with pytest.raises(Crash):
            handle_schedule(rt, json.dumps(msg.body).encode())
        handle_schedule(rt, json.dumps(msg.body).encode())
        deliver_schedules(rt)
        agents.work(rt.clock())
        [reply] = agents.pending_replies
        agents.pending_replies.clear()
        rt.crash_at = k
        with pytest.raises(Crash):
            handle_reply(rt, json.dumps(reply.body).encode())
        handle_reply(rt, json.dumps(reply.body).encode())
        st = drive(rt, oid, agents)
        assert st["ProcessState"] == "Processed", (k, st)
        assert st["FailureCount"] <= 2  # the redrive, and at most one timeout for the crash
        assert [c[2] for c in agents.calls if c[0] == oid] == ["reserve", "charge", "ship"]


def test_transaction_touches_state_and_steps_together(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    oid = post(rt).body["orderId"]
    deliver_schedules(rt)
    view = View.from_entities(rt.store.read_partition(oid))
    from shared.core.messages import ReplyMessage
    from shared.core.statemachine import decide_reply

    d = decide_reply(view, ReplyMessage(kind="step", orderId=oid, step="reserve-inventory", attempt=1,
                                        outcome="success", result={"r": 1}), rt.ctx())
    [txn] = [e for e in d.effects if isinstance(e, Transact)]
    # the step done, the next one dispatched, and their two history events (issue 11): one transaction
    assert sorted(op.row_key for op in txn.ops) == ["history-00000003", "history-00000004", "state",
                                                    "step-00-reserve-inventory", "step-01-charge-payment"]
