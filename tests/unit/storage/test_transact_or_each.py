"""shared.storage.store.transact_or_each: transactions of at most 100 writes; a chunk refused with
Conflict is written again one write at a time; the other chunks are untouched."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from shared.storage.store import MAX_BATCH_OPS, Conflict, transact_or_each


def test_chunks_of_100_and_a_refused_chunk_one_at_a_time() -> None:
    writes = list(range(250))
    transactions: list[list[int]] = []
    alone: list[int] = []

    def transact(chunk: Sequence[int]) -> None:
        transactions.append(list(chunk))
        if 150 in chunk:  # one write of the second chunk is refused: the whole transaction fails
            raise Conflict("gone")

    transact_or_each(transact, writes, alone.append)
    assert [len(t) for t in transactions] == [MAX_BATCH_OPS, MAX_BATCH_OPS, 50]
    assert alone == list(range(100, 200))


def test_a_refused_transaction_of_one_write_is_not_tried_again() -> None:
    tried: list[list[int]] = []
    alone: list[int] = []

    def transact(chunk: Sequence[int]) -> None:
        tried.append(list(chunk))
        raise Conflict("gone")

    transact_or_each(transact, list(range(101)), alone.append)
    assert tried == [list(range(100)), [100]] and alone == list(range(100))


def test_another_error_is_not_swallowed() -> None:
    def transact(chunk: Sequence[int]) -> None:
        raise TimeoutError("the service did not answer")

    with pytest.raises(TimeoutError):
        transact_or_each(transact, [1, 2], lambda w: None)
