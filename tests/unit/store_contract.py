"""The store contract, run against the in-memory twin (unit) and Table Storage on Azurite
(integration): the core's tests are only as good as the twin's fidelity to the real thing."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime

import pytest

from shared.core.effects import due_bound
from shared.core.rows import ETAG, IndexRow, Op, SearchRow, history_row_key
from shared.storage.store import Conflict, Store


def _pk() -> str:
    return uuid.uuid4().hex


def check_create_conflict_is_atomic(store: Store) -> None:
    pk = _pk()
    store.transact(pk, [Op("create", {"RowKey": "step-a", "x": 1})])
    with pytest.raises(Conflict):
        store.transact(pk, [Op("create", {"RowKey": "step-b", "x": 2}), Op("create", {"RowKey": "step-a", "x": 3})])
    rows = store.read_partition(pk)
    assert set(rows) == {"step-a"} and rows["step-a"]["x"] == 1  # 'step-b' was not written: all or nothing


def check_etag_replace(store: Store) -> None:
    pk = _pk()
    store.transact(pk, [Op("create", {"RowKey": "s", "n": 0}), Op("create", {"RowKey": "t", "n": 0})])
    s = store.read_row(pk, "s")
    t = store.read_row(pk, "t")
    assert s is not None and t is not None
    store.transact(pk, [Op("replace", {"RowKey": "s", "n": 1}, etag=s[ETAG])])
    # stale ETag on one op: the whole transaction fails, t unchanged
    with pytest.raises(Conflict):
        store.transact(pk, [Op("replace", {"RowKey": "t", "n": 9}, etag=t[ETAG]),
                            Op("replace", {"RowKey": "s", "n": 9}, etag=s[ETAG])])
    assert store.read_row(pk, "t")["n"] == 0  # type: ignore[index]
    assert store.read_row(pk, "s")["n"] == 1  # type: ignore[index]
    fresh = store.read_row(pk, "s")
    assert fresh is not None and fresh[ETAG] != s[ETAG]


def check_replace_removes_absent_and_none(store: Store) -> None:
    pk = _pk()
    store.transact(pk, [Op("create", {"RowKey": "r", "a": "x", "b": "y"})])
    r = store.read_row(pk, "r")
    assert r is not None
    store.transact(pk, [Op("replace", {"RowKey": "r", "a": "z", "b": None}, etag=r[ETAG])])
    r2 = store.read_row(pk, "r")
    assert r2 is not None and r2["a"] == "z" and "b" not in r2


def check_replace_missing_row_conflicts(store: Store) -> None:
    pk = _pk()
    with pytest.raises(Conflict):
        store.transact(pk, [Op("replace", {"RowKey": "nope", "a": 1}, etag='W/"1"')])


def check_index(store: Store) -> None:
    tag = _pk()[:6]
    for bucket, key in (("202611220800", "a"), ("202611220801", "b"), ("202611220900", "c")):
        due_at = datetime.strptime(bucket, "%Y%m%d%H%M").replace(tzinfo=UTC)
        store.put_index(IndexRow(bucket, f"{tag}:{key}", tag, due_at))
    due = [r for r in store.due_index("202611220801", 100) if r.row_key.startswith(tag)]
    assert [(r.bucket, r.row_key, r.order_id) for r in due] == [("202611220800", f"{tag}:a", tag),
                                                                ("202611220801", f"{tag}:b", tag)]
    assert due[1].due == datetime(2026, 11, 22, 8, 1, tzinfo=UTC)
    store.delete_index("202611220800", f"{tag}:a")
    store.delete_index("202611220800", f"{tag}:a")  # idempotent
    due_keys = [r.row_key for r in store.due_index("202611220801", 100) if r.row_key.startswith(tag)]
    assert due_keys == [f"{tag}:b"]
    store.delete_index("202611220801", f"{tag}:b")
    store.delete_index("202611220900", f"{tag}:c")


def check_index_shards_of_a_minute_are_due_with_it(store: Store) -> None:
    # a sweep's bound (``due_bound``) takes every shard of the minutes up to now's and the minute's
    # own partition (watches, rows from before the shards), never the next minute's
    tag = _pk()[:6]
    now = datetime(2026, 11, 22, 11, 1, 30, tzinfo=UTC)
    rows = [("202611221100-3", "a"), ("202611221101", "b"), ("202611221101-0", "c"), ("202611221101-3", "d"),
            ("202611221102", "e"), ("202611221102-0", "f")]
    for bucket, key in rows:
        store.put_index(IndexRow(bucket, f"{tag}:{key}", tag, now))
    due = [(r.bucket, r.row_key[-1]) for r in store.due_index(due_bound(now), 100) if r.row_key.startswith(tag)]
    assert due == [(b, k) for b, k in rows[:4]]
    for bucket, key in rows:
        store.delete_index(bucket, f"{tag}:{key}")


def check_injection_safe_keys(store: Store) -> None:
    # a partition key with OData syntax in it is just a value (parameterised filters)
    nasty = "x' or PartitionKey ne 'y"
    assert store.read_partition(nasty) == {}
    assert store.read_row(nasty, "state") is None


def check_mixed_transaction_and_values(store: Store) -> None:
    # create, replace and delete in one transaction; keys that need quoting; the value types the app writes
    pk = f"{_pk()}'q"
    odd = "step-o'k é"
    store.transact(pk, [Op("create", {"RowKey": odd, "n": 1}), Op("create", {"RowKey": "step-gone", "n": 2})])
    rows = store.read_partition(pk)
    values = {"RowKey": "state", "s": "ünï'code \" {json}", "i": -7, "big": 2**31 - 1, "b": True, "f": 1.5}
    store.transact(pk, [Op("create", values),
                        Op("replace", {"RowKey": odd, "n": 3}, etag=rows[odd][ETAG]),
                        Op("delete", {"RowKey": "step-gone"}, etag=rows["step-gone"][ETAG])])
    rows = store.read_partition(pk)
    assert set(rows) == {"state", odd} and rows[odd]["n"] == 3
    assert {k: rows["state"][k] for k in values} == values


def check_delete_needs_current_etag(store: Store) -> None:
    pk = _pk()
    store.transact(pk, [Op("create", {"RowKey": "d", "n": 0})])
    d = store.read_row(pk, "d")
    assert d is not None
    store.transact(pk, [Op("replace", {"RowKey": "d", "n": 1}, etag=d[ETAG])])
    with pytest.raises(Conflict):
        store.transact(pk, [Op("delete", {"RowKey": "d"}, etag=d[ETAG])])  # stale
    with pytest.raises(Conflict):
        store.transact(pk, [Op("delete", {"RowKey": "nope"}, etag='W/"1"')])  # missing
    fresh = store.read_row(pk, "d")
    assert fresh is not None and fresh["n"] == 1
    store.transact(pk, [Op("delete", {"RowKey": "d"}, etag=fresh[ETAG])])
    assert store.read_row(pk, "d") is None


def check_index_many_rows_of_one_bucket(store: Store) -> None:
    # concurrent puts of one bucket (group-committed in the Table store), then deletes of
    # several rows of it (sent as one batch when the sweep's read flushes them)
    tag, bucket = _pk()[:6], "202611221000"
    keys = [f"{tag}:{i:02d}" for i in range(12)]
    barrier = threading.Barrier(len(keys))
    errors: list[BaseException] = []

    def put(rk: str) -> None:
        barrier.wait()
        try:
            store.put_index(IndexRow(bucket, rk, tag, datetime(2026, 11, 22, 10, tzinfo=UTC)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(rk,)) for rk in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    due = [r for r in store.due_index(bucket, 1000) if r.row_key.startswith(tag)]
    assert [r.row_key for r in due] == keys and all(r.order_id == tag for r in due)
    for rk in keys[:10]:
        store.delete_index(bucket, rk)
    assert [r.row_key for r in store.due_index(bucket, 1000) if r.row_key.startswith(tag)] == keys[10:]
    for rk in keys[10:]:
        store.delete_index(bucket, rk)


def check_history_is_apart_from_live_rows(store: Store) -> None:
    # the forward path's read never returns history; history pages oldest first
    pk = _pk()
    events = [Op("create", {"RowKey": history_row_key(n), "Seq": n}) for n in range(1, 8)]
    store.transact(pk, [Op("create", {"RowKey": "order"}), Op("create", {"RowKey": "state"}), *events])
    assert set(store.read_partition(pk)) == {"order", "state"}
    first = store.read_history(pk, 0, 3)
    assert [r.seq for r in first] == [1, 2, 3]
    rest = store.read_history(pk, 3, 100)
    assert [r.seq for r in rest] == [4, 5, 6, 7]
    assert store.read_history(pk, 7, 100) == []
    keys = store.partition_keys(pk, 100)
    assert {k for k, _e in keys} == {"order", "state", *(history_row_key(n) for n in range(1, 8))}
    assert all(etag for _k, etag in keys)
    assert len(store.partition_keys(pk, 4)) == 4
    # a key range apart from both (an order's webhook deliveries, hook-*), by RowKey, with ETags
    store.transact(pk, [Op("create", {"RowKey": f"hook-{n:08d}", "Seq": n}) for n in (9, 3)])
    hooks = store.read_range(pk, "hook-", "hook.", 100)
    assert list(hooks) == ["hook-00000003", "hook-00000009"] and all(e[ETAG] for e in hooks.values())
    assert list(store.read_range(pk, "hook-", "hook.", 1)) == ["hook-00000003"]
    assert set(store.read_partition(pk)) == {"order", "state"} and len(store.read_history(pk, 0, 100)) == 7


def check_search_index(store: Store) -> None:
    # key ranges, ascending; upserts and deletes from many threads at once (group-committed in the
    # Table store), one caller deleting a row that is not there without failing the others
    tag = _pk()[:8]
    barrier = threading.Barrier(10)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        barrier.wait()
        try:
            store.write_index([SearchRow(f"t-{tag}-{n:02d}", "o", failure_count=n),
                               SearchRow(f"u-{tag}-{n:02d}", "o", failure_count=n)],
                              [f"t-{tag}-missing-{n}"] if n == 3 else [])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rows = store.query_index(f"t-{tag}-", f"t-{tag}.", 100)
    assert [r.failure_count for r in rows] == list(range(10))
    assert [r.failure_count for r in store.query_index(f"t-{tag}-04", f"t-{tag}.", 3)] == [4, 5, 6]
    store.write_index([SearchRow(f"t-{tag}-04", "o", failure_count=40)], [f"t-{tag}-05", f"u-{tag}-05"])
    assert [r.failure_count for r in store.query_index(f"t-{tag}-03", f"t-{tag}-07", 100)] == [3, 40, 6]
    assert len(store.query_index(f"u-{tag}-", f"u-{tag}.", 100)) == 9
    store.write_index([], [r.row_key for r in store.query_index(f"t-{tag}-", f"u-{tag}.", 100)])
    assert store.query_index(f"t-{tag}-", f"u-{tag}.", 100) == []


def check_search_index_in_shards(store: Store) -> None:
    # the same contract with the index in 8 shards: a range read merges them (the keys' last parts
    # differ, so the rows are spread over the shards)
    before = store.shards
    try:
        store.shards = 8
        check_search_index(store)
    finally:
        store.shards = before


def check_search_index_in_shards_reads_a_shard_again(store: Store) -> None:
    # 40 rows over 8 shards, pages smaller than a shard's share of them: a page reads each shard's
    # share first, then more of a shard that may still hold a row of the page (``RowKey gt`` its last
    # row read), and lists the rows in order, each once, whatever the page size
    tag, before = _pk()[:8], store.shards
    keys = sorted(f"w-{tag}-{uuid.uuid4().hex}" for _ in range(40))
    try:
        store.shards = 8
        store.write_index([SearchRow(k, k.rsplit("-", 1)[-1]) for k in keys], [])
        for limit in (1, 5, 9, 17, 40, 41):
            low, seen = f"w-{tag}-", []
            while True:
                rows = store.query_index(low, f"w-{tag}.", limit + 1)
                seen += [r.row_key for r in rows[:limit]]
                if len(rows) <= limit:
                    break
                low = rows[limit].row_key
            assert seen == keys, limit
        store.write_index([], keys)
    finally:
        store.shards = before


def check_search_index_legacy_partition(store: Store) -> None:
    # rows written before the shards (the one partition ``orders``) are read as one more shard, marked
    # legacy, a key in both once (the shard's); a delete goes to the shard; drop_legacy_index empties it
    tag, before = _pk()[:8], store.shards
    ids = [uuid.uuid4().hex for _ in range(6)]
    keys = [f"v-{tag}-{n}-{oid}" for n, oid in enumerate(ids)]

    def listed() -> list[tuple[int | None, bool]]:
        return [(r.failure_count, r.legacy) for r in store.query_index(f"v-{tag}-", f"v-{tag}.", 100)]

    try:
        store.shards = 1
        store.write_index([SearchRow(keys[n], ids[n], failure_count=n) for n in range(4)], [])
        assert [r for r in store.legacy_index(1000) if r.row_key.startswith(f"v-{tag}-")] == []  # the index itself
        store.shards = 8
        store.write_index([SearchRow(keys[n], ids[n], failure_count=10 + n) for n in range(2, 6)], [])
        assert listed() == [(0, True), (1, True), (12, False), (13, False), (14, False), (15, False)]
        assert [r.failure_count for r in store.query_index(f"v-{tag}-", f"v-{tag}.", 3)] == [0, 1, 12]
        assert store.count_index(f"v-{tag}-", f"v-{tag}.", 100) == (6, False)
        assert store.count_index(f"v-{tag}-", f"v-{tag}.", 5) == (5, True)
        legacy = [r for r in store.legacy_index(1000) if r.row_key.startswith(f"v-{tag}-")]
        assert [(r.failure_count, r.legacy) for r in legacy] == [(0, False), (1, False), (2, False), (3, False)]
        store.write_index([], [keys[2]])  # the shard's row: the legacy one is read again
        assert listed() == [(0, True), (1, True), (2, True), (13, False), (14, False), (15, False)]
        store.shards = 1  # nothing of the shards went to ``orders``
        assert listed() == [(0, False), (1, False), (2, False), (3, False)]
        store.shards = 8
        store.drop_legacy_index([r.row_key for r in legacy])
        store.drop_legacy_index([r.row_key for r in legacy])  # a row already gone is fine
        assert listed() == [(13, False), (14, False), (15, False)]
        store.write_index([], keys[3:])
        assert listed() == []
    finally:
        store.shards = before


def check_transact_returns_the_etags_a_read_returns(store: Store) -> None:
    """Every created or replaced row's new ETag (the fencing token is built on them, ``shared.core.fence``)."""
    pk = _pk()
    rows = [{"RowKey": k, "n": i} for i, k in enumerate(("order", "state", "step-00-a", "step-01-b", "z"))]
    etags = store.transact(pk, [Op("create", r) for r in rows])
    read = store.read_partition(pk)
    assert etags == {k: read[k][ETAG] for k in ("order", "state", "step-00-a", "step-01-b")} | {
        "z": store.read_row(pk, "z")[ETAG]}  # type: ignore[index]
    mixed = [Op("replace", {"RowKey": "state", "n": 9}, etag=read["state"][ETAG]),
             Op("create", {"RowKey": history_row_key(1), "e": "x"}),
             Op("delete", {"RowKey": "step-01-b"}, etag=read["step-01-b"][ETAG]),
             Op("replace", {"RowKey": "step-00-a", "n": 8}, etag=read["step-00-a"][ETAG])]
    etags = store.transact(pk, mixed)
    after = store.read_partition(pk)
    history = store.read_history(pk, 0, 10)
    assert etags == {"state": after["state"][ETAG], "step-00-a": after["step-00-a"][ETAG],
                     history_row_key(1): history[0].etag}  # the deleted row has none
    assert etags["state"] != read["state"][ETAG]
    assert after["order"][ETAG] == read["order"][ETAG]  # not written: unchanged


