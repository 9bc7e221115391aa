"""Conformance: peek — browses without locking, from a sequence number, including locked messages."""

from __future__ import annotations

import datetime as dt

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusMessageState

from tests.local.servicebus.support import app_props, body_of, receive_exactly, utcnow

pytestmark = pytest.mark.integration


def test_peek_does_not_lock_and_starts_from_sequence_number(client: ServiceBusClient) -> None:
    with client.get_queue_sender("peek") as sender:
        sender.send_messages(
            [ServiceBusMessage(f"pk-{i}", message_id=f"pk-{i}", application_properties={"i": i}) for i in range(5)]
        )
    with client.get_queue_receiver("peek") as r:
        peeked = r.peek_messages(max_message_count=10)
        assert [m.message_id for m in peeked] == [f"pk-{i}" for i in range(5)]
        assert [body_of(m) for m in peeked] == [f"pk-{i}".encode() for i in range(5)]
        assert [app_props(m)["i"] for m in peeked] == list(range(5))
        seqs = [m.sequence_number for m in peeked]
        assert all(isinstance(s, int) for s in seqs) and seqs == sorted(seqs) and len(set(seqs)) == 5
        assert all(m.enqueued_time_utc is not None for m in peeked)

        # Peek again: same messages (peek neither consumes nor locks).
        again = r.peek_messages(max_message_count=10, sequence_number=seqs[0])
        assert [m.message_id for m in again] == [f"pk-{i}" for i in range(5)]

        # From a sequence number, and limited by count.
        assert [m.message_id for m in r.peek_messages(max_message_count=10, sequence_number=seqs[2])] == \
            ["pk-2", "pk-3", "pk-4"]
        assert [m.message_id for m in r.peek_messages(max_message_count=2, sequence_number=seqs[1])] == \
            ["pk-1", "pk-2"]
        assert r.peek_messages(max_message_count=10, sequence_number=seqs[-1] + 1) == []

        # Nothing was locked or counted as a delivery: all five are receivable at once.
        got = receive_exactly(r, 5, timeout=5)
        assert sorted(m.message_id for m in got) == [f"pk-{i}" for i in range(5)]
        assert all(m.delivery_count == 0 for m in got)
        for m in got:
            r.complete_message(m)
        assert r.peek_messages(max_message_count=10, sequence_number=seqs[0]) == []


def test_peek_includes_locked_messages(client: ServiceBusClient) -> None:
    with client.get_queue_sender("peek-locked") as sender:
        sender.send_messages([ServiceBusMessage("l-0", message_id="l-0"), ServiceBusMessage("l-1", message_id="l-1")])
    with client.get_queue_receiver("peek-locked") as r, client.get_queue_receiver("peek-locked") as browser:
        got = receive_exactly(r, 2)  # both locked by r
        peeked = browser.peek_messages(max_message_count=10)
        assert [m.message_id for m in peeked] == ["l-0", "l-1"]
        for m in got:
            r.complete_message(m)
        assert browser.peek_messages(max_message_count=10, sequence_number=peeked[0].sequence_number) == []


def test_peek_includes_deferred_and_scheduled_but_not_dead_lettered(client: ServiceBusClient) -> None:
    # Azure's message-browsing table: active, locked, deferred and (for queues) scheduled messages are peeked,
    # dead-lettered ones are not; x-opt-message-state tells them apart.
    later = utcnow() + dt.timedelta(minutes=10)
    with client.get_queue_sender("peek-states") as sender:
        sender.send_messages(
            [ServiceBusMessage(f"{x}", message_id=x) for x in ("deferred", "dead", "active")]
        )
        (sched_seq,) = sender.schedule_messages(ServiceBusMessage("scheduled", message_id="scheduled"), later)
    with client.get_queue_receiver("peek-states") as r:
        got = {m.message_id: m for m in receive_exactly(r, 3)}
        r.defer_message(got["deferred"])
        r.dead_letter_message(got["dead"], reason="x")
        r.abandon_message(got["active"])
        peeked = {m.message_id: m for m in r.peek_messages(max_message_count=10, sequence_number=1)}
        assert set(peeked) == {"deferred", "active", "scheduled"}
        assert peeked["deferred"].state == ServiceBusMessageState.DEFERRED
        assert peeked["scheduled"].state == ServiceBusMessageState.SCHEDULED
        assert peeked["scheduled"].sequence_number == sched_seq
        assert peeked["active"].state == ServiceBusMessageState.ACTIVE
        with client.get_queue_sender("peek-states") as sender:
            sender.cancel_scheduled_messages(sched_seq)
