"""Run-time fault injection per service, through PUT /_faults/{service} and DELETE /_faults."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from local.remotes.client import RemotesClient

from .conftest import call, order, start_remotes

pytestmark = pytest.mark.integration


def test_faults_default_and_replace(client: RemotesClient) -> None:
    faults = client.faults()
    assert set(faults) == {"inventory", "payment", "shipping", "delivery"}
    assert faults["payment"] == {"latencyMs": 0, "transientRate": 0.0, "hangRate": 0.0, "hangSeconds": 30,
                                 "hangSkus": [], "lostResponseRate": 0.0, "rejectSkus": [], "rejectAmountOver": None,
                                 "down": False, "ratePerSecond": None}
    client.set_faults("payment", transient_rate=0.5, latency_ms=10)  # snake_case works in the client
    assert client.faults()["payment"]["transientRate"] == 0.5
    # A PUT replaces: latency goes back to 0 when not given.
    client.set_faults("payment", transientRate=0.25)
    assert client.faults()["payment"]["latencyMs"] == 0
    assert client.faults()["inventory"]["transientRate"] == 0.0
    client.reset_faults()
    assert client.faults()["payment"]["transientRate"] == 0.0


@pytest.mark.parametrize("body", [
    {"transientRate": 1.5}, {"transientRate": "x"}, {"latencyMs": -1}, {"nope": 1},
    {"rejectSkus": "SKU-1"}, {"rejectAmountOver": "lots"}, {"down": "maybe"},
    {"ratePerSecond": 0}, {"ratePerSecond": -2}, {"ratePerSecond": "8/s"},
])
def test_invalid_faults_are_400(client: RemotesClient, body: dict[str, object]) -> None:
    r = requests.put(f"{client.base_url}/_faults/payment", json=body, timeout=5)
    assert r.status_code == 400, r.text
    assert requests.put(f"{client.base_url}/_faults/billing", json={}, timeout=5).status_code == 404


def test_latency(client: RemotesClient) -> None:
    client.set_faults("inventory", latencyMs=400)
    start = time.monotonic()
    assert call(client.base_url, "inventory", "reserve", "o-1", "k").status_code == 200
    assert time.monotonic() - start >= 0.4
    start = time.monotonic()
    assert call(client.base_url, "payment", "charge", "o-1", "k").status_code == 200
    assert time.monotonic() - start < 0.3  # other services are not delayed


def test_transient_rate_one_is_503_without_effect(client: RemotesClient) -> None:
    client.set_faults("payment", transientRate=1.0)
    for _ in range(5):
        r = call(client.base_url, "payment", "charge", "o-1", "o-1:charge-payment")
        assert r.status_code == 503 and "error" in r.json()
    assert client.ledger() == []
    client.reset_faults()
    # Nothing was stored either: the retry applies the charge.
    assert call(client.base_url, "payment", "charge", "o-1", "o-1:charge-payment").status_code == 200
    assert len(client.ledger()) == 1


def test_transient_rate_is_a_rate_and_retries_apply_once(client: RemotesClient) -> None:
    client.set_faults("shipping", transientRate=0.5)
    codes = [call(client.base_url, "shipping", "ship", f"o-{i}", f"k-{i}").status_code for i in range(200)]
    assert set(codes) == {200, 503}
    assert 60 <= codes.count(503) <= 140
    assert len(client.ledger()) == codes.count(200)
    # Retrying each failed key until it succeeds ends with exactly one effect per key.
    for i, code in enumerate(codes):
        while code != 200:
            code = call(client.base_url, "shipping", "ship", f"o-{i}", f"k-{i}").status_code
    assert len(client.ledger()) == 200
    assert client.duplicate_effects() == []


def test_seeded_faults_are_reproducible() -> None:
    def sequence() -> list[int]:
        proc, url = start_remotes(seed=1234)
        try:
            c = RemotesClient(url)
            c.set_faults("payment", transientRate=0.3)
            return [call(url, "payment", "charge", f"o-{i}", f"k-{i}").status_code for i in range(60)]
        finally:
            proc.stop()

    first, second = sequence(), sequence()
    assert first == second
    assert 503 in first and 200 in first


def test_hang_does_not_block_other_requests(client: RemotesClient) -> None:
    client.set_faults("inventory", hangRate=1.0, hangSeconds=3)
    base = client.base_url
    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        hung = [pool.submit(call, base, "inventory", "reserve", f"o-{i}", f"k-{i}", timeout=1.0) for i in range(3)]
        # While three calls hang, other services and the same service's control plane answer at once.
        assert call(base, "payment", "charge", "o-9", "k-9").status_code == 200
        assert client.health()["status"] == "ok"
        assert time.monotonic() - start < 1.0
        for f in hung:
            with pytest.raises(requests.Timeout):
                f.result()
    # After hangSeconds a hung call answers 503 and has applied nothing.
    r = call(base, "inventory", "reserve", "o-x", "k-x", timeout=10)
    assert r.status_code == 503
    assert time.monotonic() - start >= 3.0
    assert [e["service"] for e in client.ledger()] == ["payment"]


def test_lost_response_applies_the_effect_and_the_retry_gets_it(client: RemotesClient) -> None:
    client.set_faults("payment", lostResponseRate=1.0)
    r = call(client.base_url, "payment", "charge", "o-1", "o-1:charge-payment")
    assert r.status_code == 503
    effects = client.ledger()
    assert len(effects) == 1  # the charge happened, the caller was not told
    # The retry with the same key gets the stored answer, and charges nothing more.
    r = call(client.base_url, "payment", "charge", "o-1", "o-1:charge-payment")
    assert r.status_code == 200
    assert r.json() == effects[0]["result"]
    assert len(client.ledger()) == 1


def test_reject_skus_on_reserve(client: RemotesClient) -> None:
    client.set_faults("inventory", rejectSkus=["SKU-9"])
    bad = order(items=[{"sku": "SKU-1", "quantity": 1, "unitPrice": "1"}, {"sku": "SKU-9", "quantity": 1,
                                                                            "unitPrice": "2"}])
    r = call(client.base_url, "inventory", "reserve", "o-1", "k-1", body_order=bad)
    assert r.status_code == 422 and "SKU-9" in r.json()["error"]
    assert call(client.base_url, "inventory", "reserve", "o-2", "k-2").status_code == 200
    assert [e["orderId"] for e in client.ledger()] == ["o-2"]


def test_reject_amount_over_on_charge(client: RemotesClient) -> None:
    client.set_faults("payment", rejectAmountOver="100.00")
    base = client.base_url
    r = call(base, "payment", "charge", "o-1", "k-1", body_order=order(total="100.01"))
    assert r.status_code == 422 and "100.01" in r.json()["error"]
    assert call(base, "payment", "charge", "o-2", "k-2", body_order=order(total="100.00")).status_code == 200
    assert [e["orderId"] for e in client.ledger()] == ["o-2"]


def test_down_503_for_everything(client: RemotesClient) -> None:
    client.set_faults("inventory", down=True)
    base = client.base_url
    assert call(base, "inventory", "reserve", "o-1", "k").status_code == 503
    assert call(base, "inventory", "release", "o-1", "k2").status_code == 503
    assert call(base, "shipping", "ship", "o-1", "k").status_code == 200
    assert [e["service"] for e in client.ledger()] == ["shipping"]


def test_down_reset_resets_the_connection(client: RemotesClient) -> None:
    client.set_faults("payment", down="reset")
    with pytest.raises(requests.ConnectionError):
        call(client.base_url, "payment", "charge", "o-1", "k")
    assert client.stats()["requests"]["payment"]["charge"] == {"reset": 1}
    client.reset_faults()
    assert call(client.base_url, "payment", "charge", "o-1", "k").status_code == 200
    assert len(client.ledger()) == 1


def test_each_injected_fault_is_counted_exactly(client: RemotesClient) -> None:
    client.set_faults("inventory", transientRate=1.0)
    for i in range(3):
        assert call(client.base_url, "inventory", "reserve", "o-1", f"t-{i}").status_code == 503
    client.set_faults("payment", lostResponseRate=1.0)
    assert call(client.base_url, "payment", "charge", "o-2", "l-1").status_code == 503  # effect applied, answer lost
    client.set_faults("shipping", down=True)
    assert call(client.base_url, "shipping", "ship", "o-3", "d-1").status_code == 503
    client.set_faults("inventory", hangRate=1.0, hangSeconds=0)
    assert call(client.base_url, "inventory", "reserve", "o-4", "h-1").status_code == 503
    client.reset_faults()
    assert call(client.base_url, "inventory", "reserve", "o-5", "ok-1").status_code == 200  # no fault: not counted
    assert client.stats()["injected"] == {"inventory": {"transient": 3, "hang": 1},
                                          "payment": {"lostResponse": 1}, "shipping": {"down": 1}}


def test_rate_per_second_answers_429_with_retry_after_and_counts_it(client: RemotesClient) -> None:
    """Above ``ratePerSecond`` calls within a second: 429 + Retry-After, no effect; /_stats counts
    them under 429. Counted, not timed: a burst of 12 at once against a rate of 2."""
    client.set_faults("payment", ratePerSecond=2)
    keys = [f"o-{i}:charge-payment" for i in range(12)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(lambda k: call(client.base_url, "payment", "charge", k.split(":")[0], k), keys))
    refused = [r for r in answers if r.status_code == 429]
    accepted = [r for r in answers if r.status_code == 200]
    assert len(refused) + len(accepted) == 12 and refused and accepted
    assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    assert len(client.ledger(service="payment")) == len(accepted)  # a 429 applies nothing
    stats = client.stats()
    assert stats["requests"]["payment"]["charge"]["429"] == len(refused)
    assert stats["injected"]["payment"]["rateLimited"] == len(refused)
    assert client.faults()["inventory"]["ratePerSecond"] is None  # other services are not limited
    client.reset_faults()