def check_read_rows_is_the_whole_partition_with_etags(store: Store) -> None:
    """One query returns every row of the partition (RowKeys before ``order`` and history rows too),
    each with the ETag a point read returns, and no row of another partition."""
    pk, other = _pk(), _pk()
    keys = ["delivery", history_row_key(1), "shipping"]
    store.transact(pk, [Op("create", {"RowKey": rk, "n": i}) for i, rk in enumerate(keys)])
    store.transact(other, [Op("create", {"RowKey": "inventory", "n": 9})])
    rows = store.read_rows(pk, 1000)
    assert sorted(rows) == sorted(keys)
    for i, rk in enumerate(keys):
        point = store.read_row(pk, rk)
        assert point is not None and rows[rk][ETAG] == point[ETAG] and rows[rk]["n"] == i
    assert len(store.read_rows(pk, 2)) == 2 and store.read_rows(_pk(), 10) == {}

ALL = [check_transact_returns_the_etags_a_read_returns, check_create_conflict_is_atomic, check_etag_replace,
       check_replace_removes_absent_and_none, check_search_index_in_shards_reads_a_shard_again,
       check_replace_missing_row_conflicts, check_index, check_index_shards_of_a_minute_are_due_with_it,
       check_injection_safe_keys,
       check_mixed_transaction_and_values, check_delete_needs_current_etag, check_index_many_rows_of_one_bucket,
       check_history_is_apart_from_live_rows, check_search_index, check_read_rows_is_the_whole_partition_with_etags,
       check_search_index_in_shards, check_search_index_legacy_partition]
