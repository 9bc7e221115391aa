"""The search index in shards (``shared.storage.store``: ``orders-0`` .. ``orders-{S-1}``, and the legacy
partition ``orders`` read as one more until retention moves it): a search lists every order once,
newest first, under every filter and page size, with tokens of one key; a row of the legacy
partition is checked against its state; retention moves the legacy partition to the shards; the
console's counts and the bulk operations' matching read every shard."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.api.bulk import matching
from shared.api.operator import retry_order
from shared.api.search import SearchQuery, parse_query
from shared.core.rows import Op, SearchRow
from shared.core.statemachine import View, index_rows
from shared.storage.memory import MemoryStore
from shared.storage.store import INDEX_PARTITION, shard_of
from shared.supervisor.retention import move_legacy_index, purge
from tests.unit.api.test_search import (
    CATEGORY_OF_FATE,
    FATES,
    Agents,
    LossyRuntime,
    Probe,
    all_pages,
    make,
    new_order,
    ok,
    probe,
    search,
)
from tests.unit.harness import state

SHARDS = 8


def sharded(shards: int = SHARDS) -> LossyRuntime:
    store = Probe()
    store.shards = shards
    return make(store=store)


def partitions_of(rt: LossyRuntime, order_id: str) -> set[str]:
    rows = probe(rt).snapshot().items()
    return {pk for (t, pk, _rk), row in rows if t == "search" and row.get("OrderId") == order_id}


def _index_is_its_state(rt: LossyRuntime, oid: str) -> None:
    view = View.from_entities(rt.store.read_partition(oid))
    assert view.order is not None and view.state is not None
    expected = {r.row_key: r.to_entity() for r in index_rows(view.order, view.state)}
    assert probe(rt).rows_of(oid) == expected
    assert partitions_of(rt, oid) == {shard_of(next(iter(expected)), SHARDS)}  # one shard, not ``orders``


@pytest.fixture(scope="module")
def catalogue() -> tuple[LossyRuntime, list[tuple[str, str, str]]]:
    """24 orders in 8 shards, a minute apart, of three customers and every fate: (orderId, fate, customer)."""
    rt = sharded()
    agents = Agents(rt)
    made = []
    for i in range(24):
        rt.clock.advance(60)
        fate, customer = FATES[i % len(FATES)], f"c-{i % 3}"
        made.append((new_order(rt, agents, fate, customer), fate, customer))
    return rt, made


def test_the_orders_are_spread_over_the_shards_each_order_in_one(catalogue: Any) -> None:
    rt, made = catalogue
    used = set()
    for oid, _f, _c in made:
        [partition] = partitions_of(rt, oid)
        assert partition.startswith("orders-") and partition != INDEX_PARTITION
        used.add(partition)
        _index_is_its_state(rt, oid)
    assert len(used) >= 4  # 24 orders by a hash: not all in a few


def test_every_page_size_lists_every_order_once_newest_first(catalogue: Any) -> None:
    rt, made = catalogue
    newest_first = [oid for oid, *_ in reversed(made)]
    for limit in (1, 2, 5, 23, 24, 25, 200):
        pages = all_pages(rt, limit=limit)
        assert [o["orderId"] for p in pages for o in p] == newest_first, limit
        assert all(len(p) <= limit for p in pages)
        assert all(len(p) == limit for p in pages[:-1])  # no filter on the rows: only the last page is short
    for category in ("inFlight", "attention", "processed", "error"):
        listed = [o["orderId"] for p in all_pages(rt, state=category, limit=2) for o in p]
        assert listed == [oid for oid, fate, _c in reversed(made) if CATEGORY_OF_FATE[fate] == category], category
    for customer in ("c-0", "c-1", "c-2"):
        listed = [o["orderId"] for p in all_pages(rt, customerId=customer, limit=3) for o in p]
        assert listed == [oid for oid, _f, c in reversed(made) if c == customer]
        listed = [o["orderId"] for p in all_pages(rt, customerId=customer, state="error", limit=1) for o in p]
        assert listed == [oid for oid, f, c in reversed(made) if c == customer and CATEGORY_OF_FATE[f] == "error"]


def test_a_page_is_one_query_of_every_shard_and_the_legacy_partition(catalogue: Any) -> None:
    rt, _made = catalogue
    store = probe(rt)
    store.reset_counts()
    body = ok(rt, limit=5)
    assert len(body["orders"]) == 5 and body["continuationToken"]
    assert [(q[2], q[3]) for q in store.index_queries] == [(6, 6)]  # the merge: limit + 1 rows
    assert sum(1 for table, _p in store.reads if table == "search") == SHARDS + 1


def test_a_token_is_bound_to_its_filters_and_tamper_proof(catalogue: Any) -> None:
    rt, _made = catalogue
    token = ok(rt, limit=2)["continuationToken"]
    assert search(rt, limit=2, state="processed", continuationToken=token).status == 400
    tampered = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")
    assert search(rt, limit=2, continuationToken=tampered).status == 400
    assert search(rt, limit=2, continuationToken=token).status == 200


def test_the_console_counts_and_the_bulk_matching_read_every_shard(catalogue: Any) -> None:
    rt, made = catalogue
    for category in ("inFlight", "attention"):
        expected = [oid for oid, fate, _c in reversed(made) if CATEGORY_OF_FATE[fate] == category]
        assert rt.store.count_index(f"cat-{category}-", f"cat-{category}.", 100) == (len(expected), False)
        query = parse_query({"state": category})
        assert isinstance(query, SearchQuery) and matching(rt, query, 100) == expected
    query = parse_query({})
    assert isinstance(query, SearchQuery) and matching(rt, query, 7) == [oid for oid, *_ in reversed(made)][:7]


def test_orders_of_the_legacy_partition_are_listed_checked_and_moved_by_retention() -> None:
    rt = sharded(1)  # before the shards: the one partition ``orders``
    agents = Agents(rt)
    made: list[tuple[str, str]] = []
    for fate in ("processed", "held", "inFlight", "failed", "processed"):
        rt.clock.advance(60)
        made.append((new_order(rt, agents, fate), fate))
    gone = made[4][0]
    probe(rt).shards = SHARDS  # the change deployed
    for fate in ("inFlight", "processed"):
        rt.clock.advance(60)
        made.append((new_order(rt, agents, fate), fate))
    held = made[1][0]
    agents.frozen.add(held)
    assert retry_order(rt, held).status == 202  # attention -> inFlight: its index write goes to a shard
    keys = sorted(probe(rt).partition(gone))
    rt.store.transact(gone, [Op("delete", {"RowKey": k}, etag="*") for k in keys])  # purged meanwhile

    def listing() -> list[tuple[str, str]]:
        return [(o["orderId"], o["category"]) for p in all_pages(rt, limit=2) for o in p]

    now = {oid: CATEGORY_OF_FATE[f] for oid, f in made if oid != gone}
    now[held] = "inFlight"
    newest_first = [(oid, now[oid]) for oid, _f in reversed(made) if oid != gone]
    assert listing() == newest_first  # the legacy rows checked against their state
    assert [o["orderId"] for o in ok(rt, state="attention")["orders"]] == [made[3][0]]  # not the retried one
    assert [o["orderId"] for o in ok(rt, state="inFlight")["orders"]] == [made[5][0], made[2][0], held]
    assert rt.store.count_index("all-", "all.", 100) == (len(made), False)  # a key in a shard and legacy: once
    # retention moves the legacy partition to the shards (the gone order's rows just go)
    assert rt.store.legacy_index(100)
    assert purge(rt).legacy_moved > 0
    assert rt.store.legacy_index(100) == []
    assert listing() == newest_first
    for oid, _f in made:
        if oid != gone:
            _index_is_its_state(rt, oid)
    assert not any(gone in key for key in probe(rt).search_rows())
    assert move_legacy_index(rt) == 0  # empty: one query, nothing more


def test_a_failed_reindex_keeps_the_orders_legacy_rows_for_the_next_run() -> None:
    rt = sharded(1)
    agents = Agents(rt)
    oid = new_order(rt, agents, "processed")
    store = probe(rt)
    before = {k: v for k, v in store.search_rows().items()}
    store.shards = SHARDS
    store.fail_index_writes = 1
    assert move_legacy_index(rt) == 0
    assert {r.row_key for r in store.legacy_index(100)} == set(before)
    assert move_legacy_index(rt) == len(before)
    assert store.legacy_index(100) == []
    _index_is_its_state(rt, oid)
    assert state(rt, oid)["ProcessState"] == "Processed"


def test_without_shards_retention_moves_nothing() -> None:
    rt = sharded(1)
    oid = new_order(rt, Agents(rt), "processed")
    rows = probe(rt).rows_of(oid)
    assert move_legacy_index(rt) == 0 and probe(rt).rows_of(oid) == rows
    assert {pk for (t, pk, _k) in probe(rt).snapshot() if t == "search"} == {INDEX_PARTITION}


@settings(max_examples=60, deadline=None)
@given(shards=st.integers(1, 9), n=st.integers(0, 40), limit=st.integers(1, 12), legacy=st.integers(0, 15),
       data=st.data())
def test_paging_by_the_last_key_lists_every_row_once_in_order(shards: int, n: int, limit: int, legacy: int,
                                                                data: st.DataObject) -> None:
    # the search's paging over the store: read limit + 1 from the key after the page; a row of the
    # legacy partition with a key a shard also has is listed once
    ids = data.draw(st.lists(st.text("0123456789abcdef", min_size=32, max_size=32), min_size=n, max_size=n,
                             unique=True))
    store = MemoryStore(1)
    old = [SearchRow(f"all-{i}", i) for i in ids[:legacy]]
    store.write_index(old, [])
    store.shards = shards
    store.write_index([SearchRow(f"all-{i}", i, failure_count=1) for i in ids[legacy // 2:]], [])
    low, seen = "all-", []
    while True:
        rows = store.query_index(low, "all.", limit + 1)
        seen += rows[:limit]
        if len(rows) <= limit:
            break
        low = rows[limit].row_key
    assert [r.row_key for r in seen] == sorted(f"all-{i}" for i in ids)
    if shards > 1:  # the shard's row wins over the legacy one of the same key
        assert all(r.failure_count == 1 for r in seen if r.order_id in ids[legacy // 2:])
        assert all(r.legacy == (r.order_id not in ids[legacy // 2:]) for r in seen)
