"""Priority lanes end to end, on the local stack (Azurite, the Service Bus emulator with the lane
queues local/queueconfig.py derives, the remote services simulator, the Functions host): a high
order's messages go through the -high queues only, counted at the broker, and a low or normal
order's through the default ones. No timing is asserted: the benchmark measures the latency."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests

from bench import busstats
from local.host.keys import ADMIN
from local.stack import Stack
from shared.core.workflows.lanes import LANED_QUEUES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = {"SupervisorSchedule": "*/2 * * * * *", "StepTimeoutSeconds": "5", "UnclaimedGraceSeconds": "5",
        "BackoffBaseSeconds": "1"}
NORMAL = {q for _, q in LANED_QUEUES}
HIGH = {f"{q}-high" for q in NORMAL}


def order(priority: str, quantity: int = 1) -> dict[str, Any]:
    return {"customerId": "c-lanes", "currency": "EUR", "priority": priority,
            "items": [{"sku": "SKU-1", "quantity": quantity, "unitPrice": 9.99}]}


def wait_settled(stack: Stack, oid: str, timeout: float = 90.0) -> dict[str, Any]:
    """The order once it is Processed, or in Error with its compensation over."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = stack.get_order(oid)
        if last["processState"] == "Processed":
            return last
        if last["processState"] == "Error" and (last.get("compensation") or {}).get("state") != "running":
            return last
        time.sleep(0.3)
    raise AssertionError(f"order {oid} did not settle: {last}")


def sent_per_queue(stats: busstats.BusStats, before: dict[str, Any] | None) -> dict[str, int]:
    """Messages accepted by each work queue since ``before``."""
    after = stats.snapshot()
    return {q: row.get("sent", 0) for q, row in busstats.diff(after, before).items()
            if q in NORMAL | HIGH and row.get("sent", 0)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("lanes")
    stats_path = work / "bus-stats.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(busstats.ENV, str(stats_path))  # the emulator counts every queue's operations
        with Stack(work / "stack", persistent=False, instances=1, settings_overrides=FAST) as running:
            running.bus_stats = busstats.BusStats(  # type: ignore[attr-defined]
                stats_path, lambda: running.proc("servicebus").pid)
            yield running


def test_a_high_order_goes_through_the_high_queues_only(stack: Stack) -> None:
    stats = stack.bus_stats  # type: ignore[attr-defined]
    before = stats.snapshot()
    oid = stack.post_order(order("high"))
    assert wait_settled(stack, oid)["processState"] == "Processed"
    sent = sent_per_queue(stats, before)
    # three requests and three replies, each on the high lane's queue
    assert sent == {"agent-inventory-high": 1, "agent-payment-high": 1, "agent-shipping-high": 1,
                    "replies-high": 3}, sent


@pytest.mark.parametrize("priority", ["normal", "low"])
def test_normal_and_low_orders_go_through_the_default_queues(stack: Stack, priority: str) -> None:
    stats = stack.bus_stats  # type: ignore[attr-defined]
    before = stats.snapshot()
    oid = stack.post_order(order(priority))
    assert wait_settled(stack, oid)["processState"] == "Processed"
    sent = sent_per_queue(stats, before)
    assert sent == {"agent-inventory": 1, "agent-payment": 1, "agent-shipping": 1, "replies": 3}, sent


def test_a_high_orders_compensation_and_operator_restart_stay_on_its_lane(stack: Stack) -> None:
    """A rejected charge: the release goes to agent-inventory-high; the operator's retry hands the
    order to a scheduler through scheduler-high; it then runs again on the high lane."""
    stats = stack.bus_stats  # type: ignore[attr-defined]
    remotes = stack.remotes
    remotes.set_faults("payment", reject_amount_over=100)
    try:
        before = stats.snapshot()
        oid = stack.post_order(order("high", quantity=20))  # 199.80 EUR: declined
        failed = wait_settled(stack, oid)
        assert (failed["processState"], failed["outcome"]) == ("Error", "failed"), failed
        sent = sent_per_queue(stats, before)
        assert sent == {"agent-inventory-high": 2, "agent-payment-high": 1, "replies-high": 3}, sent  # reserve, release
    finally:
        remotes.reset_faults()
    before = stats.snapshot()
    r = requests.post(f"{stack.api_url}/orders/{oid}/retry", timeout=30, headers=stack.key_headers(ADMIN))
    assert r.status_code == 202 and r.json()["result"] == "restarted", r.text
    assert wait_settled(stack, oid)["processState"] == "Processed"
    sent = sent_per_queue(stats, before)
    assert sent == {"scheduler-high": 1, "agent-inventory-high": 1, "agent-payment-high": 1,
                    "agent-shipping-high": 1, "replies-high": 3}, sent
