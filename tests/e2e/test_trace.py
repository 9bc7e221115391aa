"""End to end: one order's spans, written by every process of the local stack that handled it
(two host instances, each running the app's worker code), form one trace with the right parents;
and the sampling by order holds across those processes: an order the ratio drops leaves no span,
one it drops that fails leaves its spans from the failure on.

Each host process writes its spans to a JSON-lines file (ORDERS_SPANS_DIR, shared/observability/telemetry.py):
the in-memory exporter of a single process cannot see the others. The order's trace id, so its
sampling decision, is the caller's (its ``traceparent``): the test picks ids the ratio keeps or drops."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from local.host.keys import FUNCTION
from local.stack import Stack, demo_order
from shared.observability.sampling import KEEP, RATIO_SETTING
from tests.telemetry_support import sampled_trace_id

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AGENTS = {"inventory", "payment", "shipping"}


def _spans(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(directory.glob("spans-*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]


RATIO = 0.5


def post_traced(stack: Stack, body: dict[str, Any], trace_id: str) -> str:
    """POST /api/orders with a caller's ``traceparent``: the order's trace id, so its sampling decision."""
    headers = stack.key_headers(FUNCTION) | {"traceparent": f"00-{trace_id}-{'1' * 16}-01"}
    r = requests.post(f"{stack.api_url}/orders", json=body, headers=headers, timeout=30)
    assert r.status_code == 202, r.text
    assert r.json().get("traceId", trace_id) == trace_id
    return str(r.json()["orderId"])


def _ended(stack: Stack, order_ids: list[str]) -> None:
    """Each order Processed, or failed with its compensations ended."""
    def ended(order: dict[str, Any]) -> bool:
        return order["processState"] == "Processed" or (
            order["outcome"] == "failed" and order["compensation"]["total"] > 0
            and order["compensation"]["pending"] == 0)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not all(ended(stack.get_order(o)) for o in order_ids):
        time.sleep(0.3)


def test_one_order_is_one_trace_across_processes_and_sampled_whole(tmp_path: Path) -> None:
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    env = {"ORDERS_SPANS_DIR": str(spans_dir)}
    rng = random.Random(7)
    kept_trace, dropped_trace, failed_trace = (sampled_trace_id(RATIO, kept, rng) for kept in (True, False, False))
    with Stack(tmp_path / "stack", persistent=False, instances=2, host_env=env,
               settings_overrides={RATIO_SETTING: str(RATIO)}) as stack:
        with stack.remotes as remotes:
            remotes.set_faults("payment", reject_amount_over=500)  # under the approval's 1000
        small = {**demo_order(rng), "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": 9.99}]}
        oid = post_traced(stack, small, kept_trace)
        dropped = post_traced(stack, small, dropped_trace)
        large = {**small, "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 800.0}]}
        failed = post_traced(stack, large, failed_trace)
        _ended(stack, [oid, dropped, failed])
        assert stack.get_order(oid)["processState"] == "Processed"
        assert stack.get_order(dropped)["processState"] == "Processed"
        assert stack.get_order(failed)["compensation"]["done"] == 1, stack.get_order(failed)
        time.sleep(1.0)  # the last reply's handling ends just after its write
    written = _spans(spans_dir)
    # an order the ratio drops: not one span, in any process
    assert not [s for s in written if s["traceId"] == dropped_trace]
    # one it drops that fails: nothing before the failure (its submission, its first step), then
    # the failure's effects kept and everything after them: the compensation's request, its handling
    # by the inventory agent (another process, maybe), its reply
    after = [s for s in written if s["traceId"] == failed_trace]
    kept = {s["attributes"]["orders.verdict"]: s for s in after if s["attributes"].get(KEEP)}
    assert set(kept) == {"compensating", "compensated"}, [s["name"] for s in after]
    failure = kept["compensating"]
    assert not [s for s in after if s["kind"] == "SERVER"]
    assert not [s for s in after if s["attributes"].get("orders.step") in ("reserve-inventory", "charge-payment")
                and s["attributes"].get("orders.kind") != "compensation"]
    undo = [s for s in after if s["kind"] == "CONSUMER" and s["name"] == "process inventory"]
    assert [s["attributes"]["orders.kind"] for s in undo] == ["compensation"], after
    by_id_after = {s["spanId"]: s for s in after}
    assert by_id_after[undo[0]["parentId"]] is failure  # the undo's request was sent in the kept span
    # a sampled order: one whole trace
    [server] = [s for s in written if s["kind"] == "SERVER" and s["attributes"].get("orders.order_id") == oid]
    assert server["traceId"] == kept_trace
    spans = [s for s in written if s["traceId"] == server["traceId"]]
    by_id = {s["spanId"]: s for s in spans}
    assert all(s["traceId"] == server["traceId"] for s in written if s["attributes"].get("orders.order_id") == oid)
    agents = [s for s in spans if s["kind"] == "CONSUMER" and s["name"].split()[-1] in AGENTS]
    assert sorted(s["attributes"]["orders.step"] for s in agents) == sorted(
        ["reserve-inventory", "charge-payment", "create-shipment"])
    assert not [s for s in spans if s["kind"] == "PRODUCER"]  # a send makes no span (docs/cost.md)
    for agent in agents:
        # the request's sender is the submission or the previous reply's handling
        assert by_id[agent["parentId"]] is server or by_id[agent["parentId"]]["name"] == "process replies"
        assert any(s["kind"] == "CLIENT" and s["parentId"] == agent["spanId"] for s in spans)
        assert [s["name"] for s in spans if s["parentId"] == agent["spanId"] and s["kind"] != "CLIENT"] == [
            "process replies"]
    assert len({s["pid"] for s in spans}) >= 1  # which instance took which message is the broker's choice
