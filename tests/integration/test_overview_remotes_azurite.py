"""The overview's ``remotes`` on Table Storage (Azurite), every request counted: a point read of
each remote's breaker (a missing row is a closed breaker, not an error) and one RowKey-only page
of its waiting steps, capped, whatever their number."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bench.search_cost import CountedStore, _diff
from shared.console.overview import get_overview
from shared.console.remotes import WAITING_COUNT_CAP
from shared.core.breaker.state import BreakerPolicy, decide_failure
from shared.core.breaker.waiting import WaitingStep, waiting_partition
from shared.core.rows import Op
from shared.core.workflows.catalog import AGENTS
from shared.storage.breakers import read_breaker, write_breaker
from shared.storage.store import MAX_BATCH_OPS
from shared.storage.waiting import register_waiting

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 22, 8, 30, tzinfo=UTC)


@pytest.fixture
def counted(azurite: Any, table_service: Any) -> Iterator[CountedStore]:
    suffix = uuid.uuid4().hex[:10]
    names = (f"orders{suffix}", f"deadlines{suffix}", f"orderindex{suffix}")
    store = CountedStore(azurite.connection_string, *names)
    try:
        yield store
    finally:
        for name in names:
            table_service.delete_table(name)


def requests_by_table(store: CountedStore, before: dict[str, dict[str, float]]) -> dict[tuple[str, str], int]:
    """Requests by (table without its suffix, kind) since ``before``."""
    out: dict[tuple[str, str], int] = {}
    for key, v in _diff(store.counter.snapshot(), before).items():
        table, kind = key.split("|")[:2]
        name = table.rstrip("0123456789abcdef")
        out[(name, kind)] = out.get((name, kind), 0) + int(v["requests"])
    return out


def open_shipping(counted: CountedStore) -> None:
    policy = BreakerPolicy()
    store = counted.table_store
    for i in range(policy.threshold):
        decision = decide_failure(read_breaker(store, "shipping"), NOW + timedelta(seconds=i), policy, "503")
        assert decision.row is not None
        write_breaker(store, decision.row)


def test_an_open_breaker_and_its_waiting_steps_at_two_requests_per_remote(counted: CountedStore) -> None:
    store = counted.table_store
    open_shipping(counted)
    for i in range(3):
        register_waiting(store, "shipping", WaitingStep(f"{i:032x}", 1, "create-shipment"), NOW)
    before = counted.counter.snapshot()
    body: dict[str, Any] = get_overview(counted.runtime, queue_depths=lambda rt, cap: []).body
    remotes = {remote["name"]: remote for remote in body["remotes"]}
    assert body["remotesError"] is None and list(remotes) == [a.name for a in AGENTS]
    shipping = remotes["shipping"]
    assert (shipping["state"], shipping["failures"], shipping["opens"]) == ("open", 5, 1)
    assert shipping["openedAt"] == "2026-11-22T08:30:04.000000Z"
    assert shipping["retryAt"] == "2026-11-22T08:30:09.000000Z"
    assert (shipping["waiting"], shipping["waitingCapped"]) == (3, False)
    assert all(r["state"] == "closed" and r["waiting"] == 0 for n, r in remotes.items() if n != "shipping")
    state_requests = {kind: n for (table, kind), n in requests_by_table(counted, before).items() if table == "orders"}
    assert state_requests == {"get": len(AGENTS), "query": len(AGENTS)}


def test_the_waiting_count_is_one_request_over_the_cap(counted: CountedStore) -> None:
    store = counted.table_store
    keys = [WaitingStep(f"{i:032x}", 1, "create-shipment").row_key for i in range(WAITING_COUNT_CAP + 5)]
    for i in range(0, len(keys), MAX_BATCH_OPS):
        chunk = keys[i:i + MAX_BATCH_OPS]
        store.transact(waiting_partition("shipping"), [Op("create", {"RowKey": k, "Since": "x"}) for k in chunk])
    before = counted.counter.snapshot()
    body = get_overview(counted.runtime, queue_depths=lambda rt, cap: [], remotes=["shipping"]).body
    assert body["remotes"][0]["waiting"] == WAITING_COUNT_CAP and body["remotes"][0]["waitingCapped"] is True
    assert requests_by_table(counted, before)[("orders", "query")] == 1
