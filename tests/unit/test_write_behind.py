"""The search index's write-behind queue: what it sends, coalesced, and what it keeps on failure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from shared.table_batch import Write
from shared.write_behind import MAX_TRIES, WriteBehind


class FakeCommit:
    """Records each flush's groups; fails the next ``fail`` flushes."""

    def __init__(self) -> None:
        self.flushes: list[list[list[tuple[str, str]]]] = []
        self.fail = 0

    def commit_groups(self, partition: str, groups: Sequence[Sequence[Write]]) -> list[BaseException | None]:
        assert partition == "orders"
        self.flushes.append([[(w.kind, w.row_key) for w in g] for g in groups])
        if self.fail:
            self.fail -= 1
            return [OSError("down") for _g in groups]
        return [None for _g in groups]


def _queue() -> tuple[WriteBehind, FakeCommit]:
    commit = FakeCommit()
    return WriteBehind(commit, interval=3600), commit  # type: ignore[arg-type]


def _row(key: str, **props: Any) -> dict[str, Any]:
    return {"RowKey": key, **props}


def test_writes_are_grouped_by_order_and_the_last_write_of_a_row_wins() -> None:
    q, commit = _queue()
    q.add([_row("all-1-a", N=1), _row("cat-inFlight-1-a")], [])
    q.add([_row("all-2-b")], [])
    q.add([_row("all-1-a", N=2), _row("cat-processed-1-a")], ["cat-inFlight-1-a"])
    q.flush()
    [groups] = commit.flushes
    assert sorted(map(sorted, groups)) == [[("upsert", "all-1-a"), ("upsert", "cat-processed-1-a")],
                                           [("upsert", "all-2-b")]]
    q.flush()
    assert len(commit.flushes) == 1  # nothing queued: nothing sent


def test_a_row_put_and_deleted_between_flushes_is_not_sent_but_one_there_before_is_deleted() -> None:
    q, commit = _queue()
    q.add([_row("cat-inFlight-1-a")], [])
    q.add([], ["cat-inFlight-1-a"])  # submitted and finished within one flush: the row never existed
    q.add([], ["cat-attention-1-b"])  # there before this window: deleted ...
    q.add([_row("cat-attention-1-b")], [])  # ... put back ...
    q.add([], ["cat-attention-1-b"])  # ... and deleted again: the delete must still go out
    q.flush()
    assert commit.flushes == [[[("delete", "cat-attention-1-b")]]]


def test_a_failed_flush_keeps_its_writes_unless_replaced_and_raises() -> None:
    q, commit = _queue()
    q.add([_row("all-1-a", N=1), _row("cat-inFlight-1-a")], [])
    commit.fail = 1
    with pytest.raises(RuntimeError):
        q.flush()
    q.add([_row("all-1-a", N=2)], [])  # a later write of one row replaces the failed one
    q.flush()
    assert sorted(commit.flushes[-1][0]) == [("upsert", "all-1-a"), ("upsert", "cat-inFlight-1-a")]
    assert q._queued == {}


def test_writes_that_keep_failing_are_dropped_after_max_tries() -> None:
    q, commit = _queue()
    q.add([_row("all-1-a")], [])
    commit.fail = MAX_TRIES
    for _ in range(MAX_TRIES):
        with pytest.raises(RuntimeError):
            q.flush()
    assert q._queued == {}  # given up (logged): the deadline row it held back lets the sweep repair
