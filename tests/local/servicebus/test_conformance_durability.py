"""Conformance: messages survive an emulator restart (graceful stop and SIGKILL), on the same data dir and port.

These tests start their own emulators, separate from the shared one.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from local.procs import free_port
from tests.conftest import Endpoint, start_servicebus
from tests.local.servicebus.support import (
    CLIENT_OPTIONS,
    CONFIG,
    QuickCloseClient,
    ScenarioRun,
    Scenarios,
    app_props,
    assert_nothing,
    body_of,
    bounded,
    join_background_closes,
    receive_exactly,
    sleep_until,
    utcnow,
)

pytestmark = pytest.mark.integration

# Each scenario starts its own emulators (own data dir and port); the three run concurrently.
SCENARIOS = Scenarios(arg=None)


class Emulators:
    """Starts emulators on one data dir and port; stops whatever is still running at the end."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.running: list[Endpoint] = []

    def start(self) -> Endpoint:
        ep = start_servicebus(self.data_dir, port=self.port, config=CONFIG)
        self.running.append(ep)
        return ep

    def stop(self, ep: Endpoint) -> None:
        join_background_closes()
        ep.proc.stop()
        assert not ep.proc.alive()
        self.running.remove(ep)

    def kill(self, ep: Endpoint) -> None:
        join_background_closes()
        ep.proc.kill()
        assert not ep.proc.alive()
        self.running.remove(ep)


@contextmanager
def new_emulators() -> Iterator[Emulators]:
    with tempfile.TemporaryDirectory(prefix="sb-durable-") as d:
        e = Emulators(Path(d))
        try:
            yield e
        finally:
            join_background_closes()
            for ep in list(e.running):
                ep.proc.stop()


@SCENARIOS
def messages_survive_graceful_restart() -> None:
    with new_emulators() as emulators:
        ep = emulators.start()
        q = "durable"
        with QuickCloseClient(ServiceBusClient.from_connection_string(ep.connection_string, **CLIENT_OPTIONS)) as c:
            with c.get_queue_sender(q) as s:
                s.send_messages(ServiceBusMessage("done", message_id="done"))
            with c.get_queue_receiver(q) as r:
                (m,) = receive_exactly(r, 1)
                r.complete_message(m)  # completed before the restart: must stay gone
            with c.get_queue_sender(q) as s:
                s.send_messages(ServiceBusMessage("dead", message_id="dead"))
            with c.get_queue_receiver(q) as r:
                (m,) = receive_exactly(r, 1)
                r.dead_letter_message(m, reason="R", error_description="D")
            with c.get_queue_sender(q) as s:
                s.send_messages(ServiceBusMessage("deferred", message_id="deferred"))
            with c.get_queue_receiver(q) as r:
                (m,) = receive_exactly(r, 1)
                deferred_seq = m.sequence_number
                r.defer_message(m)
            with c.get_queue_sender(q) as s:
                s.send_messages(
                    [ServiceBusMessage(f"keep-{i}", message_id=f"keep-{i}", correlation_id=f"c-{i}",
                                       application_properties={"i": i}) for i in range(5)]
                )
                when = utcnow() + dt.timedelta(seconds=3)
                (scheduled_seq,) = s.schedule_messages(ServiceBusMessage("sched", message_id="sched"), when)
            with c.get_queue_receiver(q) as r:
                before = {m.message_id: m.sequence_number for m in r.peek_messages(max_message_count=20)}
                assert {f"keep-{i}" for i in range(5)} <= set(before)

        emulators.stop(ep)
        ep2 = emulators.start()
        assert ep2.port == ep.port

        with QuickCloseClient(ServiceBusClient.from_connection_string(ep2.connection_string, **CLIENT_OPTIONS)) as c:
            with c.get_queue_receiver(q) as r:
                got = receive_exactly(r, 5)
                assert [m.message_id for m in got] == [f"keep-{i}" for i in range(5)]
                for i, m in enumerate(got):
                    assert body_of(m) == f"keep-{i}".encode()
                    assert m.correlation_id == f"c-{i}"
                    assert app_props(m)["i"] == i
                    assert m.sequence_number == before[m.message_id]
                    r.complete_message(m)
                (d,) = r.receive_deferred_messages([deferred_seq])
                assert d.message_id == "deferred"
                r.complete_message(d)
                sleep_until(when)
                # Only the scheduled message is left: "done" was completed and stays gone.
                rest = r.receive_messages(max_message_count=10, max_wait_time=2)
                rest += r.receive_messages(max_message_count=10, max_wait_time=0.5)
                assert [(m.message_id, m.sequence_number) for m in rest] == [("sched", scheduled_seq)]
                r.complete_message(rest[0])
            with c.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
                (x,) = receive_exactly(dlq, 1)
                assert x.message_id == "dead"
                assert (x.dead_letter_reason, x.dead_letter_error_description) == ("R", "D")
                dlq.complete_message(x)
            # Sequence numbers are never reused after a restart.
            with c.get_queue_sender(q) as s:
                s.send_messages(ServiceBusMessage("after", message_id="after"))
            with c.get_queue_receiver(q) as r:
                (a,) = receive_exactly(r, 1)
                assert a.sequence_number > max([*before.values(), scheduled_seq, deferred_seq])
                r.complete_message(a)


