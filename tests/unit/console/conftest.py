"""The console's unit tests: each starts with no kept peek receiver (shared.console.receivers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.console.receivers import close_peek_receivers


@pytest.fixture(autouse=True)
def no_kept_receivers() -> Iterator[None]:
    close_peek_receivers()
    yield
    close_peek_receivers()
