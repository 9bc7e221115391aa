"""Group commit (``shared.group_commit``) and the deadline index writer on it: concurrent
callers share a transaction, and queued deletes ride along with a put at no request of their own."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from shared.group_commit import GroupCommit
from shared.table_batch import Write
from shared.table_store import _IndexWriter
from shared.write_behind import WriteBehind


class FakeTable:
    """Rows per partition; every request is recorded; a transaction with a delete of a missing
    row fails whole, as Table Storage's does."""

    def __init__(self) -> None:
        self.rows: dict[str, set[str]] = {}
        self.requests: list[tuple[str, list[tuple[str, str]]]] = []
        self.gate: threading.Event | None = None  # when set, transactions wait for it

    def send(self, partition: str, writes: Sequence[Write]) -> None:
        self.requests.append(("batch", [(w.kind, w.row_key) for w in writes]))
        if self.gate is not None:
            self.gate.wait(5)
        rows = self.rows.setdefault(partition, set())
        if any(w.kind == "delete" and w.row_key not in rows for w in writes):
            raise OSError("404 in a batch")
        for w in writes:
            (rows.add if w.kind == "upsert" else rows.discard)(w.row_key)

    def delete_entity(self, partition_key: str, row_key: str) -> None:
        self.requests.append(("delete", [("delete", row_key)]))
        self.rows.setdefault(partition_key, set()).discard(row_key)  # a 404 is ignored

    def upsert_entity(self, entity: dict[str, Any], mode: Any = None) -> None:
        self.requests.append(("upsert", [("upsert", entity["RowKey"])]))
        if self.gate is not None:
            self.gate.wait(5)
        self.rows.setdefault(entity["PartitionKey"], set()).add(entity["RowKey"])


def _put(key: str) -> Write:
    return Write("upsert", key, {"Due": "x"})


def test_a_lone_caller_takes_the_riders_into_its_own_transaction() -> None:
    table = FakeTable()
    table.rows["b"] = {"old1", "old2"}
    gc = GroupCommit(table, table.send)
    asked: list[int] = []

    def riders(room: int) -> list[Write]:
        asked.append(room)
        return [Write("delete", "old1"), Write("delete", "old2")]

    gc.commit("b", [_put("new")], riders=riders)
    assert asked == [99]  # room for the rest of a 100-write transaction
    assert table.requests == [("batch", [("delete", "old1"), ("delete", "old2"), ("upsert", "new")])]
    assert table.rows["b"] == {"new"}


def test_a_stale_rider_never_fails_the_put() -> None:
    table = FakeTable()
    table.rows["b"] = {"old1"}
    gc = GroupCommit(table, table.send)
    gc.commit("b", [_put("new")], riders=lambda room: [Write("delete", "gone"), Write("delete", "old1")])
    assert table.rows["b"] == {"new"}  # committed; the riders went one by one (404 ignored)
    kinds = [kind for kind, _w in table.requests]
    assert kinds[0] == "batch" and "delete" in kinds


def test_a_caller_that_queues_behind_a_transaction_takes_no_riders() -> None:
    table = FakeTable()
    table.gate = threading.Event()
    gc = GroupCommit(table, table.send)
    asked: list[str] = []

    def riders(name: str) -> Any:
        def take(room: int) -> list[Write]:
            asked.append(name)
            return []
        return take

    first = threading.Thread(target=gc.commit, args=("b", [_put("one")]), kwargs={"riders": riders("one")})
    first.start()
    while not table.requests:
        threading.Event().wait(0.01)
    second = threading.Thread(target=gc.commit, args=("b", [_put("two")]), kwargs={"riders": riders("two")})
    second.start()
    threading.Event().wait(0.1)
    table.gate.set()
    first.join(5)
    second.join(5)
    assert asked == ["one"]
    assert table.rows["b"] == {"one", "two"}


class FakeCommit:
    def __init__(self) -> None:
        self.fail = False

    def commit_groups(self, partition: str, groups: Sequence[Sequence[Write]]) -> list[BaseException | None]:
        return [OSError("down") if self.fail else None for _g in groups]


def _writer() -> tuple[_IndexWriter, FakeTable, WriteBehind, FakeCommit]:
    table = FakeTable()
    commit = FakeCommit()
    search = WriteBehind(commit, interval=3600)  # type: ignore[arg-type]
    return _IndexWriter(table, table.send, delete_interval=3600, search=search), table, search, commit  # type: ignore[arg-type]


def test_a_delete_rides_a_put_only_once_the_search_writes_before_it_are_committed() -> None:
    writer, table, search, _commit = _writer()
    table.rows["b"] = {"done-a"}
    search.add([{"RowKey": "cat-processed-1-a"}], [])  # the final transition's index writes ...
    writer.delete("b", "done-a")  # ... then its deadline row's delete
    writer.put({"PartitionKey": "b", "RowKey": "new-1"})
    assert table.requests == [("upsert", [("upsert", "new-1")])]  # not yet: its search writes are queued
    search.flush()
    writer.put({"PartitionKey": "b", "RowKey": "new-2"})
    assert table.requests[-1] == ("batch", [("delete", "done-a"), ("upsert", "new-2")])
    assert table.rows["b"] == {"new-1", "new-2"}


def test_a_failed_search_flush_holds_the_deletes_back() -> None:
    writer, table, search, commit = _writer()
    table.rows["b"] = {"done-a"}
    search.add([{"RowKey": "cat-processed-1-a"}], [])
    writer.delete("b", "done-a")
    commit.fail = True
    writer.flush()  # the search flush fails: no delete goes out
    writer.put({"PartitionKey": "b", "RowKey": "new-1"})
    assert "done-a" in table.rows["b"]
    commit.fail = False
    writer.flush()
    assert table.rows["b"] == {"new-1"}


def test_deletes_of_another_bucket_do_not_ride() -> None:
    writer, table, search, _commit = _writer()
    table.rows["a"] = {"done-a"}
    writer.delete("a", "done-a")
    search.flush()
    writer.put({"PartitionKey": "b", "RowKey": "new-1"})
    assert table.requests == [("upsert", [("upsert", "new-1")])]
    writer.flush()
    assert table.rows["a"] == set()
    assert writer._deletes == {}  # emptied buckets are not kept
