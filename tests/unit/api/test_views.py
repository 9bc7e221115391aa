"""A step waiting on an open breaker, as the API shows it (``shared.api.views``, ``shared.api.search``):
``Waiting`` on its remote with the breaker's next probe, in the order, its step and the search, and
nothing of it once the wait has ended."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from shared.api.orders import get_order
from shared.api.search import search_orders
from shared.core.breaker.state import BreakerRow, BreakerState
from shared.core.times import iso
from shared.scheduler import handle_reply
from shared.storage.breakers import read_breaker, write_breaker
from tests.unit.core.statemachine.test_waiting import S, refund_in_flight, resume, shipping_in_flight, waiting_reply


def set_breaker(rt: Any, row: BreakerRow) -> None:
    write_breaker(rt.store, replace(row, etag=read_breaker(rt.store, "shipping").etag))


def found(rt: Any, oid: str) -> dict[str, Any]:
    result = search_orders(rt, {"state": "inFlight"})
    assert result.status == 200, result.body
    [order] = [o for o in result.body["orders"] if o["orderId"] == oid]
    return order


def test_a_waiting_step_shows_its_remote_and_the_next_probe_everywhere() -> None:
    rt, _agents, oid = shipping_in_flight()
    retry_at = rt.clock() + timedelta(seconds=5)
    set_breaker(rt, BreakerRow("shipping", BreakerState.OPEN, retry_at=retry_at, opens=1))
    assert handle_reply(rt, waiting_reply(oid, 1)) == "waiting"
    since, give_up = iso(rt.clock()), iso(rt.clock() + timedelta(seconds=300))
    body = get_order(rt, oid).body
    [step] = [s for s in body["steps"] if s["name"] == S]
    waiting = {"remote": "shipping", "since": since, "for": "breaker", "wakeAt": None, "breaker": "open",
               "nextProbeAt": iso(retry_at)}
    assert step["state"] == "Waiting" and step["waiting"] == waiting and step["attempt"] == 1
    assert step["waitingOn"] == "shipping" and step["waitingSince"] == since
    assert body["waiting"] == {"step": S, **waiting}
    assert body["processState"] == "Processing" and body["completeBy"] == give_up
    assert found(rt, oid)["waiting"] == {"step": S, "remote": "shipping", "giveUpAt": give_up,
                                         "breaker": "open", "nextProbeAt": iso(retry_at)}
    # a probe is out: no next probe time, the breaker says half-open
    set_breaker(rt, BreakerRow("shipping", BreakerState.HALF_OPEN, probe_id="p", opens=1,
                               probe_until=rt.clock() + timedelta(seconds=10)))
    assert get_order(rt, oid).body["waiting"]["breaker"] == "half-open"
    assert get_order(rt, oid).body["waiting"]["nextProbeAt"] is None
    # the breaker closed and the wait ended: nothing waits any more
    set_breaker(rt, BreakerRow("shipping", BreakerState.CLOSED, opens=1))
    assert resume(rt, oid, 1) == "resumed"
    body = get_order(rt, oid).body
    [step] = [s for s in body["steps"] if s["name"] == S]
    assert body["waiting"] is None and step["state"] == "Running" and step["waiting"] is None
    assert found(rt, oid)["waiting"] is None


def test_a_step_waiting_for_its_remotes_rate_shows_when_its_call_goes_again() -> None:
    """A rate limit's wait (a ``waiting`` reply claiming its wake-up, with no breaker opening):
    ``for`` says so, ``wakeAt`` is the wake-up the scheduler owes it; once woken and answered,
    nothing waits any more."""
    rt, _agents, oid = shipping_in_flight()
    until = rt.clock() + timedelta(seconds=4)
    assert handle_reply(rt, waiting_reply(oid, 1, wake=True, until=iso(until))) == "waiting"
    body = get_order(rt, oid).body
    [step] = [s for s in body["steps"] if s["name"] == S]
    assert step["state"] == "Waiting" and body["failureCount"] == 0
    assert {k: step["waiting"][k] for k in ("remote", "since", "for", "wakeAt")} == {
        "remote": "shipping", "since": iso(rt.clock()), "for": "rate", "wakeAt": iso(until)}
    assert body["waiting"]["for"] == "rate" and body["waiting"]["step"] == S
    assert resume(rt, oid, 1) == "resumed"
    [step] = [s for s in get_order(rt, oid).body["steps"] if s["name"] == S]
    assert step["waiting"] is None and step["state"] == "Running"


def test_a_waiting_compensation_shows_waiting_in_its_compensation() -> None:
    rt, _agents, oid = refund_in_flight()
    handle_reply(rt, waiting_reply(oid, 1, kind="compensation", step="charge-payment"))
    body = get_order(rt, oid).body
    [step] = [s for s in body["steps"] if s["name"] == "charge-payment"]
    assert step["state"] == "Done" and step["compensation"]["state"] == "Waiting"
    assert step["waiting"]["remote"] == "shipping" and body["waiting"]["step"] == "charge-payment"
    assert body["waiting"]["breaker"] == "closed"  # never written: the wait ends at its next probe
