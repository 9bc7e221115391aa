"""Conformance: the emulator comes back from every restart under load, and no accepted message is lost or
settled twice.

Senders and receivers of the unmodified SDK (default options: they retry and reconnect, as the app's do) run
while the emulator is restarted eight times on the same ``Proc``, data dir and port, the way the stack
restarts it (``Stack.restart``: stop, then start): alternately SIGKILL (a crash) and SIGTERM (the chaos
runner's restart). The queue detects duplicates, so a send retried after a restart is stored once.

A completion that raised may still have been done: the broker committed it and was stopped before its answer
left, and the SDK's retry then hears "lock lost" (as from Azure). Each receiver has one completion in flight
at a time, so at most one such message per receiver and restart is neither confirmed nor delivered again.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tests.conftest import start_servicebus
from tests.local.servicebus.support import CONFIG

pytestmark = pytest.mark.integration

QUEUE = "restart-load"
RESTARTS = 8
SENDERS = 2
RECEIVERS = 2
BATCH = 5
PROGRESS = 10  # sends and completions seen after a restart before the next one: the load is on when it comes
WAIT = 30.0  # s: bound on each wait for progress (a hang fails the test instead of blocking the suite)


class Ledger:
    """What the clients were told: sends accepted, completions confirmed, completions that raised."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.accepted: set[str] = set()
        self.completed: Counter[str] = Counter()  # message id -> confirmed completions
        self.unconfirmed: set[str] = set()  # complete_message raised: maybe done (see the module's docstring)
        self.errors: Counter[str] = Counter()  # what the clients raised, for the failure messages

    def accept(self, ids: list[str]) -> None:
        with self.cond:
            self.accepted.update(ids)
            self.cond.notify_all()

    def complete(self, mid: str) -> None:
        with self.cond:
            self.completed[mid] += 1
            self.cond.notify_all()

    def not_confirmed(self, mid: str) -> None:
        with self.cond:
            self.unconfirmed.add(mid)
            self.cond.notify_all()

    def error(self, what: str) -> None:
        with self.cond:
            self.errors[what] += 1

    def unsettled(self) -> set[str]:
        """Accepted messages without a confirmed completion."""
        return self.accepted - set(self.completed)

    def settled(self) -> bool:
        """Every accepted message's completion was confirmed or raised, and at most one per receiver and
        restart (see the module's docstring) is without a confirmed completion."""
        left = self.unsettled()
        return left <= self.unconfirmed and len(left) <= RESTARTS * RECEIVERS

    def wait(self, ok: Callable[[], bool], what: Callable[[], str]) -> None:
        with self.cond:
            if not self.cond.wait_for(ok, WAIT):
                pytest.fail(f"{what()} after {WAIT}s; the clients raised: {dict(self.errors)}")

    def wait_for_progress(self) -> None:
        sent, done = len(self.accepted), self.completed.total()
        self.wait(lambda: len(self.accepted) >= sent + PROGRESS and self.completed.total() >= done + PROGRESS,
                  lambda: f"not {PROGRESS} more sends and completions")


def send(conn: str, k: int, ledger: Ledger, stop: threading.Event) -> None:
    n = 0
    with ServiceBusClient.from_connection_string(conn, keep_alive=None) as client:
        while not stop.is_set():
            try:
                with client.get_queue_sender(QUEUE) as sender:
                    while not stop.is_set():
                        ids = [f"s{k}-{n + i}" for i in range(BATCH)]
                        # A failed send is sent again with the same ids: stored once (duplicate detection).
                        sender.send_messages([ServiceBusMessage(i, message_id=i) for i in ids])
                        ledger.accept(ids)
                        n += BATCH
            except Exception as e:  # noqa: BLE001 - retries ran out during a restart: reconnect
                ledger.error(f"send {type(e).__name__}")
                time.sleep(0.2)


def receive(conn: str, ledger: Ledger, stop: threading.Event) -> None:
    with ServiceBusClient.from_connection_string(conn, keep_alive=None) as client:
        while not stop.is_set():
            try:
                with client.get_queue_receiver(QUEUE) as receiver:
                    while not stop.is_set():
                        for m in receiver.receive_messages(max_message_count=10, max_wait_time=0.5):
                            mid = str(m.message_id)
                            try:
                                receiver.complete_message(m)
                            except Exception as e:  # noqa: BLE001 - a restart: maybe completed, maybe delivered again
                                ledger.not_confirmed(mid)
                                ledger.error(f"complete {type(e).__name__}")
                            else:
                                ledger.complete(mid)
            except Exception as e:  # noqa: BLE001 - retries ran out during a restart: reconnect
                ledger.error(f"receive {type(e).__name__}")
                time.sleep(0.2)


def test_restarts_under_load_come_back_and_lose_or_repeat_nothing(tmp_path: Path) -> None:
    ep = start_servicebus(tmp_path, config=CONFIG)
    ledger = Ledger()
    stop_sending, stop_receiving = threading.Event(), threading.Event()
    senders = [threading.Thread(target=send, args=(ep.connection_string, k, ledger, stop_sending), daemon=True)
               for k in range(SENDERS)]
    receivers = [threading.Thread(target=receive, args=(ep.connection_string, ledger, stop_receiving), daemon=True)
                 for _ in range(RECEIVERS)]
    try:
        for t in senders + receivers:
            t.start()
        for n in range(RESTARTS):
            ledger.wait_for_progress()
            if n % 2 == 0:
                ep.proc.kill()
            else:
                ep.proc.stop()
            ep.proc.start("ready", timeout=60)  # raises if it does not come back
        ledger.wait_for_progress()  # the clients are back on the last restart's emulator
        stop_sending.set()
        for t in senders:
            t.join(WAIT)
        ledger.wait(ledger.settled, lambda: f"accepted messages without a confirmed completion (at most "
                    f"{RESTARTS * RECEIVERS} allowed): {sorted(ledger.unsettled())[:20]}, of which never tried: "
                    f"{sorted(ledger.unsettled() - ledger.unconfirmed)[:20]}")
    finally:
        stop_sending.set()
        stop_receiving.set()
        for t in senders + receivers:
            t.join(WAIT)
        ep.proc.stop()
    twice = {mid: n for mid, n in ledger.completed.items() if n > 1}
    assert twice == {}, f"completed more than once: {twice}"