def test_messages_survive_graceful_restart(scenarios: ScenarioRun) -> None:
    scenarios.check(messages_survive_graceful_restart)


@SCENARIOS
def sent_messages_survive_kill() -> None:
    with new_emulators() as emulators:
        ep = emulators.start()
        q = "durable-kill"
        n = 50
        c = ServiceBusClient.from_connection_string(ep.connection_string, **CLIENT_OPTIONS)
        with c, c.get_queue_sender(q) as s:
            for i in range(10):
                s.send_messages(ServiceBusMessage(f"k-{i}", message_id=f"k-{i}"))
            s.send_messages([ServiceBusMessage(f"k-{i}", message_id=f"k-{i}") for i in range(10, n)])
        # send_messages returned: the broker accepted them. A crash must not lose them.
        emulators.kill(ep)
        ep2 = emulators.start()
        c = ServiceBusClient.from_connection_string(ep2.connection_string, **CLIENT_OPTIONS)
        with c, c.get_queue_receiver(q) as r:
            got = receive_exactly(r, n, timeout=15)
            assert sorted(m.message_id for m in got) == sorted(f"k-{i}" for i in range(n))
            for m in got:
                r.complete_message(m)
            assert_nothing(r, 0.5)


def test_sent_messages_survive_kill(scenarios: ScenarioRun) -> None:
    scenarios.check(sent_messages_survive_kill)


@SCENARIOS
def existing_client_reconnects_after_restart() -> None:
    with new_emulators() as emulators:
        ep = emulators.start()
        q = "durable-reconnect"
        with ServiceBusClient.from_connection_string(ep.connection_string) as c:  # default options: SDK retries on
            sender = c.get_queue_sender(q)
            sender.send_messages(ServiceBusMessage("before", message_id="before"))
            emulators.stop(ep)
            emulators.start()
            # The same sender (SDK retries) goes on working against the restarted emulator.
            after = ServiceBusMessage("after", message_id="after")
            bounded(lambda: sender.send_messages(after), 40, "send after restart")
            sender.close()
            with c.get_queue_receiver(q) as r:
                got = receive_exactly(r, 2)
                assert [m.message_id for m in got] == ["before", "after"]
                for m in got:
                    r.complete_message(m)


def test_existing_client_reconnects_after_restart(scenarios: ScenarioRun) -> None:
    scenarios.check(existing_client_reconnects_after_restart)


@SCENARIOS
def duplicate_detection_history_survives_restart() -> None:
    # Queue "durable-dup": RequiresDuplicateDetection, window PT10M. Senders that retry after an emulator
    # restart rely on the history still being there.
    with new_emulators() as emulators:
        ep = emulators.start()
        q = "durable-dup"
        with QuickCloseClient(ServiceBusClient.from_connection_string(ep.connection_string, **CLIENT_OPTIONS)) as c:
            with c.get_queue_sender(q) as s:
                s.send_messages(ServiceBusMessage("x-1", message_id="X"))
                s.send_messages(ServiceBusMessage("p-1", message_id="P"))  # stays pending across the restart
            with c.get_queue_receiver(q) as r:
                (m,) = receive_exactly(r, 1)
                assert m.message_id == "X"
                r.complete_message(m)
        emulators.stop(ep)
        ep2 = emulators.start()
        with QuickCloseClient(ServiceBusClient.from_connection_string(ep2.connection_string, **CLIENT_OPTIONS)) as c:
            with c.get_queue_sender(q) as s:
                s.send_messages(ServiceBusMessage("x-2", message_id="X"))  # duplicate of a consumed message
                s.send_messages(ServiceBusMessage("p-2", message_id="P"))  # duplicate of a pending message
                s.send_messages(ServiceBusMessage("y", message_id="Y"))
            with c.get_queue_receiver(q) as r:
                got = receive_exactly(r, 2)
                assert [(m.message_id, body_of(m)) for m in got] == [("P", b"p-1"), ("Y", b"y")]
                for m in got:
                    r.complete_message(m)
                assert_nothing(r, 0.5)


def test_duplicate_detection_history_survives_restart(scenarios: ScenarioRun) -> None:
    scenarios.check(duplicate_detection_history_survives_restart)
