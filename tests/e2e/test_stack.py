"""End to end: the whole local stack (Azurite, the Service Bus emulator, the remote services
simulator, the Functions host with 2 instances, the app), started as `make run` starts it."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests

from local.host.keys import FUNCTION, KEY_HEADER
from local.procs import REPO_ROOT
from local.stack import Stack, StackError, demo_order
from local.stackinfo import StackNotRunning, read_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = {"SupervisorSchedule": "*/2 * * * * *", "StepTimeoutSeconds": "5", "UnclaimedGraceSeconds": "5",
        "BackoffBaseSeconds": "1"}
ORDERS = 50
DEADLINE_S = 120.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _total(order: dict[str, Any]) -> Decimal:
    return sum((Decimal(str(i["unitPrice"])) * i["quantity"] for i in order["items"]), Decimal(0))


def _post(stack: Stack, session: requests.Session, body: dict[str, Any]) -> str:
    """POST an order; retry connection failures (an instance may be dying under the request)."""
    for attempt in range(5):
        try:
            return stack.post_order(body, session=session)
        except (requests.ConnectionError, StackError):
            if attempt == 4:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _wait_all(stack: Stack, ids: list[str], deadline: float) -> dict[str, dict[str, Any]]:
    last: dict[str, dict[str, Any]] = {}
    session = stack.session(FUNCTION)
    while time.monotonic() < deadline:
        for oid in ids:
            if last.get(oid, {}).get("processState") in ("Processed", "Error"):
                continue
            try:
                last[oid] = stack.get_order(oid, session=session, timeout=10)
            except (requests.RequestException, StackError):
                pass  # an instance restarting: ask again next round
        if all(last.get(o, {}).get("processState") in ("Processed", "Error") for o in ids):
            break
        time.sleep(0.5)
    return last


def test_fifty_orders_all_processed_despite_a_killed_host_instance(tmp_path: Path) -> None:
    rng = random.Random(42)
    bodies = [demo_order(rng) for _ in range(ORDERS)]
    with Stack(tmp_path / "stack", persistent=False, instances=2, settings_overrides=FAST) as stack:
        # What the stack wrote: settings the host reads, and the endpoints file.
        values = json.loads(stack.settings_path.read_text())["Values"]
        assert values["FUNCTIONS_WORKER_RUNTIME"] == "python"
        assert values["ServiceBusConnection"].startswith("Endpoint=sb://127.0.0.1:")
        assert values["StateStorage"] == values["AzureWebJobsStorage"] == stack.azurite.connection_string
        assert values["PaymentServiceUrl"] == stack.remotes_url + "/payment"
        assert values["SupervisorSchedule"] == FAST["SupervisorSchedule"]
        described = json.loads(stack.stack_json_path.read_text())
        assert described["baseUrl"] == stack.base_url.rstrip("/")

        instances = stack.host_instances()
        assert len(instances) == 2, instances

        session = stack.session(FUNCTION)
        ids: list[str] = []
        totals: dict[str, Decimal] = {}
        for body in bodies[: ORDERS // 2]:
            oid = _post(stack, session, body)
            ids.append(oid)
            totals[oid] = _total(body)

        # In the middle of the run: crash one instance (SIGKILL, no clean-up); the host restarts it.
        k, old_pid = stack.kill_host_instance(sorted(instances)[0])
        for body in bodies[ORDERS // 2:]:
            oid = _post(stack, session, body)
            ids.append(oid)
            totals[oid] = _total(body)
        assert len(set(ids)) == ORDERS
        new_pid = stack.wait_host_instance_replaced(k, old_pid, timeout=60)
        assert new_pid != old_pid and not _alive(old_pid)

        final = _wait_all(stack, ids, time.monotonic() + DEADLINE_S)
        states = Counter(final.get(o, {}).get("processState", "unknown") for o in ids)
        not_done = {o: final.get(o) for o in ids if final.get(o, {}).get("processState") != "Processed"}
        assert states == Counter({"Processed": ORDERS}), f"{states}; e.g. {list(not_done.items())[:3]}"
        for oid in ids:
            o = final[oid]
            assert o["orderId"] == oid
            assert [s["state"] for s in o["steps"]] and {s["name"] for s in o["steps"]} >= {
                "reserve-inventory", "charge-payment", "create-shipment"}

        # Each effect exactly once per order; no compensations; right amounts.
        remotes = stack.remotes
        assert remotes.duplicate_effects() == []
        by_order = remotes.effects_by_order()
        expected = Counter({"inventory/reserve": 1, "payment/charge": 1, "shipping/ship": 1})
        wrong = {o: dict(by_order.get(o, Counter())) for o in ids if by_order.get(o) != expected}
        assert not wrong, wrong
        for e in remotes.ledger(service="payment"):
            if e["orderId"] in totals:
                assert Decimal(e["amount"]) == totals[e["orderId"]], e

        all_pids = [stack.proc(n).pid for n in ("azurite", "servicebus", "remotes", "host")]
        all_pids += list(stack.host_instances().values())
    # Leaving the block stopped everything: no orphan.
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in all_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in all_pids if _alive(p)] == []
    assert not stack.stack_json_path.exists()  # a stopped stack leaves no URL behind


def test_make_run_posts_demo_orders_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """`python -m local.stack` (what `make run` runs): demo orders, progress, SIGTERM, no orphans."""
    state = tmp_path / "state"
    # only orders that succeed: the demo's failing orders are tested in tests/local/test_demo_stack.py
    args = [sys.executable, "-m", "local.stack", "--orders", "10", "--rate", "20", "--no-failing-orders",
            "--state-dir", str(state)]
    for k, v in FAST.items():
        args += ["--set", f"{k}={v}"]
    proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "Ctrl-C stops it" in line or time.monotonic() > deadline:
                break
        out = "\n".join(lines)
        assert "HTTP base URL: http://127.0.0.1:" in out, out
        # the demo's orders in the words of the live line below it (local.watch): the search categories
        assert "demo done: 10 orders by search category: inFlight 0 · attention 0 · processed 10 · error 0" in out, out
        # Not a TTY: progress comes as whole lines with a bar.
        assert any(line.startswith("[") and "/10" in line for line in lines), out

        described = json.loads((state / "stack.json").read_text())
        assert read_running(state)["baseUrl"] == described["baseUrl"]
        printed = subprocess.run([sys.executable, "-m", "local.stackinfo", "--state-dir", str(state)], cwd=REPO_ROOT,
                                 capture_output=True, text=True, timeout=30)
        console = f"  console:     {described['baseUrl']}/api/console"
        assert any(line.startswith(console) for line in lines), out  # make run prints the console's URL
        # the console is an operator's: the master key, from stack.json as a reader of it finds it
        page = requests.get(f"{described['baseUrl']}/api/console", timeout=30,
                            headers={KEY_HEADER: described["host"]["keys"]["master"]})
        assert page.status_code == 200 and "Orders console" in page.text
        assert (printed.returncode, printed.stdout.strip()) == (0, described["baseUrl"]), printed
        pids = [described["azurite"]["pid"], described["servicebus"]["pid"], described["remotes"]["pid"],
                described["host"]["pid"]]
        assert all(isinstance(p, int) and _alive(p) for p in pids), described
        settings = json.loads((state / "local.settings.json").read_text())
        assert settings["IsEncrypted"] is False
        assert settings["Values"]["InventoryServiceUrl"] == described["remotes"]["baseUrl"] + "/inventory"
        assert (state / "logs" / "host.log").stat().st_size > 0
        # The demo's effects are in the ledger, once each.
        effects = requests.get(described["remotes"]["ledger"], timeout=10).json()["effects"]
        # Orders 4 and 8 of the 10 are digital goods (a licence, a charge, a delivery), the rest ship.
        assert Counter(e["operation"] for e in effects) == Counter(
            {"reserve": 8, "ship": 8, "reserve-licence": 2, "deliver": 2, "charge": 10})

        host_log = (state / "logs" / "host.log").read_text()
        instance_pids = [int(pid) for pid in re.findall(r"\binstance \d+ pid (\d+)\b", host_log)]
        assert len(instance_pids) >= 2, host_log[-2000:]
        os.kill(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "stopped" in rest
        gone_by = time.monotonic() + 10
        while any(_alive(p) for p in pids + instance_pids) and time.monotonic() < gone_by:
            time.sleep(0.1)
        assert [p for p in pids + instance_pids if _alive(p)] == []
        # Stopped: no stack.json, so no dead URL for the README's BASE= line; the reader says why.
        assert not (state / "stack.json").exists()
        with pytest.raises(StackNotRunning, match="not running"):
            read_running(state)
        printed = subprocess.run([sys.executable, "-m", "local.stackinfo", "--state-dir", str(state)], cwd=REPO_ROOT,
                                 capture_output=True, text=True, timeout=30)
        assert printed.returncode == 1 and printed.stdout == "" and "not running" in printed.stderr, printed
    finally:
        _stop_leaving_nothing(proc, state)


def _stop_leaving_nothing(proc: subprocess.Popen[str], state: Path) -> None:
    """After a failed assertion: stop the stack as Ctrl-C does, else kill it and every child it
    named. Its children run in sessions of their own (stopped by PID), so killing its process group
    alone would leave a whole stack running after the test."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    try:
        described = json.loads((state / "stack.json").read_text())
    except (OSError, ValueError):
        return
    pids = [pid for part in ("host", "remotes", "servicebus", "azurite")
            if isinstance(pid := (described.get(part) or {}).get("pid"), int) and _alive(pid)]
    for pid in pids:  # the host stops its instances on SIGTERM
        os.kill(pid, signal.SIGTERM)
    gone_by = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < gone_by:
        time.sleep(0.1)
    for pid in [p for p in pids if _alive(p)]:
        os.kill(pid, signal.SIGKILL)


