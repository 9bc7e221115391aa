"""One local stack (Azurite, the Service Bus emulator, the remote services, the local Functions
host with the app, one instance) for the whole hostile-input session; stopped by PID at the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local.stack import Stack
from tests.hostile.stackutil import Tables, start_stack


@pytest.fixture(scope="session")
def hostile_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_stack(tmp_path_factory.mktemp("hostile-stack"))
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def tables(hostile_stack: Stack) -> Iterator[Tables]:
    t = Tables(hostile_stack)
    yield t
    t.close()
