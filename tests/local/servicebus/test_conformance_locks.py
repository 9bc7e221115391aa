"""Conformance: message locks — expiry and redelivery, max delivery count, manual and automatic renewal."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from azure.servicebus import AutoLockRenewer, ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

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


@SCENARIOS
def lock_expiry_redelivers_with_incremented_delivery_count(client: ServiceBusClient) -> None:
    # Queue "lock-expiry": LockDuration PT2S.
    with client.get_queue_sender("lock-expiry") as sender:
        sender.send_messages(ServiceBusMessage("expiring", message_id="le-1"))
    with client.get_queue_receiver("lock-expiry") as a, client.get_queue_receiver("lock-expiry") as b:
        (m,) = receive_exactly(a, 1)
        assert m.delivery_count == 0
        assert m.locked_until_utc is not None
        left = (m.locked_until_utc - utcnow()).total_seconds()
        assert 0.5 < left <= 3, f"locked_until_utc {left:.2f}s ahead, queue LockDuration is 2s"
        assert_nothing(b, 0.5)  # still locked
        sleep_until(m.locked_until_utc, extra=0.3)
        (m2,) = receive_exactly(b, 1, timeout=5)
        assert m2.message_id == "le-1"
        assert m2.sequence_number == m.sequence_number
        assert body_of(m2) == b"expiring"
        assert m2.delivery_count == 1
        assert m2.lock_token != m.lock_token
        b.complete_message(m2)
        assert_nothing(b, 0.5)


def test_lock_expiry_redelivers_with_incremented_delivery_count(scenarios: ScenarioRun) -> None:
    scenarios.check(lock_expiry_redelivers_with_incremented_delivery_count)


@SCENARIOS
def max_delivery_count_by_abandon_moves_to_dead_letter(client: ServiceBusClient) -> None:
    # Queue "maxdelivery-abandon": MaxDeliveryCount 3.
    with client.get_queue_sender("maxdelivery-abandon") as sender:
        sender.send_messages(ServiceBusMessage("poison", message_id="mda-1"))
    with client.get_queue_receiver("maxdelivery-abandon") as r:
        for attempt in range(3):
            (m,) = receive_exactly(r, 1, timeout=5)
            assert m.message_id == "mda-1"
            assert m.delivery_count == attempt
            r.abandon_message(m)
        assert_nothing(r, 0.5)  # the 3rd failed delivery exhausted MaxDeliveryCount
        assert r.peek_messages(max_message_count=10) == []
    with client.get_queue_receiver("maxdelivery-abandon", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (d,) = receive_exactly(dlq, 1, timeout=5)
        assert d.message_id == "mda-1"
        assert body_of(d) == b"poison"
        assert d.dead_letter_reason == "MaxDeliveryCountExceeded"
        dlq.complete_message(d)
        assert_nothing(dlq, 0.5)


def test_max_delivery_count_by_abandon_moves_to_dead_letter(scenarios: ScenarioRun) -> None:
    scenarios.check(max_delivery_count_by_abandon_moves_to_dead_letter)


@SCENARIOS
def max_delivery_count_by_lock_expiry_moves_to_dead_letter(client: ServiceBusClient) -> None:
    # Queue "maxdelivery-expiry": MaxDeliveryCount 2, LockDuration PT1S.
    with client.get_queue_sender("maxdelivery-expiry") as sender:
        sender.send_messages(ServiceBusMessage("slow", message_id="mde-1"))
    with client.get_queue_receiver("maxdelivery-expiry") as r:
        for attempt in range(2):
            (m,) = receive_exactly(r, 1, timeout=5)
            assert m.delivery_count == attempt
            assert m.locked_until_utc is not None
            sleep_until(m.locked_until_utc, extra=0.3)  # never settled: the lock expires
        assert_nothing(r, 1.0)
    with client.get_queue_receiver("maxdelivery-expiry", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (d,) = receive_exactly(dlq, 1, timeout=5)
        assert d.message_id == "mde-1"
        assert d.dead_letter_reason == "MaxDeliveryCountExceeded"
        dlq.complete_message(d)


def test_max_delivery_count_by_lock_expiry_moves_to_dead_letter(scenarios: ScenarioRun) -> None:
    scenarios.check(max_delivery_count_by_lock_expiry_moves_to_dead_letter)


@SCENARIOS
def renew_message_lock_extends_lock(client: ServiceBusClient) -> None:
    # Queue "lock-renew": LockDuration PT2S. Hold the message for 5 s (2.5 lock durations) by renewing.
    with client.get_queue_sender("lock-renew") as sender:
        sender.send_messages(ServiceBusMessage("held", message_id="lr-1"))
    with client.get_queue_receiver("lock-renew") as a, client.get_queue_receiver("lock-renew") as b:
        (m,) = receive_exactly(a, 1)
        first = m.locked_until_utc
        assert first is not None
        prev = first
        end = time.monotonic() + 4.5
        renewals = 0
        while time.monotonic() < end:
            assert_nothing(b, 0.6)  # another receiver never gets the held message
            new = a.renew_message_lock(m)
            renewals += 1
            assert isinstance(new, dt.datetime)
            assert new > prev, f"renewal did not move locked_until forward: {prev} -> {new}"
            assert m.locked_until_utc == new
            left = (new - utcnow()).total_seconds()
            assert 1.0 < left <= 3, f"renewed lock ends {left:.2f}s ahead, LockDuration is 2s"
            prev = new
        assert renewals >= 4
        assert (prev - first).total_seconds() > 3
        a.complete_message(m)  # still ours after 2.5 lock durations
        assert_nothing(b, 0.5)
        assert a.peek_messages(max_message_count=10) == []


def test_renew_message_lock_extends_lock(scenarios: ScenarioRun) -> None:
    scenarios.check(renew_message_lock_extends_lock)


@SCENARIOS
def auto_lock_renewer_keeps_message_locked(client: ServiceBusClient) -> None:
    # Queue "lock-autorenew": LockDuration PT2S.
    failures: list[BaseException | None] = []
    renewer = AutoLockRenewer(max_lock_renewal_duration=30, on_lock_renew_failure=lambda _r, e: failures.append(e))
    with client.get_queue_sender("lock-autorenew") as sender:
        sender.send_messages(ServiceBusMessage("auto", message_id="alr-1"))
    try:
        with client.get_queue_receiver("lock-autorenew", auto_lock_renewer=renewer) as a, \
                client.get_queue_receiver("lock-autorenew") as b:
            (m,) = receive_exactly(a, 1)
            first = m.locked_until_utc
            assert first is not None
            end = time.monotonic() + 4.5
            while time.monotonic() < end:
                assert_nothing(b, 0.5)
            assert not failures, f"lock renewal failed: {failures}"
            assert m.locked_until_utc is not None and (m.locked_until_utc - first).total_seconds() > 3
            a.complete_message(m)
            assert_nothing(b, 0.5)
    finally:
        renewer.close()
    assert not failures, f"lock renewal failed: {failures}"



def test_auto_lock_renewer_keeps_message_locked(scenarios: ScenarioRun) -> None:
    scenarios.check(auto_lock_renewer_keeps_message_locked)
