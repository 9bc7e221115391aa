"""Idempotency-Key: the same key gets the same answer, and the effect is applied once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from local.remotes.client import RemotesClient

from .conftest import call, order

pytestmark = pytest.mark.integration


def test_same_key_same_response_one_effect(client: RemotesClient) -> None:
    base = client.base_url
    first = call(base, "payment", "charge", "o-1", "o-1:charge-payment")
    again = call(base, "payment", "charge", "o-1", "o-1:charge-payment")
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    # Even with a different body, the stored answer wins: the key identifies the operation.
    other = call(base, "payment", "charge", "o-1", "o-1:charge-payment", body_order=order(total="99.00"))
    assert other.json() == first.json()
    assert len(client.ledger()) == 1
    # A new key is a new effect.
    assert call(base, "payment", "charge", "o-1", "o-1:charge-payment:2").json() != first.json()
    assert len(client.ledger()) == 2


def test_keys_are_scoped_per_service(client: RemotesClient) -> None:
    base = client.base_url
    call(base, "inventory", "reserve", "o-1", "same-key")
    call(base, "shipping", "ship", "o-1", "same-key")
    assert [e["service"] for e in client.ledger()] == ["inventory", "shipping"]


def test_a_key_reused_for_another_operation_is_refused(client: RemotesClient) -> None:
    base = client.base_url
    reservation = call(base, "inventory", "reserve", "o-1", "k").json()
    r = call(base, "inventory", "release", "o-1", "k", context={"reserve-inventory": reservation})
    assert r.status_code == 422
    assert [e["operation"] for e in client.ledger()] == ["reserve"]


def test_rejection_is_stored_too(client: RemotesClient) -> None:
    base = client.base_url
    client.set_faults("inventory", rejectSkus=["SKU-1"])
    first = call(base, "inventory", "reserve", "o-1", "k")
    assert first.status_code == 422
    client.reset_faults()
    again = call(base, "inventory", "reserve", "o-1", "k")
    assert again.status_code == 422 and again.json() == first.json()
    assert client.ledger() == []


@pytest.mark.parametrize("service,operation", [("inventory", "reserve"), ("payment", "charge"), ("shipping", "ship")])
def test_concurrent_duplicates_apply_once(client: RemotesClient, service: str, operation: str) -> None:
    base = client.base_url
    # Latency widens the window in which the duplicates overlap.
    client.set_faults(service, latencyMs=50)
    n = 24
    barrier = threading.Barrier(n)

    def one(_: int) -> tuple[int, dict[str, str]]:
        barrier.wait()
        r = call(base, service, operation, "o-1", "o-1:dup")
        return r.status_code, r.json()

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    assert {status for status, _ in results} == {200}
    assert len({tuple(sorted(body.items())) for _, body in results}) == 1
    effects = client.ledger()
    assert len(effects) == 1 and effects[0]["idempotencyKey"] == "o-1:dup"
    assert client.stats()["replays"][service][operation] == n - 1
    assert client.duplicate_effects() == []


def test_concurrent_distinct_keys_are_not_serialised(client: RemotesClient) -> None:
    """Per-key locks: 20 calls of 300 ms each with distinct keys take far less than 20 x 300 ms."""
    import time

    base = client.base_url
    client.set_faults("shipping", latencyMs=300)
    start = time.monotonic()
    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(lambda i: call(base, "shipping", "ship", f"o-{i}", f"k-{i}").status_code, range(20)))
    assert codes == [200] * 20
    assert time.monotonic() - start < 3.0
    assert len(client.ledger()) == 20
