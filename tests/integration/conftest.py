"""Integration fixtures: the app's real Table Storage store on Azurite (fixture ``azurite``),
one pair of fresh tables per test so sweeps of different tests never see each other's rows."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shared.runtime.clients import table_service_client
from shared.settings import Settings
from shared.storage.table_store import TableStore
from tests.unit.harness import REQUIRED_VALUES, Clock, CrashRuntime, DedupBus, make_runtime


@pytest.fixture(scope="session")
def table_service(azurite: Any) -> Any:
    settings = Settings.from_env({**REQUIRED_VALUES, "StateStorage": azurite.connection_string})
    return table_service_client(settings.state_storage)


@pytest.fixture
def table_store(table_service: Any) -> Iterator[TableStore]:
    suffix = uuid.uuid4().hex[:10]
    state = table_service.create_table_if_not_exists(f"orders{suffix}")
    deadlines = table_service.create_table_if_not_exists(f"deadlines{suffix}")
    search = table_service.create_table_if_not_exists(f"orderindex{suffix}")
    store = TableStore.of(state, deadlines, search)
    yield store
    # The console's figures go out now, into this test's own tables: a background flush seconds
    # later would land in the next test's counted window (or fail against deleted tables).
    if store.stats is not None:
        store.stats.flush(force=True)
    table_service.delete_table(f"orders{suffix}")
    table_service.delete_table(f"deadlines{suffix}")
    table_service.delete_table(f"orderindex{suffix}")


@pytest.fixture(params=["rest", "sdk"])
def path_store(request: pytest.FixtureRequest, table_service: Any) -> Iterator[TableStore]:
    """A store on fresh tables reached by the path the parameter names (the store's own REST path,
    or the SDK's)."""
    suffix = uuid.uuid4().hex[:10]
    tables = [f"orders{suffix}", f"deadlines{suffix}", f"orderindex{suffix}"]
    store = TableStore.of(*(table_service.create_table_if_not_exists(t) for t in tables), rest=request.param == "rest")
    try:
        assert store.path == request.param
        yield store
    finally:
        for t in tables:
            table_service.delete_table(t)


@pytest.fixture
def table_runtime(table_store: TableStore) -> Callable[..., CrashRuntime]:
    """Runtimes over the same tables (and, unless given, the same bus and clock)."""
    shared: dict[str, Any] = {"bus": DedupBus(), "clock": Clock()}

    def make(**kw: Any) -> CrashRuntime:
        kw.setdefault("bus", shared["bus"])
        kw.setdefault("clock", shared["clock"])
        return make_runtime(table_store, **kw)

    return make


class BarrierStore:
    """Wraps a store: every read_partition waits until ``parties`` readers have read, so that
    concurrent handlers all decide on the same rows before any of them writes (a real race)."""

    def __init__(self, inner: Any, parties: int) -> None:
        self.inner = inner
        self.barrier = threading.Barrier(parties, timeout=30)

    def read_partition(self, order_id: str) -> Any:
        rows = self.inner.read_partition(order_id)
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            pass
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
