"""The digital workflow's remote operations (docs/contracts.md, "Remote services"): the inventory
service's reserve-licence / release-licence and the delivery service's deliver, with the same
idempotency, ledger, compensation by key, tombstones and fault injection as the others."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from local.remotes.client import RemotesClient

from .conftest import call, order

pytestmark = pytest.mark.integration


def compensate(base: str, service: str, operation: str, order_id: str, key: str, target: str,
               step: str) -> requests.Response:
    body: dict[str, Any] = {"orderId": order_id, "order": order(), "context": {},
                            "compensates": {"step": step, "idempotencyKey": target}}
    return requests.post(f"{base}/{service}/{operation}", json=body, headers={"Idempotency-Key": key}, timeout=10)


def test_digital_saga_bodies_and_ledger(client: RemotesClient) -> None:
    base = client.base_url
    r = call(base, "inventory", "reserve-licence", "o-1", "o-1:reserve-licence")
    assert r.status_code == 200
    licence = r.json()
    assert set(licence) == {"licenceId"} and licence["licenceId"].startswith("lic-")
    payment = call(base, "payment", "charge", "o-1", "o-1:charge-payment").json()
    r = call(base, "delivery", "deliver", "o-1", "o-1:deliver",
             context={"reserve-licence": licence, "charge-payment": payment})
    assert r.status_code == 200 and set(r.json()) == {"deliveryId"}
    effects = client.ledger()
    assert [(e["service"], e["operation"], e["idempotencyKey"]) for e in effects] == [
        ("inventory", "reserve-licence", "o-1:reserve-licence"), ("payment", "charge", "o-1:charge-payment"),
        ("delivery", "deliver", "o-1:deliver")]
    assert effects[0]["items"] == [{"sku": "SKU-1", "quantity": 2}] and effects[2]["items"] == effects[0]["items"]
    assert client.ledger(service="delivery") == effects[2:]
    assert client.effects_by_order()["o-1"] == {"inventory/reserve-licence": 1, "payment/charge": 1,
                                                "delivery/deliver": 1}


def test_every_operation_applies_once_per_key(client: RemotesClient) -> None:
    base = client.base_url
    first = call(base, "inventory", "reserve-licence", "o-1", "k-lic").json()
    assert call(base, "inventory", "reserve-licence", "o-1", "k-lic").json() == first
    delivered = call(base, "delivery", "deliver", "o-1", "k-dlv").json()
    with ThreadPoolExecutor(8) as pool:  # concurrent duplicates: one effect
        answers = list(pool.map(lambda _: call(base, "delivery", "deliver", "o-1", "k-dlv").json(), range(8)))
    assert answers == [delivered] * 8
    assert [e["operation"] for e in client.ledger()] == ["reserve-licence", "deliver"]
    assert client.duplicate_effects() == []
    assert client.stats()["replays"] == {"inventory": {"reserve-licence": 1}, "delivery": {"deliver": 8}}
    # A key is scoped to its operation: reusing it for another operation of the service is refused.
    r = call(base, "inventory", "reserve", "o-1", "k-lic")
    assert r.status_code == 422 and "inventory/reserve-licence" in r.json()["error"]


def test_release_licence_needs_the_licence(client: RemotesClient) -> None:
    base = client.base_url
    assert call(base, "inventory", "release-licence", "o-1", "c0", context={}).status_code == 422
    r = call(base, "inventory", "release-licence", "o-1", "c1", context={"reserve-licence": {"licenceId": "lic-x"}})
    assert r.status_code == 422 and "unknown licence" in r.json()["error"]
    licence = call(base, "inventory", "reserve-licence", "o-1", "o-1:l").json()
    # A stock reservation's context does not release a licence, nor does another order.
    assert call(base, "inventory", "release-licence", "o-1", "c2",
                context={"reserve-inventory": {"reservationId": licence["licenceId"]}}).status_code == 422
    assert call(base, "inventory", "release-licence", "o-2", "c3",
                context={"reserve-licence": licence}).status_code == 422
    r = call(base, "inventory", "release-licence", "o-1", "c4", context={"reserve-licence": licence})
    assert r.status_code == 200 and r.json() == {"released": licence["licenceId"]}
    r = call(base, "inventory", "release-licence", "o-1", "c5", context={"reserve-licence": licence})
    assert r.status_code == 422 and "already released" in r.json()["error"]
    assert [e["operation"] for e in client.ledger()] == ["reserve-licence", "release-licence"]


def test_release_licence_by_key_and_the_tombstone(client: RemotesClient) -> None:
    base = client.base_url
    licence = call(base, "inventory", "reserve-licence", "o-1", "o-1:reserve-licence").json()
    r = compensate(base, "inventory", "release-licence", "o-1", "o-1:reserve-licence:compensate",
                   "o-1:reserve-licence", "reserve-licence")
    assert r.status_code == 200 and r.json() == {"released": licence["licenceId"]}
    # A stock release cannot undo a licence reservation (the key was used for reserve-licence).
    r = compensate(base, "inventory", "release", "o-1", "o-1:x:compensate", "o-1:reserve-licence", "reserve-inventory")
    assert r.status_code == 422
    # Nothing was ever reserved under o-2's key: nothing to undo, the key is tombstoned, and the
    # late original call is refused without effect.
    r = compensate(base, "inventory", "release-licence", "o-2", "o-2:reserve-licence:compensate",
                   "o-2:reserve-licence", "reserve-licence")
    assert r.status_code == 200 and r.json() == {"released": None, "nothingToUndo": True}
    late = call(base, "inventory", "reserve-licence", "o-2", "o-2:reserve-licence")
    assert late.status_code == 409 and late.json() == {"error": "compensated"}
    kinds = [(e["orderId"], e["operation"], e["kind"]) for e in client.ledger()]
    assert kinds == [("o-1", "reserve-licence", "effect"), ("o-1", "release-licence", "effect"),
                     ("o-2", "release-licence", "tombstone")]


def test_delivery_has_the_same_faults(client: RemotesClient) -> None:
    base = client.base_url
    client.set_faults("delivery", down=True)
    assert call(base, "delivery", "deliver", "o-1", "d-1").status_code == 503
    client.set_faults("delivery", transientRate=1.0)
    assert call(base, "delivery", "deliver", "o-1", "d-1").status_code == 503
    assert client.ledger() == []
    client.set_faults("delivery", lostResponseRate=1.0)
    lost = call(base, "delivery", "deliver", "o-1", "d-1")
    assert lost.status_code == 503 and "effect was applied" in lost.json()["error"]
    client.set_faults("delivery")
    assert set(call(base, "delivery", "deliver", "o-1", "d-1").json()) == {"deliveryId"}  # the stored answer
    assert len(client.ledger()) == 1
    client.set_faults("delivery", hangSkus=["SKU-1"], hangSeconds=0.2)
    assert call(base, "delivery", "deliver", "o-2", "d-2").status_code == 503
    assert client.stats()["injected"]["delivery"] == {"down": 1, "transient": 1, "lostResponse": 1, "hang": 1}
    # The other services' faults are their own.
    assert call(base, "inventory", "reserve-licence", "o-3", "l-3").status_code == 200


def test_reject_skus_refuse_a_licence(client: RemotesClient) -> None:
    base = client.base_url
    client.set_faults("inventory", rejectSkus=["SKU-1"])
    r = call(base, "inventory", "reserve-licence", "o-1", "l-1")
    assert r.status_code == 422 and "no licence left: SKU-1" in r.json()["error"]
    assert call(base, "inventory", "reserve-licence", "o-1", "l-1").status_code == 422  # stored
    assert client.ledger() == []
