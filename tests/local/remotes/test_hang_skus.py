"""``hangSkus``: every call about an order holding one of these SKUs hangs (the demo's stuck shipment)."""

from __future__ import annotations

import time

import pytest
import requests

from local.remotes.client import RemotesClient

from .conftest import call, order

pytestmark = pytest.mark.integration

SLOW = [{"sku": "SKU-SLOW", "quantity": 1, "unitPrice": "1.00"}]


def test_only_orders_holding_a_hang_sku_hang_every_time(client: RemotesClient) -> None:
    client.set_faults("shipping", hangSkus=["SKU-SLOW"], hangSeconds=0.3)
    base = client.base_url
    assert call(base, "shipping", "ship", "o-1", "o-1:ship").status_code == 200  # an ordinary order ships
    for _ in range(2):  # every attempt, same key, hangs and applies nothing
        start = time.monotonic()
        r = call(base, "shipping", "ship", "o-2", "o-2:ship", body_order=order(items=SLOW))
        assert r.status_code == 503 and time.monotonic() - start >= 0.3
    assert [e["orderId"] for e in client.ledger()] == ["o-1"]
    assert client.stats()["injected"]["shipping"] == {"hang": 2}
    client.reset_faults()
    assert call(base, "shipping", "ship", "o-2", "o-2:ship", body_order=order(items=SLOW)).status_code == 200


def test_hang_skus_must_be_a_list_of_strings(client: RemotesClient) -> None:
    r = requests.put(f"{client.base_url}/_faults/shipping", json={"hangSkus": "SKU-SLOW"}, timeout=5)
    assert r.status_code == 400 and "hangSkus" in r.text