def test_a_child_failing_to_start_stops_the_others(tmp_path: Path) -> None:
    bad_config = tmp_path / "bad-config.json"
    bad_config.write_text("{ this is not json")
    stack = Stack(tmp_path / "state", persistent=False, queue_config=bad_config, start_timeout=30)
    with pytest.raises(RuntimeError):
        stack.start()
    assert stack.azurite is not None
    azurite_pid = stack.azurite.proc.pid
    assert not _alive(azurite_pid)
    assert not stack.procs["servicebus"].alive()
    assert "remotes" not in stack.procs and "host" not in stack.procs


E2E_DELAY = """\
name: e2e-delay
version: 1
description: A reservation, a 3-second delay, a shipment (the end-to-end test's own workflow).
steps:
  - name: reserve-inventory
    agent: inventory
    operation: reserve
    timeoutSeconds: 30
    compensation: release
  - name: pause
    kind: delay
    duration: PT3S
  - name: create-shipment
    agent: shipping
    operation: ship
    timeoutSeconds: 30
    pivot: true
"""


def _awaiting_event(stack: Stack, oid: str, deadline: float) -> dict[str, Any]:
    while time.monotonic() < deadline:
        view = stack.get_order(oid)
        if (view.get("awaiting") or {}).get("kind") == "event":
            return view
        time.sleep(0.3)
    raise AssertionError(f"order {oid} never reached its wait: {stack.get_order(oid)}")


