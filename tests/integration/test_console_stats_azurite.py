"""The console's stats rows and capped counts on Table Storage (Azurite), every request counted
(the bench's counting transport): the same checks the in-memory store passes, a flush is one
transaction, a count is one request, and the overview reads its figures back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bench.search_cost import CountedStore, _diff
from shared.console.overview import LIVE_COUNT_CAP, get_overview
from shared.core.rows import SearchRow
from shared.storage.store import index_partitions
from tests.unit.observability.test_figures import check_count_index_capped, check_stats_rows

pytestmark = pytest.mark.integration


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


def requests_of(store: CountedStore, before: dict[str, dict[str, float]]) -> dict[str, tuple[int, int]]:
    """(requests, entities) by kind since ``before``, summed over tables and partition marks (the
    stats rows' requests are ``orderindex|query|stats``, the live counts' ``orderindex|query``)."""
    out: dict[str, tuple[int, int]] = {}
    for key, v in _diff(store.counter.snapshot(), before).items():
        kind = key.split("|")[1]
        requests, entities = out.get(kind, (0, 0))
        out[kind] = (requests + int(v["requests"]), entities + int(v["entities"]))
    return out


def test_stats_rows(counted: CountedStore) -> None:
    check_stats_rows(counted.table_store)


def test_count_index_capped(counted: CountedStore) -> None:
    check_count_index_capped(counted.table_store)


def test_a_count_over_the_cap_is_one_request_of_row_keys_per_partition(counted: CountedStore) -> None:
    store = counted.table_store
    rows = [SearchRow(f"cat-inFlight-{i:017d}-o{i}", f"o{i}", customer_id="c" * 200)
            for i in range(LIVE_COUNT_CAP + 1)]
    for i in range(0, len(rows), 100):
        store.write_index(rows[i:i + 100], [])
    before = counted.counter.snapshot()
    assert store.count_index("cat-inFlight-", "cat-inFlight.", LIVE_COUNT_CAP) == (LIVE_COUNT_CAP, True)
    # one request per partition of the index (its shards and the legacy one; the counter counts entities
    # by their PartitionKey, which a RowKey-only select leaves out)
    assert {kind: n for kind, (n, _entities) in requests_of(counted, before).items()} == {
        "query": len(index_partitions(store.shards))}
    store.write_index([], [rows[-1].row_key])
    assert store.count_index("cat-inFlight-", "cat-inFlight.", LIVE_COUNT_CAP) == (LIVE_COUNT_CAP, False)


def test_a_flush_is_one_transaction_and_the_overview_reads_it_back(counted: CountedStore) -> None:
    store = counted.table_store
    assert store.stats is not None
    store.stats.background = False  # this test flushes
    store.stats.record_sweep(3)
    before = counted.counter.snapshot()
    assert store.stats.flush() == 2  # its minute and hour rows
    assert requests_of(counted, before) == {"batch": (1, 2)}
    before = counted.counter.snapshot()
    # no remote: their breakers' reads are counted in test_overview_remotes_azurite.py
    body = get_overview(counted.runtime, queue_depths=lambda rt, cap: [], remotes=[]).body
    assert body["supervisor"]["sweepsLastHour"] == 1 and body["supervisor"]["lastDueRows"] == 3
    assert body["live"]["inFlight"] == {"count": 0, "capped": False}
    # two stats ranges (the minute row, the hour row) and two counts (nothing), a request per partition
    # of the index each (its shards and the legacy one)
    partitions = len(index_partitions(counted.table_store.shards))
    assert requests_of(counted, before) == {"query": (2 + 2 * partitions, 2)}
