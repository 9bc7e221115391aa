"""Group commit (``shared.group_commit``): concurrent callers share a transaction, a stale delete
fails no one else's writes; and the deadline index writer's deletes wait for the search index."""

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


def test_callers_that_queue_behind_a_transaction_share_the_next_one() -> None:
    table = FakeTable()
    table.gate = threading.Event()
    gc = GroupCommit(table, table.send)
    first = threading.Thread(target=gc.commit, args=("b", [_put("one")]))
    first.start()
    while not table.requests:
        threading.Event().wait(0.01)
    others = [threading.Thread(target=gc.commit, args=("b", [_put(k)])) for k in ("two", "three")]
    for t in others:
        t.start()
    for _ in range(500):  # until both wait behind the transaction in flight
        if len(gc._queued.get("b", [])) == 2:
            break
        threading.Event().wait(0.01)
    table.gate.set()
    for t in [first, *others]:
        t.join(5)
    assert table.requests[0] == ("upsert", [("upsert", "one")])
    assert sorted(table.requests[1][1]) == [("upsert", "three"), ("upsert", "two")]  # one transaction
    assert len(table.requests) == 2
    assert table.rows["b"] == {"one", "two", "three"}


def test_a_stale_delete_fails_only_its_own_caller_writes_and_is_ignored() -> None:
    table = FakeTable()
    table.rows["b"] = {"old"}
    gc = GroupCommit(table, table.send)
    errors = gc.commit_groups("b", [[_put("new")], [Write("delete", "gone"), Write("delete", "old")]])
    assert errors == [None, None]  # the delete of a missing row is fine one by one
    assert table.rows["b"] == {"new"}


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


def test_a_delete_waits_for_the_search_writes_queued_before_it() -> None:
    writer, table, search, _commit = _writer()
    table.rows["b"] = {"done-a", "done-b"}
    search.add([{"RowKey": "cat-processed-1-a"}], [])  # the final transition's index writes ...
    writer.delete("b", "done-a")  # ... then its deadline row's delete
    writer.flush()  # flushes the search queue first, then sends the delete
    assert table.rows["b"] == {"done-b"}
    # A delete queued while the search queue is being flushed (its order's writes may be in
    # the queue that flush did not take) waits for the next round.
    real_flush = search.flush

    def flush_then_queue() -> None:
        real_flush()
        search.add([{"RowKey": "cat-processed-1-b"}], [])
        writer.delete("b", "done-b")

    search.flush = flush_then_queue  # type: ignore[method-assign]
    writer.flush()
    assert table.rows["b"] == {"done-b"}
    search.flush = real_flush  # type: ignore[method-assign]
    writer.flush()
    assert table.rows["b"] == set()


def test_a_failed_search_flush_holds_the_deletes_back() -> None:
    writer, table, search, commit = _writer()
    table.rows["b"] = {"done-a"}
    search.add([{"RowKey": "cat-processed-1-a"}], [])
    writer.delete("b", "done-a")
    commit.fail = True
    writer.flush()  # the search flush fails: no delete goes out
    assert table.rows["b"] == {"done-a"}
    commit.fail = False
    writer.flush()
    assert table.rows["b"] == set()
