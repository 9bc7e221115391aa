"""Conformance: scheduled messages, cancellation, time-to-live (drop or dead-letter) and duplicate detection."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from tests.local.servicebus.support import (
    ScenarioRun,
    Scenarios,
    assert_nothing,
    body_of,
    receive_exactly,
    sleep_until,
    utcnow,
)

pytestmark = pytest.mark.integration

SCENARIOS = Scenarios()  # the waiting-dominated tests below run concurrently (see support.Scenarios)

TOLERANCE = dt.timedelta(milliseconds=250)


# --- scheduling -----------------------------------------------------------------------------------


@SCENARIOS
def scheduled_by_annotation(client: ServiceBusClient) -> None:
    when = utcnow() + dt.timedelta(seconds=2)
    when = when.replace(microsecond=when.microsecond // 1000 * 1000)  # AMQP timestamps are milliseconds
    with client.get_queue_sender("sched-annotation") as sender:
        sender.send_messages(ServiceBusMessage("later", message_id="sa-1", scheduled_enqueue_time_utc=when))
    with client.get_queue_receiver("sched-annotation") as r:
        assert_nothing(r, 0.5)
        assert utcnow() < when, "test too slow: the schedule time passed before checking it was hidden"
        (m,) = receive_exactly(r, 1, timeout=8)
        arrived = utcnow()
        assert arrived >= when - TOLERANCE, f"delivered {(when - arrived).total_seconds():.2f}s early"
        assert m.message_id == "sa-1" and body_of(m) == b"later"
        assert m.scheduled_enqueue_time_utc is not None
        assert abs((m.scheduled_enqueue_time_utc - when).total_seconds()) < 0.002
        r.complete_message(m)
        assert_nothing(r, 0.3)


def test_scheduled_by_annotation(scenarios: ScenarioRun) -> None:
    scenarios.check(scheduled_by_annotation)


@SCENARIOS
def schedule_messages_api(client: ServiceBusClient) -> None:
    when = utcnow() + dt.timedelta(seconds=2)
    with client.get_queue_sender("sched-api") as sender:
        seqs = sender.schedule_messages(
            [ServiceBusMessage("s1", message_id="sx-1"), ServiceBusMessage("s2", message_id="sx-2")], when
        )
        assert isinstance(seqs, list) and len(seqs) == 2
        assert all(isinstance(s, int) for s in seqs) and seqs[0] != seqs[1]
        (single,) = sender.schedule_messages(ServiceBusMessage("s3", message_id="sx-3"), when)
        assert isinstance(single, int) and single not in seqs
    with client.get_queue_receiver("sched-api") as r:
        assert_nothing(r, 0.5)
        assert utcnow() < when, "test too slow: the schedule time passed before checking it was hidden"
        got = receive_exactly(r, 3, timeout=8)
        assert utcnow() >= when - TOLERANCE
        by_id = {m.message_id: m for m in got}
        assert set(by_id) == {"sx-1", "sx-2", "sx-3"}
        # The sequence numbers handed out at scheduling time are the messages' sequence numbers.
        assert by_id["sx-1"].sequence_number == seqs[0]
        assert by_id["sx-2"].sequence_number == seqs[1]
        assert by_id["sx-3"].sequence_number == single
        for m in got:
            r.complete_message(m)


def test_schedule_messages_api(scenarios: ScenarioRun) -> None:
    scenarios.check(schedule_messages_api)


@SCENARIOS
def cancel_scheduled_messages(client: ServiceBusClient) -> None:
    when = utcnow() + dt.timedelta(seconds=2)
    with client.get_queue_sender("sched-cancel") as sender:
        seqs = sender.schedule_messages(
            [
                ServiceBusMessage("keep", message_id="sc-keep"),
                ServiceBusMessage("drop", message_id="sc-drop"),
                ServiceBusMessage("drop2", message_id="sc-drop2"),
            ],
            when,
        )
        sender.cancel_scheduled_messages(seqs[1])  # a single sequence number
        sender.cancel_scheduled_messages([seqs[2]])  # a list
    with client.get_queue_receiver("sched-cancel") as r:
        (m,) = receive_exactly(r, 1, timeout=8)
        assert m.message_id == "sc-keep" and m.sequence_number == seqs[0]
        r.complete_message(m)
        sleep_until(when, extra=0.5)
        assert_nothing(r, 0.5)  # the cancelled ones never arrive
        assert r.peek_messages(max_message_count=10) == []


def test_cancel_scheduled_messages(scenarios: ScenarioRun) -> None:
    scenarios.check(cancel_scheduled_messages)


# --- time to live ---------------------------------------------------------------------------------


@SCENARIOS
def ttl_expired_message_is_dropped(client: ServiceBusClient) -> None:
    # Queue "ttl-drop": DeadLetteringOnMessageExpiration false, DefaultMessageTimeToLive PT1H.
    with client.get_queue_sender("ttl-drop") as sender:
        sender.send_messages(ServiceBusMessage("short", message_id="td-short", time_to_live=dt.timedelta(seconds=1)))
        sender.send_messages(ServiceBusMessage("long", message_id="td-long"))
    time.sleep(1.5)
    with client.get_queue_receiver("ttl-drop") as r:
        (m,) = receive_exactly(r, 1)
        assert m.message_id == "td-long"
        r.complete_message(m)
        assert_nothing(r, 0.5)
    with client.get_queue_receiver("ttl-drop", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        assert_nothing(dlq, 0.5)  # dropped, not dead-lettered


def test_ttl_expired_message_is_dropped(scenarios: ScenarioRun) -> None:
    scenarios.check(ttl_expired_message_is_dropped)


@SCENARIOS
def queue_default_ttl_applies_and_caps_message_ttl(client: ServiceBusClient) -> None:
    # Queue "ttl-default": DefaultMessageTimeToLive PT1S. A message TTL longer than the queue's is capped to it.
    with client.get_queue_sender("ttl-default") as sender:
        sender.send_messages(ServiceBusMessage("no-ttl", message_id="tdf-1"))
        sender.send_messages(ServiceBusMessage("long-ttl", message_id="tdf-2", time_to_live=dt.timedelta(hours=1)))
    time.sleep(1.6)
    with client.get_queue_receiver("ttl-default") as r:
        assert_nothing(r, 0.5)
    with client.get_queue_receiver("ttl-default", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        assert_nothing(dlq, 0.5)


def test_queue_default_ttl_applies_and_caps_message_ttl(scenarios: ScenarioRun) -> None:
    scenarios.check(queue_default_ttl_applies_and_caps_message_ttl)


@SCENARIOS
def ttl_expiry_dead_letters_when_configured(client: ServiceBusClient) -> None:
    # Queue "ttl-deadletter": DeadLetteringOnMessageExpiration true.
    with client.get_queue_sender("ttl-deadletter") as sender:
        sender.send_messages(
            ServiceBusMessage("stale", message_id="tdl-1", time_to_live=dt.timedelta(seconds=1),
                              application_properties={"k": "v"})
        )
        sender.send_messages(ServiceBusMessage("fresh", message_id="tdl-2"))
    time.sleep(1.5)
    with client.get_queue_receiver("ttl-deadletter") as r:
        (m,) = receive_exactly(r, 1)
        assert m.message_id == "tdl-2"
        r.complete_message(m)
        assert_nothing(r, 0.5)
    with client.get_queue_receiver("ttl-deadletter", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (d,) = receive_exactly(dlq, 1, timeout=5)
        assert d.message_id == "tdl-1"
        assert body_of(d) == b"stale"
        assert d.dead_letter_reason == "TTLExpiredException"
        dlq.complete_message(d)
        assert_nothing(dlq, 0.5)


def test_ttl_expiry_dead_letters_when_configured(scenarios: ScenarioRun) -> None:
    scenarios.check(ttl_expiry_dead_letters_when_configured)


# --- duplicate detection --------------------------------------------------------------------------


@SCENARIOS
def duplicate_detection_within_window(client: ServiceBusClient) -> None:
    # Queue "dup": RequiresDuplicateDetection, window PT10M.
    with client.get_queue_sender("dup") as sender:
        sender.send_messages(ServiceBusMessage("A-first", message_id="A"))
        sender.send_messages(ServiceBusMessage("A-second", message_id="A"))  # accepted, then dropped
        sender.send_messages(ServiceBusMessage("B", message_id="B"))
        sender.send_messages([ServiceBusMessage("C", message_id="C"), ServiceBusMessage("D", message_id="D")])
        sender.send_messages(ServiceBusMessage("C-again", message_id="C"))
    with client.get_queue_receiver("dup") as r:
        got = receive_exactly(r, 4)
        by_id = {m.message_id: m for m in got}
        assert sorted(m.message_id for m in got) == ["A", "B", "C", "D"]
        assert body_of(by_id["A"]) == b"A-first"
        assert body_of(by_id["C"]) == b"C"
        for m in got:
            r.complete_message(m)
        assert_nothing(r, 0.5)
        # Still within the window after the original was consumed: a resend is still a duplicate.
        with client.get_queue_sender("dup") as sender:
            sender.send_messages(ServiceBusMessage("A-third", message_id="A"))
            sender.send_messages(ServiceBusMessage("E", message_id="E"))
        (e,) = receive_exactly(r, 1)
        assert e.message_id == "E"
        r.complete_message(e)
        assert_nothing(r, 0.5)


def test_duplicate_detection_within_window(scenarios: ScenarioRun) -> None:
    scenarios.check(duplicate_detection_within_window)


@SCENARIOS
def no_duplicate_detection_when_not_required(client: ServiceBusClient) -> None:
    with client.get_queue_sender("nodup") as sender:
        sender.send_messages(ServiceBusMessage("1", message_id="same"))
        sender.send_messages(ServiceBusMessage("2", message_id="same"))
    with client.get_queue_receiver("nodup") as r:
        got = receive_exactly(r, 2)
        assert sorted(body_of(m) for m in got) == [b"1", b"2"]
        for m in got:
            r.complete_message(m)



def test_no_duplicate_detection_when_not_required(scenarios: ScenarioRun) -> None:
    scenarios.check(no_duplicate_detection_when_not_required)
