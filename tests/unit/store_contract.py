"""The store contract, run against the in-memory twin (unit) and Table Storage on Azurite
(integration): the core's tests are only as good as the twin's fidelity to the real thing."""

from __future__ import annotations

import uuid

import pytest

from shared.store import ETAG, Conflict, Op, Store


def _pk() -> str:
    return uuid.uuid4().hex


def check_create_conflict_is_atomic(store: Store) -> None:
    pk = _pk()
    store.transact(pk, [Op("create", {"RowKey": "a", "x": 1})])
    with pytest.raises(Conflict):
        store.transact(pk, [Op("create", {"RowKey": "b", "x": 2}), Op("create", {"RowKey": "a", "x": 3})])
    rows = store.read_partition(pk)
    assert set(rows) == {"a"} and rows["a"]["x"] == 1  # 'b' was not written: all or nothing


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
    store.put_index("202611220800", f"{tag}:a", {"OrderId": tag, "Lease": "x", "Due": "2026-11-22T08:00:00+00:00"})
    store.put_index("202611220801", f"{tag}:b", {"OrderId": tag, "Lease": "y", "Due": "2026-11-22T08:01:00+00:00"})
    store.put_index("202611220900", f"{tag}:c", {"OrderId": tag, "Lease": "z", "Due": "2026-11-22T09:00:00+00:00"})
    due = [r["RowKey"] for r in store.due_index("202611220801", 100) if r["RowKey"].startswith(tag)]
    assert due == [f"{tag}:a", f"{tag}:b"]
    store.delete_index("202611220800", f"{tag}:a")
    store.delete_index("202611220800", f"{tag}:a")  # idempotent
    due = [r["RowKey"] for r in store.due_index("202611220801", 100) if r["RowKey"].startswith(tag)]
    assert due == [f"{tag}:b"]
    store.delete_index("202611220801", f"{tag}:b")
    store.delete_index("202611220900", f"{tag}:c")


def check_injection_safe_keys(store: Store) -> None:
    # a partition key with OData syntax in it is just a value (parameterised filters)
    nasty = "x' or PartitionKey ne 'y"
    assert store.read_partition(nasty) == {}
    assert store.read_row(nasty, "state") is None


ALL = [check_create_conflict_is_atomic, check_etag_replace, check_replace_removes_absent_and_none,
       check_replace_missing_row_conflicts, check_index, check_injection_safe_keys]
