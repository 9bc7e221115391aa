"""The DBOS peer (bench/peer_dbos, run by bench/peer.py) against the remotes simulator: a handful
of orders, a rejected charge compensated, a charge that never answers undone by key, a SIGKILL
mid-step recovered, each checked against the remotes' ledger. It never asserts a speed. The
first run on a machine builds ``.venv-peer`` (about 20 s when PyPI is near), inside the module
fixture."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.peer import FORWARD, ledger_check
from bench.peer_rig import PeerRig

# the venv build (a pip install) counts against the first test's time
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerRig]:
    work: Path = tmp_path_factory.mktemp("peer")
    with PeerRig(work) as started:
        yield started


@pytest.fixture(autouse=True)
def no_faults(rig: PeerRig) -> Iterator[None]:
    rig.remotes.reset_faults()
    yield
    rig.remotes.reset_faults()


def post(rig: PeerRig, phase: str) -> str:
    oid = rig.new_run(phase)._post_one()
    assert oid is not None
    return oid


def wait_terminal(rig: PeerRig, ids: list[str], timeout: float = 60.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with rig.listener.lock:
            if all(oid in rig.listener.terminal for oid in ids):
                return {oid: rig.listener.terminal[oid][0] for oid in ids}
        time.sleep(0.05)
    raise AssertionError(f"unfinished: {[oid for oid in ids if oid not in rig.listener.terminal]}")


def peer_order(rig: PeerRig, oid: str) -> dict:
    with urllib.request.urlopen(f"{rig.peer_url}/orders/{oid}", timeout=10) as r:
        return json.loads(r.read())


def settled_peer_order(rig: PeerRig, oid: str, timeout: float = 30.0) -> dict:
    """The peer's order once DBOS has recorded its workflow's end: the order's last status message
    (what ``wait_terminal`` waits for) is sent from inside the workflow, just before it returns."""
    deadline = time.monotonic() + timeout
    order = peer_order(rig, oid)
    while order["status"] == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.05)
        order = peer_order(rig, oid)
    return order


def test_orders_are_processed_with_each_effect_once(rig: PeerRig) -> None:
    ids = [post(rig, "happy") for _ in range(5)]
    assert set(wait_terminal(rig, ids).values()) == {"processed"}
    assert ledger_check(rig.remotes, ids) == {"double_effects": 0, "orders": 5,
                                              "orders_without_exactly_one_of_each_effect": 0}
    final = settled_peer_order(rig, ids[0])
    assert final["status"] == "SUCCESS" and final["outcome"] == "processed"
    assert set(final["context"]) == {"reserve-inventory", "charge-payment", "create-shipment"}


def test_a_rejected_charge_releases_the_reservation(rig: PeerRig) -> None:
    rig.remotes.set_faults("payment", rejectAmountOver="0.01")
    oid = post(rig, "compensation")
    assert wait_terminal(rig, [oid]) == {oid: "failed"}
    deadline = time.monotonic() + 30
    while "compensated" not in rig.listener.events.get(oid, {}) and time.monotonic() < deadline:
        time.sleep(0.05)
    effects = rig.remotes.ledger(order_id=oid)
    assert [(e["service"], e["operation"]) for e in effects] == [("inventory", "reserve"), ("inventory", "release")]
    assert effects[1]["idempotencyKey"] == f"{oid}:reserve-inventory:compensate"
    assert effects[1]["compensates"] == f"{oid}:reserve-inventory"
    assert effects[1]["result"]["released"] == effects[0]["result"]["reservationId"]
    final = settled_peer_order(rig, oid)  # DBOS records the workflow's end after its last message
    assert final["outcome"] == "compensated" and final["step"] == "charge-payment"
    assert rig.remotes.duplicate_effects() == []


def test_sigkill_mid_step_then_restart_finishes_every_order_once(rig: PeerRig) -> None:
    rig.remotes.set_faults("payment", latencyMs=2000)
    reserves = sum(rig.remotes.stats()["requests"]["inventory"]["reserve"].values())
    ids = [post(rig, "recovery") for _ in range(3)]
    deadline = time.monotonic() + 30
    while sum(rig.remotes.stats()["requests"]["inventory"]["reserve"].values()) < reserves + 3:
        assert time.monotonic() < deadline, "the orders never reached charge-payment"
        time.sleep(0.05)
    time.sleep(0.5)  # inside the charge call
    old_pid = rig.peer_pid
    rig.kill_peer()
    with rig.listener.lock:
        assert not any(oid in rig.listener.terminal for oid in ids), "killed too late: nothing was in flight"
    rig.remotes.reset_faults()
    rig.start_peer()
    assert rig.peer_pid != old_pid
    assert set(wait_terminal(rig, ids).values()) == {"processed"}
    assert ledger_check(rig.remotes, ids)["orders_without_exactly_one_of_each_effect"] == 0
    assert rig.remotes.duplicate_effects() == []
    by_order = rig.remotes.effects_by_order()
    assert all(sum(by_order[oid].values()) == len(FORWARD) for oid in ids)


def test_a_charge_that_never_answers_is_undone_by_key(rig: PeerRig) -> None:
    rig.remotes.set_faults("payment", down=True)
    oid = post(rig, "unknown")
    assert wait_terminal(rig, [oid]) == {oid: "failed"}  # the charge's retries ran out
    rig.remotes.reset_faults()  # the refund (retried longer) now lands
    deadline = time.monotonic() + 60
    while "compensated" not in rig.listener.events.get(oid, {}):
        assert time.monotonic() < deadline, "never compensated"
        time.sleep(0.05)
    effects = {(e["service"], e["operation"]): e for e in rig.remotes.ledger(order_id=oid)}
    assert set(effects) == {("inventory", "reserve"), ("payment", "refund"), ("inventory", "release")}
    # nothing was charged: the refund tombstones the charge's key, so a late charge can never apply
    assert effects[("payment", "refund")]["kind"] == "tombstone"
    assert effects[("payment", "refund")]["compensates"] == f"{oid}:charge-payment"
    assert settled_peer_order(rig, oid)["outcome"] == "compensated"
