"""The background flush loop (shared/observability/periodic.py)."""

from __future__ import annotations

import logging

import pytest

from shared.observability.periodic import Periodic


def test_a_failing_flush_is_logged_and_kept_for_the_next_round(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def flush() -> None:
        calls.append(1)
        raise RuntimeError("store down")

    periodic = Periodic(flush, 60, name="t", event="t.flush_failed")
    with caplog.at_level(logging.WARNING):
        periodic._once()
        periodic._once()
    assert len(calls) == 2
    assert sum("t.flush_failed" in r.getMessage() for r in caplog.records) == 2
