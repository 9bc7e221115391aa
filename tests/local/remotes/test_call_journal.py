"""The simulator's call journal (GET /_calls) and down windows (/_stats downWindows): what a chaos
run reads to count the calls made to a dead remote and to tell the outage from other faults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from local.remotes.client import RemotesClient
from local.remotes.journal import CallJournal, DownWindows
from local.remotes.server import Simulator

from .conftest import call

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _body(order_id: str) -> dict[str, object]:
    return {"orderId": order_id, "order": {"items": [{"sku": "SKU-1", "quantity": 1}]}, "context": {}}


def test_down_windows_count_only_the_calls_received_while_down() -> None:
    w = DownWindows()
    w.count_call("shipping", T0)  # up: not in a window
    w.set_down("shipping", True, T0 + timedelta(seconds=1))
    w.set_down("shipping", True, T0 + timedelta(seconds=2))  # still down: the same window
    for s in (3, 4, 5):
        w.count_call("shipping", T0 + timedelta(seconds=s))
    w.count_call("payment", T0 + timedelta(seconds=3))  # another service
    w.set_down("shipping", False, T0 + timedelta(seconds=6))
    w.count_call("shipping", T0 + timedelta(seconds=7))
    w.set_down("shipping", "reset", T0 + timedelta(seconds=8))
    w.close_all(T0 + timedelta(seconds=9))
    first, second = w.snapshot()
    assert first == {"service": "shipping", "mode": "503", "from": (T0 + timedelta(seconds=1)).isoformat(),
                     "to": (T0 + timedelta(seconds=6)).isoformat(), "calls": 3,
                     "firstCall": (T0 + timedelta(seconds=3)).isoformat(),
                     "lastCall": (T0 + timedelta(seconds=5)).isoformat()}
    assert second["mode"] == "reset" and second["calls"] == 0 and second["to"] is not None


def test_journal_filters_and_forgets_the_oldest() -> None:
    j = CallJournal(limit=3)
    for s, svc in enumerate(("shipping", "payment", "shipping", "shipping")):
        j.record(T0 + timedelta(seconds=s), svc, "ship", f"k{s}", None)
    assert [e["idempotencyKey"] for e in j.entries()] == ["k1", "k2", "k3"]
    assert [e["idempotencyKey"] for e in j.entries("shipping", (T0 + timedelta(seconds=3)).isoformat())] == ["k3"]
    assert j.summary() == {"received": 4, "kept": 3, "dropped": 1}


def test_simulator_journals_each_call_with_its_fault() -> None:
    sim = Simulator(seed=1)
    sim.set_faults("shipping", {"down": True})
    assert sim.call("shipping", "ship", "o-1:ship", _body("o-1")).status == 503
    sim.set_faults("shipping", {"lostResponseRate": 1.0})
    assert sim.call("shipping", "ship", "o-2:ship", _body("o-2")).status == 503  # applied, answer lost
    sim.set_faults("shipping", {})
    assert sim.call("shipping", "ship", "o-3:ship", _body("o-3")).status == 200
    assert [(c["idempotencyKey"], c["fault"]) for c in sim.calls("shipping")] == [
        ("o-1:ship", "down"), ("o-2:ship", "lostResponse"), ("o-3:ship", None)]
    (window,) = sim.stats()["downWindows"]
    assert window["calls"] == 1 and window["to"] is not None
    sim.reset_state()
    assert sim.calls() == [] and sim.stats()["downWindows"] == []


@pytest.mark.integration
def test_calls_endpoint_and_down_windows_over_http(client: RemotesClient) -> None:
    client.set_faults("shipping", down=True)
    for i in range(3):
        assert call(client.base_url, "shipping", "ship", f"o-{i}", f"o-{i}:ship").status_code == 503
    client.set_faults("shipping", down="reset")  # another window (another mode)
    client.reset_faults()
    assert call(client.base_url, "shipping", "ship", "o-9", "o-9:ship").status_code == 200
    windows = client.down_windows()
    assert [(w["mode"], w["calls"]) for w in windows] == [("503", 3), ("reset", 0)]
    assert all(w["to"] for w in windows)
    calls = client.calls(service="shipping")
    assert [c["fault"] for c in calls] == ["down", "down", "down", None]
    assert client.calls(service="shipping", since=calls[-1]["at"]) == calls[-1:]
    assert client.calls(service="payment") == []
