"""The four services per docs/contracts.md, through HTTP: bodies, validation, business rules, ledger."""

from __future__ import annotations

from decimal import Decimal

import pytest
import requests

from local.remotes.client import RemotesClient

from .conftest import call, order

pytestmark = pytest.mark.integration


def test_health(client: RemotesClient) -> None:
    h = client.health()
    assert h["status"] == "ok"
    assert set(h["services"]) == {"inventory", "payment", "shipping", "delivery"}


@pytest.mark.parametrize("service,operation", [
    ("inventory", "reserve"), ("inventory", "release"), ("payment", "charge"),
    ("payment", "refund"), ("shipping", "ship"), ("inventory", "reserve-licence"),
    ("inventory", "release-licence"), ("delivery", "deliver"),
])
def test_400_without_idempotency_key_and_no_effect(client: RemotesClient, service: str, operation: str) -> None:
    r = call(client.base_url, service, operation, "o-1", None)
    assert r.status_code == 400
    assert "Idempotency-Key" in r.json()["error"]
    r = call(client.base_url, service, operation, "o-1", "")
    assert r.status_code == 400
    assert client.ledger() == []


def test_unknown_service_and_operation_are_404(client: RemotesClient) -> None:
    assert call(client.base_url, "billing", "charge", "o", "k").status_code == 404
    assert call(client.base_url, "payment", "ship", "o", "k").status_code == 404
    assert requests.get(client.base_url + "/nothing", timeout=5).status_code == 404


def test_malformed_bodies_are_400_and_not_stored(client: RemotesClient) -> None:
    base = client.base_url
    r = requests.post(f"{base}/inventory/reserve", data=b"{not json", headers={"Idempotency-Key": "k1"}, timeout=5)
    assert r.status_code == 400
    r = requests.post(f"{base}/inventory/reserve", json={"order": order()}, headers={"Idempotency-Key": "k1"},
                      timeout=5)
    assert r.status_code == 400 and "orderId" in r.json()["error"]
    bad_items = order(items=[{"sku": "SKU-1", "quantity": 0, "unitPrice": "1"}])
    assert call(base, "inventory", "reserve", "o", "k1", body_order=bad_items).status_code == 400
    assert call(base, "payment", "charge", "o", "k2", body_order=order(total="abc")).status_code == 400
    assert call(base, "payment", "charge", "o", "k2", body_order=order(total="NaN")).status_code == 400
    assert call(base, "payment", "charge", "o", "k2", body_order=order(total="-1.00")).status_code == 400
    assert call(base, "payment", "charge", "o", "k2", body_order=order(currency="euro")).status_code == 400
    # A 400 is not stored: the same key with a fixed request goes through.
    assert call(base, "inventory", "reserve", "o", "k1").status_code == 200
    assert call(base, "payment", "charge", "o", "k2").status_code == 200
    assert [e["idempotencyKey"] for e in client.ledger()] == ["k1", "k2"]


def test_full_saga_bodies_and_ledger(client: RemotesClient) -> None:
    base = client.base_url
    r = call(base, "inventory", "reserve", "o-1", "o-1:reserve-inventory")
    assert r.status_code == 200
    reservation = r.json()
    assert set(reservation) == {"reservationId"}

    r = call(base, "payment", "charge", "o-1", "o-1:charge-payment")
    assert r.status_code == 200
    payment = r.json()
    assert set(payment) == {"paymentId", "amount"} and payment["amount"] == "19.98"

    r = call(base, "shipping", "ship", "o-1", "o-1:create-shipment",
             context={"reserve-inventory": reservation, "charge-payment": payment})
    assert r.status_code == 200 and set(r.json()) == {"shipmentId"}

    r = call(base, "payment", "refund", "o-1", "o-1:charge-payment:compensate", context={"charge-payment": payment})
    assert r.status_code == 200 and set(r.json()) == {"refundId"}
    r = call(base, "inventory", "release", "o-1", "o-1:reserve-inventory:compensate",
             context={"reserve-inventory": reservation})
    assert r.status_code == 200 and r.json() == {"released": reservation["reservationId"]}

    effects = client.ledger()
    assert [(e["service"], e["operation"]) for e in effects] == [
        ("inventory", "reserve"), ("payment", "charge"), ("shipping", "ship"),
        ("payment", "refund"), ("inventory", "release")]
    for e in effects:
        assert set(e) >= {"service", "operation", "idempotencyKey", "orderId", "result", "at"}
        assert e["orderId"] == "o-1"
    assert effects[0]["result"] == reservation and effects[1]["result"] == payment
    assert effects[3]["amount"] == "19.98" and effects[3]["paymentId"] == payment["paymentId"]
    assert client.ledger(order_id="o-1", service="payment") == effects[1:2] + effects[3:4]
    assert client.ledger(order_id="someone-else") == []
    assert client.effects_by_order()["o-1"]["payment/refund"] == 1
    assert client.duplicate_effects() == []


