"""End to end: one order's spans, written by every process of the local stack that handled it
(two host instances, each running the app's worker code), form one trace with the right parents.

Each host process writes its spans to a JSON-lines file (ORDERS_SPANS_DIR, shared/observability/telemetry.py):
the in-memory exporter of a single process cannot see the others."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from local.stack import Stack, demo_order

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AGENTS = {"inventory", "payment", "shipping"}


def _spans(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(directory.glob("spans-*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]


def test_one_order_is_one_trace_across_processes(tmp_path: Path) -> None:
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    env = {"ORDERS_SPANS_DIR": str(spans_dir)}
    with Stack(tmp_path / "stack", persistent=False, instances=2, host_env=env) as stack:
        oid = stack.post_order(demo_order(random.Random(7)))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and stack.get_order(oid)["processState"] != "Processed":
            time.sleep(0.3)
        assert stack.get_order(oid)["processState"] == "Processed"
        time.sleep(1.0)  # the last reply's handling ends just after its write
    written = _spans(spans_dir)
    [server] = [s for s in written if s["kind"] == "SERVER" and s["attributes"].get("orders.order_id") == oid]
    spans = [s for s in written if s["traceId"] == server["traceId"]]
    by_id = {s["spanId"]: s for s in spans}
    assert all(s["traceId"] == server["traceId"] for s in written if s["attributes"].get("orders.order_id") == oid)
    agents = [s for s in spans if s["kind"] == "CONSUMER" and s["name"].split()[-1] in AGENTS]
    assert sorted(s["attributes"]["orders.step"] for s in agents) == sorted(
        ["reserve-inventory", "charge-payment", "create-shipment"])
    for agent in agents:
        producer = by_id[agent["parentId"]]
        assert producer["kind"] == "PRODUCER"
        assert by_id[producer["parentId"]] is server or by_id[producer["parentId"]]["name"] == "process replies"
        assert any(s["kind"] == "CLIENT" and s["parentId"] == agent["spanId"] for s in spans)
        [reply_send] = [s for s in spans if s["kind"] == "PRODUCER" and s["parentId"] == agent["spanId"]]
        assert [s["name"] for s in spans if s["parentId"] == reply_send["spanId"]] == ["process replies"]
    assert len({s["pid"] for s in spans}) >= 1  # which instance took which message is the broker's choice
