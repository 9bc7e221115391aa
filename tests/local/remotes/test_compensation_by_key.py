"""Compensation by idempotency key (``compensates``), and tombstones for compensating nothing.

A step that timed out has an unknown outcome: the caller has no result id, only the key the
original call was sent with. release/refund find the effect by that key; if nothing was ever
applied under it they answer "nothing to undo" and tombstone the key, so that a late original
call with it is refused (409) and applies nothing.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from local.remotes.client import RemotesClient

from .conftest import order

pytestmark = pytest.mark.integration


def post(base: str, service: str, operation: str, order_id: str, key: str, *,
         compensates: str | None = None, step: str = "", context: dict[str, Any] | None = None,
         timeout: float = 10.0) -> requests.Response:
    body: dict[str, Any] = {"orderId": order_id, "order": order(), "context": context or {}}
    if compensates is not None:
        body["compensates"] = {"step": step, "idempotencyKey": compensates}
    return requests.post(f"{base}/{service}/{operation}", json=body, headers={"Idempotency-Key": key},
                         timeout=timeout)


def test_refund_by_key_after_a_lost_charge_response_refunds_exactly_once(client: RemotesClient) -> None:
    base = client.base_url
    client.set_faults("payment", lostResponseRate=1.0)
    r = post(base, "payment", "charge", "o-1", "o-1:charge-payment")
    assert r.status_code == 503  # the card was charged; the caller does not know
    [charge] = client.ledger()
    assert charge["operation"] == "charge" and charge["kind"] == "effect"
    # the refund's own response is lost too: the retry under its key gets the stored answer
    r = post(base, "payment", "refund", "o-1", "o-1:charge-payment:compensate",
             compensates="o-1:charge-payment", step="charge-payment")
    assert r.status_code == 503
    client.reset_faults()
    r = post(base, "payment", "refund", "o-1", "o-1:charge-payment:compensate",
             compensates="o-1:charge-payment", step="charge-payment")
    assert r.status_code == 200 and r.json()["refundId"].startswith("ref-")
    again = post(base, "payment", "refund", "o-1", "o-1:charge-payment:compensate",
                 compensates="o-1:charge-payment", step="charge-payment")
    assert again.json() == r.json()
    effects = client.ledger()
    assert [e["operation"] for e in effects] == ["charge", "refund"]
    refund = effects[1]
    assert (refund["kind"], refund["compensates"]) == ("effect", "o-1:charge-payment")
    assert refund["paymentId"] == charge["result"]["paymentId"] and refund["amount"] == "19.98"
    # a second refund of the same charge under another key is refused; the charge's key replays
    r = post(base, "payment", "refund", "o-1", "other", compensates="o-1:charge-payment", step="charge-payment")
    assert r.status_code == 422 and "already refunded" in r.json()["error"]
    r = post(base, "payment", "charge", "o-1", "o-1:charge-payment")
    assert r.status_code == 200 and r.json() == charge["result"]
    assert len(client.ledger()) == 2 and client.duplicate_effects() == []


def test_refund_of_nothing_tombstones_the_key_and_a_late_charge_is_refused(client: RemotesClient) -> None:
    base = client.base_url
    r = post(base, "payment", "refund", "o-1", "o-1:charge-payment:compensate",
             compensates="o-1:charge-payment", step="charge-payment")
    assert r.status_code == 200 and r.json() == {"refundId": None, "nothingToUndo": True}
    [tomb] = client.ledger()
    assert (tomb["kind"], tomb["operation"], tomb["idempotencyKey"], tomb["compensates"]) == (
        "tombstone", "refund", "o-1:charge-payment:compensate", "o-1:charge-payment")
    # the compensation is idempotent on its own key
    r = post(base, "payment", "refund", "o-1", "o-1:charge-payment:compensate",
             compensates="o-1:charge-payment", step="charge-payment")
    assert r.json() == {"refundId": None, "nothingToUndo": True}
    # the original charge arrives late: refused, nothing applied, on every attempt
    for _ in range(2):
        r = post(base, "payment", "charge", "o-1", "o-1:charge-payment")
        assert r.status_code == 409 and r.json() == {"error": "compensated"}
    assert client.ledger() == [tomb]
    assert client.effects_by_order() == {}  # a tombstone is not an effect
    # other keys are not affected
    assert post(base, "payment", "charge", "o-2", "o-2:charge-payment").status_code == 200


def test_release_by_key_and_release_of_nothing(client: RemotesClient) -> None:
    base = client.base_url
    reservation = post(base, "inventory", "reserve", "o-1", "o-1:reserve-inventory").json()
    r = post(base, "inventory", "release", "o-1", "o-1:reserve-inventory:compensate",
             compensates="o-1:reserve-inventory", step="reserve-inventory")
    assert r.status_code == 200 and r.json() == {"released": reservation["reservationId"]}
    # nothing reserved under this key: tombstoned, and the late reserve is refused
    r = post(base, "inventory", "release", "o-2", "o-2:reserve-inventory:compensate",
             compensates="o-2:reserve-inventory", step="reserve-inventory")
    assert r.status_code == 200 and r.json() == {"released": None, "nothingToUndo": True}
    r = post(base, "inventory", "reserve", "o-2", "o-2:reserve-inventory")
    assert r.status_code == 409 and r.json() == {"error": "compensated"}
    assert [(e["orderId"], e["operation"], e["kind"]) for e in client.ledger()] == [
        ("o-1", "reserve", "effect"), ("o-1", "release", "effect"), ("o-2", "release", "tombstone")]


def test_compensating_a_rejected_call_is_nothing_to_undo_and_the_rejection_replays(client: RemotesClient) -> None:
    base = client.base_url
    client.set_faults("payment", rejectAmountOver="1")
    r = post(base, "payment", "charge", "o-1", "o-1:charge-payment")
    assert r.status_code == 422
    client.reset_faults()
    r = post(base, "payment", "refund", "o-1", "o-1:charge-payment:compensate",
             compensates="o-1:charge-payment", step="charge-payment")
    assert r.json() == {"refundId": None, "nothingToUndo": True}
    r = post(base, "payment", "charge", "o-1", "o-1:charge-payment")
    assert r.status_code == 422  # the stored answer of the key, as always
    assert [e["kind"] for e in client.ledger()] == ["tombstone"]


def test_compensation_by_key_checks_the_order_and_the_operation(client: RemotesClient) -> None:
    base = client.base_url
    post(base, "payment", "charge", "o-1", "o-1:charge-payment")
    r = post(base, "payment", "refund", "o-2", "o-2:x", compensates="o-1:charge-payment", step="charge-payment")
    assert r.status_code == 422 and "another order" in r.json()["error"]
    pay = post(base, "payment", "charge", "o-1", "o-1:other").json()
    r = post(base, "payment", "refund", "o-1", "o-1:y", compensates="o-1:charge-payment", step="charge-payment",
             context={"charge-payment": pay})
    assert r.status_code == 422 and "is not the effect of" in r.json()["error"]
    post(base, "inventory", "reserve", "o-1", "o-1:r")
    r = post(base, "inventory", "release", "o-1", "o-1:z", compensates="o-1:r", step="reserve-inventory")
    assert r.status_code == 200
    assert [e["operation"] for e in client.ledger()] == ["charge", "charge", "reserve", "release"]


@pytest.mark.parametrize("compensates", ["k", {"step": "charge-payment"}, {"idempotencyKey": ""},
                                         {"idempotencyKey": "o-1:c:compensate"}])
def test_malformed_compensates_is_400_and_not_stored(client: RemotesClient, compensates: Any) -> None:
    body = {"orderId": "o-1", "order": order(), "context": {}, "compensates": compensates}
    r = requests.post(f"{client.base_url}/payment/refund", json=body,
                      headers={"Idempotency-Key": "o-1:c:compensate"}, timeout=5)
    assert r.status_code == 400
    assert client.ledger() == []


def test_original_and_compensation_racing_end_consistent(client: RemotesClient) -> None:
    """The charge (slow) and its refund-by-key race: either the charge applied and the refund
    undid it, or the refund tombstoned the key and the charge was refused. Never a charge left."""
    base = client.base_url
    client.set_faults("payment", latencyMs=30)
    n = 16

    def one(i: int) -> tuple[int, int]:
        oid = f"race-{i}"
        with ThreadPoolExecutor(2) as pool:
            c = pool.submit(post, base, "payment", "charge", oid, f"{oid}:charge-payment")
            r = pool.submit(post, base, "payment", "refund", oid, f"{oid}:charge-payment:compensate",
                            compensates=f"{oid}:charge-payment", step="charge-payment")
            return c.result().status_code, r.result().status_code

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(n)))
    ledger = client.ledger()
    for i, (charge_status, refund_status) in enumerate(outcomes):
        mine = [(e["operation"], e["kind"]) for e in ledger if e["orderId"] == f"race-{i}"]
        assert refund_status == 200
        if charge_status == 200:
            assert mine == [("charge", "effect"), ("refund", "effect")], mine
        else:
            assert charge_status == 409 and mine == [("refund", "tombstone")], mine
    assert client.duplicate_effects() == []