def test_money_is_exact_decimal(client: RemotesClient) -> None:
    base = client.base_url
    # 0.1 + 0.2 as floats is 0.30000000000000004; the total string must come back unchanged.
    r = call(base, "payment", "charge", "o-1", "k-1", body_order=order(total="0.30"))
    assert r.json()["amount"] == "0.30"
    # A JSON number is read as a Decimal too, never through float.
    r = requests.post(f"{base}/payment/charge", headers={"Idempotency-Key": "k-2", "Content-Type": "application/json"},
                      data=b'{"orderId": "o-2", "order": {"currency": "EUR", "total": 1234567890.123456789,'
                           b' "items": [{"sku": "S", "quantity": 1, "unitPrice": 1}]}}', timeout=5)
    assert r.status_code == 200
    assert r.json()["amount"] == "1234567890.123456789"
    assert Decimal(client.ledger(order_id="o-2")[0]["amount"]) == Decimal("1234567890.123456789")


def test_release_needs_the_reservation(client: RemotesClient) -> None:
    base = client.base_url
    r = call(base, "inventory", "release", "o-1", "o-1:r:c", context={})
    assert r.status_code == 422
    r = call(base, "inventory", "release", "o-1", "o-1:r:c2", context={"reserve-inventory": {"reservationId": "res-x"}})
    assert r.status_code == 422 and "unknown reservation" in r.json()["error"]
    reservation = call(base, "inventory", "reserve", "o-1", "o-1:r").json()
    # Another order cannot release it.
    r = call(base, "inventory", "release", "o-2", "o-2:r:c", context={"reserve-inventory": reservation})
    assert r.status_code == 422
    assert call(base, "inventory", "release", "o-1", "o-1:r:c3",
                context={"reserve-inventory": reservation}).status_code == 200
    # A second release under another key is refused: the stock must not be returned twice.
    r = call(base, "inventory", "release", "o-1", "o-1:r:c4", context={"reserve-inventory": reservation})
    assert r.status_code == 422 and "already released" in r.json()["error"]
    assert [e["operation"] for e in client.ledger()] == ["reserve", "release"]


def test_refund_needs_the_payment(client: RemotesClient) -> None:
    base = client.base_url
    r = call(base, "payment", "refund", "o-1", "o-1:c:c", context={"charge-payment": {"paymentId": "pay-x"}})
    assert r.status_code == 422 and "unknown payment" in r.json()["error"]
    payment = call(base, "payment", "charge", "o-1", "o-1:c").json()
    assert call(base, "payment", "refund", "o-2", "o-2:c:c",
                context={"charge-payment": payment}).status_code == 422
    assert call(base, "payment", "refund", "o-1", "o-1:c:c2", context={"charge-payment": payment}).status_code == 200
    r = call(base, "payment", "refund", "o-1", "o-1:c:c3", context={"charge-payment": payment})
    assert r.status_code == 422 and "already refunded" in r.json()["error"]
    assert [e["operation"] for e in client.ledger()] == ["charge", "refund"]


def test_stats_count_by_service_operation_status(client: RemotesClient) -> None:
    base = client.base_url
    call(base, "inventory", "reserve", "o-1", "k")
    call(base, "inventory", "reserve", "o-1", "k")
    call(base, "inventory", "reserve", "o-1", None)
    client.set_faults("shipping", transientRate=1.0)
    call(base, "shipping", "ship", "o-1", "s")
    s = client.stats()
    assert s["requests"]["inventory"]["reserve"] == {"200": 2, "400": 1}
    assert s["requests"]["shipping"]["ship"] == {"503": 1}
    assert s["replays"]["inventory"]["reserve"] == 1
    assert s["total"] == 4
    assert s["effects"] == 1