def test_waits_and_delays_on_the_real_stack(tmp_path: Path) -> None:
    """Order v2's approval wait, a delay and express's parallel step, through the real host,
    queues and remotes: an approval ends the wait, a refusal compensates, an event sent at once is
    kept (or ends the wait), a delay's Service Bus scheduled message ends it no sooner than its
    duration, and both branches of a parallel step are dispatched together."""
    workflows = tmp_path / "workflows"
    workflows.mkdir()
    for path in (REPO_ROOT / "workflows").iterdir():
        (workflows / path.name).write_bytes(path.read_bytes())
    (workflows / "e2e-delay.v1.yaml").write_text(E2E_DELAY, encoding="utf-8")
    big = {"customerId": "c-big", "currency": "EUR", "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": "1500.00"}],
           "priority": "normal", "statusQueue": None}
    with Stack(tmp_path / "stack", persistent=False, instances=1,
               settings_overrides={**FAST, "WorkflowsPath": str(workflows)}) as stack:
        session = stack.session(FUNCTION)
        approved, declined, early = (_post(stack, session, big) for _ in range(3))
        assert stack.send_event(early, "approval", {"approved": True}) in ("event-kept", "step-done")
        small = [{"sku": "SKU-1", "quantity": 1, "unitPrice": "5"}]
        delayed = _post(stack, session, {**big, "items": small, "workflow": "e2e-delay"})
        express = _post(stack, session, {**big, "items": small, "workflow": "express"})
        deadline = time.monotonic() + DEADLINE_S
        view = _awaiting_event(stack, approved, deadline)
        assert view["workflow"] == {"name": "order", "version": 2}
        assert [s["kind"] for s in view["steps"]] == ["call", "wait", "call", "call"]
        assert stack.send_event(approved, "approval", {"approved": True, "by": "e2e"}) == "step-done"
        assert stack.send_event(approved, "approval", {"approved": True, "by": "e2e"}) == "event-duplicate"
        _awaiting_event(stack, declined, deadline)
        assert stack.send_event(declined, "approval", {"approved": False}) == "compensating"

        final = _wait_all(stack, [approved, declined, early, delayed, express], deadline)
        states = {o: (final[o]["processState"], final[o]["outcome"]) for o in final}
        assert states == {approved: ("Processed", "processed"), declined: ("Error", "failed"),
                          early: ("Processed", "processed"), delayed: ("Processed", "processed"),
                          express: ("Processed", "processed")}, states
        effects = stack.remotes.effects_by_order()
        assert effects[declined] == Counter({"inventory/reserve": 1, "inventory/release": 1}), effects[declined]
        # express: its parallel step's two branches went out together, in one transaction
        first = [e for e in final[express]["history"] if e["seq"] <= 3]
        assert [(e["event"], e.get("step")) for e in first] == [
            ("accepted", None), ("dispatched", "reserve-inventory"), ("dispatched", "charge-payment")]
        for oid in (approved, early, express):
            assert effects[oid] == Counter({"inventory/reserve": 1, "payment/charge": 1, "shipping/ship": 1})
        assert stack.remotes.duplicate_effects() == []

        history = final[delayed]["history"]
        started = next(e["at"] for e in history if e["event"] == "dispatched" and e["step"] == "pause")
        ended = next(e["at"] for e in history if e["event"] == "stepDone" and e["step"] == "pause")
        from shared.core.times import parse_iso

        waited = parse_iso(ended) - parse_iso(started)  # type: ignore[operator]
        assert waited.total_seconds() >= 3, (started, ended)
