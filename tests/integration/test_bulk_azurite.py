"""Bulk operations on real Table Storage (Azurite): the start's one transaction (a header and
id rows of 500 ids, near a String property's limit), the slices' conditional header writes and
the watch rows in the deadline index, driven by the Supervisor's sweeps."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from shared.api import bulk as bulk_api
from shared.api.bulk import get_operation, start_operation
from shared.core.operations import CHUNK, chunks, partition_of
from shared.core.rows import Op
from shared.supervisor import sweep
from tests.unit.api.test_bulk import RETRY_ATTENTION, held_orders, op_events
from tests.unit.core.statemachine.test_operator import HOLD
from tests.unit.harness import JSON_HEADERS, CrashRuntime, drive

pytestmark = pytest.mark.integration


def test_a_bulk_retry_on_table_storage_acts_once_on_each_order(table_runtime: Callable[..., CrashRuntime],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk_api, "FIRST_SLICE", 2)
    rt, agents, ids = held_orders(5, table_runtime(workflow=HOLD, bulk_slice=2))
    r = start_operation(rt, json.dumps(RETRY_ATTENTION).encode(), JSON_HEADERS, "ops@example.com")
    assert r.status == 202 and r.body["succeeded"] == 2, r.body
    op_id = r.body["operationId"]
    for _ in range(3):
        rt.clock.advance(15)  # type: ignore[attr-defined]
        sweep(rt)
    done = get_operation(rt, op_id).body
    assert (done["state"], done["succeeded"], done["failed"]) == ("done", 5, 0), done
    for oid in ids:
        assert len(op_events(rt, oid, op_id)) == 1
        assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    assert not [row for row in rt.store.due_index("999912312359", 100) if row.row_key.startswith("operation:")]


def test_ten_thousand_ids_fit_one_start_transaction(table_runtime: Callable[..., CrashRuntime]) -> None:
    rt = table_runtime()
    ids = [f"{n:032x}" for n in range(bulk_api.MAX_ORDERS)]
    rows = chunks(ids)
    assert len(rows) == bulk_api.MAX_ORDERS // CHUNK
    rt.store.transact(partition_of("a" * 32), [Op("create", {"RowKey": "operation", "Action": "retry"}),
                                               *(Op("create", row) for row in rows)])
    back: dict[str, Any] = rt.store.read_rows(partition_of("a" * 32), 100)
    assert sum(len(str(e.get("Ids", "")).split()) for e in back.values()) == bulk_api.MAX_ORDERS
