"""The in-memory store honours the store contract (tests/unit/store_contract.py)."""

from __future__ import annotations

import pytest

from shared.core.rows import Op
from shared.storage.memory import MemoryStore
from shared.storage.store import TooLarge
from tests.unit import store_contract


@pytest.mark.parametrize("check", store_contract.ALL, ids=[c.__name__ for c in store_contract.ALL])
def test_contract(check) -> None:  # type: ignore[no-untyped-def]
    check(MemoryStore())


def test_limits() -> None:
    store = MemoryStore()
    with pytest.raises(TooLarge):
        store.transact("p", [Op("create", {"RowKey": f"r{i}"}) for i in range(101)])
    with pytest.raises(TooLarge):
        store.transact("p", [Op("create", {"RowKey": "a"}), Op("create", {"RowKey": "b", "s": "x" * 40000})])
    assert store.read_partition("p") == {}
    with pytest.raises(ValueError):
        store.transact("p", [Op("create", {"RowKey": "a"}), Op("create", {"RowKey": "a"})])
