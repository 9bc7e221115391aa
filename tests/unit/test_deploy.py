"""Orders in flight keep working across the deploy that brings a customer's cap and webhooks (issue
45): their rows were written by a version that knew neither (no room, no delivery), and the new
version, with ``CustomerMaxInFlight`` and ``WebhookUrl`` set, carries them to their end. (The rate
limit keeps nothing on an order's rows but a waiting step's ``WakeAt``, which a row of an earlier
version simply lacks: tests/unit/core/statemachine/test_waiting.py.)"""

from __future__ import annotations

from typing import Any

from tests.unit.harness import BODY, AgentSim, drive, make_runtime, post, state
from tests.unit.runtime.test_webhooks import SCHEDULE, TARGET, Receiver, settle_webhooks


def order(rt: Any, customer: str = "c-deploy") -> str:
    rt.clock.advance(0.001)  # submission order is by submission time
    r = post(rt, {**BODY, "customerId": customer})
    assert r.status == 202, r.body
    return str(r.body["orderId"])


def test_orders_in_flight_before_the_deploy_end_after_it_under_the_new_settings() -> None:
    before = make_runtime()  # the previous version: no cap, no webhooks
    agents = AgentSim(before)
    done = order(before)
    drive(before, done, agents)
    charging = order(before)
    drive(before, charging, agents, until=lambda st: st.get("LeaseKey") == "charge-payment:1")
    fresh = order(before)  # its first request on the bus, not yet taken
    old = [done, charging, fresh]
    assert [state(before, o)["ProcessState"] for o in old] == ["Processed", "Processing", "Processing"]
    assert all("Room" not in state(before, o) for o in old)

    # The deploy: the same tables and queues, the new settings.
    after = make_runtime(store=before.store, bus=before.bus, clock=before.clock, customer_max_in_flight=1,
                         webhooks=True, webhook_schedule=SCHEDULE)
    after.webhook = TARGET
    agents = AgentSim(after)
    first = order(after)  # the orders of before hold no slot: this one takes the only one
    second = order(after)  # ... and this one waits for it
    assert state(after, second)["ProcessState"] == "Pending" and state(after, second).get("WaitingRoom")
    for oid in (charging, fresh, first, second):
        drive(after, oid, agents)
    receiver = Receiver()
    settle_webhooks(after, receiver)

    assert [state(after, o)["ProcessState"] for o in (*old, first, second)] == ["Processed"] * 5
    assert sum(int(state(after, o).get("FailureCount", 0)) for o in (*old, first, second)) == 0
    # every order that ended after the deploy is told, the one that ended before it is not
    told = sorted(e["data"]["orderId"] for e in receiver.told.values())
    assert told == sorted([charging, fresh, first, second]), receiver.told
    assert all(e["type"] == "order.processed" for e in receiver.told.values())
