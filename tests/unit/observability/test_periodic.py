"""The background flush loop (shared/observability/periodic.py)."""

from __future__ import annotations

import logging

import pytest
import requests

from local.procs import free_port
from shared.observability import telemetry
from shared.observability.periodic import Periodic
from tests import telemetry_support


def _call_a_closed_port() -> None:
    requests.get(f"http://127.0.0.1:{free_port()}/", timeout=2)


def test_a_flush_makes_no_trace_of_its_own_requests() -> None:
    """A flush belongs to no order: its requests (here, one that fails) start no root trace."""
    telemetry.setup({})  # the urllib3 instrumentation (requests' calls go through urllib3)
    with telemetry_support.capture() as exporter:
        with pytest.raises(requests.ConnectionError):
            _call_a_closed_port()
        traced = len(exporter.get_finished_spans())
        Periodic(_call_a_closed_port, 60, name="t", event="t.failed")._once()
        assert len(exporter.get_finished_spans()) == traced >= 1  # the same call outside a flush is traced


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
