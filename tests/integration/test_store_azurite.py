"""The store contract on real Table Storage (Azurite): the same checks the in-memory twin passes,
once with each way of reaching the tables (``shared.storage.tables``: the REST path and the SDK's)."""

from __future__ import annotations

import pytest

from shared.storage.table_store import TableStore
from tests.unit import store_contract

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("check", store_contract.ALL, ids=[c.__name__ for c in store_contract.ALL])
def test_contract(check, path_store: TableStore) -> None:  # type: ignore[no-untyped-def]
    check(path_store)

