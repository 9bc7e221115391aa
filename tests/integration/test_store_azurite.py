"""The store contract on real Table Storage (Azurite): the same checks the in-memory twin passes,
once with each way of reaching the tables (``shared.storage.tables``: the REST path and the SDK's)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from shared.storage.table_store import TableStore
from tests.unit import store_contract

pytestmark = pytest.mark.integration


@pytest.fixture(params=["rest", "sdk"])
def table_store(request: pytest.FixtureRequest, table_service: Any) -> Iterator[TableStore]:
    """A store on fresh tables reached by the path the parameter names."""
    suffix = uuid.uuid4().hex[:10]
    state = table_service.create_table_if_not_exists(f"orders{suffix}")
    deadlines = table_service.create_table_if_not_exists(f"deadlines{suffix}")
    search = table_service.create_table_if_not_exists(f"orderindex{suffix}")
    store = TableStore.of(state, deadlines, search, rest=request.param == "rest")
    try:
        assert store.path == request.param
        yield store
    finally:
        table_service.delete_table(f"orders{suffix}")
        table_service.delete_table(f"deadlines{suffix}")
        table_service.delete_table(f"orderindex{suffix}")


@pytest.mark.parametrize("check", store_contract.ALL, ids=[c.__name__ for c in store_contract.ALL])
def test_contract(check, table_store: TableStore) -> None:  # type: ignore[no-untyped-def]
    check(table_store)

