"""Conformance: sessions — session filter, next available session, state, lock renewal, ordering, settlement."""

from __future__ import annotations

import time

import pytest
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import OperationTimeoutError, SessionCannotBeLockedError

from tests.local.servicebus.support import (
    ScenarioRun,
    Scenarios,
    assert_nothing,
    body_of,
    bounded,
    receive_exactly,
    sleep_until,
    utcnow,
)

pytestmark = pytest.mark.integration

SCENARIOS = Scenarios()  # the waiting-dominated tests below run concurrently (see support.Scenarios)


def _try_lock_session(client: ServiceBusClient, queue: str, session_id: str) -> None:
    """Open a receiver on ``session_id``; raises SessionCannotBeLockedError if someone holds it."""
    with client.get_queue_receiver(queue, session_id=session_id, max_wait_time=2) as r:
        r.receive_messages(max_message_count=1, max_wait_time=1)


def test_session_filter_receives_only_that_session(client: ServiceBusClient) -> None:
    with client.get_queue_sender("sess-filter") as sender:
        for i in range(3):
            sender.send_messages(ServiceBusMessage(f"s1-{i}", message_id=f"s1-{i}", session_id="s1"))
            sender.send_messages(ServiceBusMessage(f"s2-{i}", message_id=f"s2-{i}", session_id="s2"))
    for sid in ("s2", "s1"):
        with client.get_queue_receiver("sess-filter", session_id=sid, max_wait_time=5) as r:
            got = receive_exactly(r, 3)
            assert r.session.session_id == sid
            assert [m.message_id for m in got] == [f"{sid}-{i}" for i in range(3)]
            assert all(m.session_id == sid for m in got)
            for m in got:
                r.complete_message(m)
            assert_nothing(r, 0.5)


def test_next_available_session_and_exclusive_lock(client: ServiceBusClient) -> None:
    with client.get_queue_sender("sess-next") as sender:
        sender.send_messages(ServiceBusMessage("a", message_id="a-1", session_id="a"))
        sender.send_messages(ServiceBusMessage("b", message_id="b-1", session_id="b"))
    with client.get_queue_receiver("sess-next", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as r1:
        (m1,) = receive_exactly(r1, 1)
        first = r1.session.session_id
        assert first in {"a", "b"}
        assert m1.session_id == first and m1.message_id == f"{first}-1"
        assert r1.session.locked_until_utc is not None and r1.session.locked_until_utc > utcnow()
        with client.get_queue_receiver("sess-next", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as r2:
            (m2,) = receive_exactly(r2, 1)
            second = r2.session.session_id
            assert {first, second} == {"a", "b"}, "next available must skip the locked session"
            assert m2.session_id == second
            # The locked session cannot be taken by another receiver.
            with pytest.raises(SessionCannotBeLockedError):
                bounded(lambda: _try_lock_session(client, "sess-next", first), 20, "locking a locked session")
            r2.complete_message(m2)
        r1.complete_message(m1)


@SCENARIOS
def next_available_session_none_available_times_out(client: ServiceBusClient) -> None:
    def accept() -> None:
        with client.get_queue_receiver("sess-empty", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2) as r:
            r.receive_messages(max_message_count=1, max_wait_time=2)

    t0 = time.monotonic()
    with pytest.raises(OperationTimeoutError):
        bounded(accept, 30, "accepting the next available session on an empty queue")
    assert time.monotonic() - t0 < 15


def test_next_available_session_none_available_times_out(scenarios: ScenarioRun) -> None:
    scenarios.check(next_available_session_none_available_times_out)


def test_session_state_set_get_and_persist(client: ServiceBusClient) -> None:
    with client.get_queue_sender("sess-state") as sender:
        sender.send_messages(ServiceBusMessage("x", message_id="st-1", session_id="st"))
    with client.get_queue_receiver("sess-state", session_id="st", max_wait_time=5) as r:
        assert r.session.get_state() is None
        r.session.set_state(b"state-1")
        assert r.session.get_state() == b"state-1"
        r.session.set_state("state-2")
        assert r.session.get_state() == b"state-2"
        (m,) = receive_exactly(r, 1)
        r.complete_message(m)
        r.close()  # release the session lock now, so it can be accepted again below
    # The state outlives the lock and the session's messages.
    with client.get_queue_receiver("sess-state", session_id="st", max_wait_time=5) as r:
        assert r.session.get_state() == b"state-2"
        r.session.set_state(None)
        assert r.session.get_state() is None
    # Another session's state is its own.
    with client.get_queue_receiver("sess-state", session_id="other", max_wait_time=5) as r:
        assert r.session.get_state() is None


@SCENARIOS
def session_lock_renewal(client: ServiceBusClient) -> None:
    # Queue "sess-renew": LockDuration PT2S; keep the session for 5 s by renewing.
    with client.get_queue_sender("sess-renew") as sender:
        sender.send_messages(ServiceBusMessage("x", message_id="sr-1", session_id="rn"))
    with client.get_queue_receiver("sess-renew", session_id="rn", max_wait_time=5) as r:
        (m,) = receive_exactly(r, 1)
        first = r.session.locked_until_utc
        assert first is not None
        left = (first - utcnow()).total_seconds()
        assert 0.5 < left <= 3, f"session locked_until_utc {left:.2f}s ahead, LockDuration is 2s"
        prev = first
        end = time.monotonic() + 4.5
        while time.monotonic() < end:
            time.sleep(0.7)
            new = r.session.renew_lock()
            assert new > prev, f"session renewal did not move the lock forward: {prev} -> {new}"
            assert r.session.locked_until_utc == new
            assert 1.0 < (new - utcnow()).total_seconds() <= 3
            prev = new
        # Still ours, 2.5 lock durations later.
        with pytest.raises(SessionCannotBeLockedError):
            bounded(lambda: _try_lock_session(client, "sess-renew", "rn"), 20, "locking a renewed session")
        r.complete_message(m)


def test_session_lock_renewal(scenarios: ScenarioRun) -> None:
    scenarios.check(session_lock_renewal)


@SCENARIOS
def session_auto_lock_renewer(client: ServiceBusClient) -> None:
    # Queue "sess-autorenew": LockDuration PT2S.
    failures: list[BaseException | None] = []
    renewer = AutoLockRenewer(max_lock_renewal_duration=30, on_lock_renew_failure=lambda _r, e: failures.append(e))
    with client.get_queue_sender("sess-autorenew") as sender:
        sender.send_messages(ServiceBusMessage("x", message_id="sar-1", session_id="ar"))
    try:
        with client.get_queue_receiver("sess-autorenew", session_id="ar", max_wait_time=5,
                                       auto_lock_renewer=renewer) as r:
            (m,) = receive_exactly(r, 1)
            first = r.session.locked_until_utc
            assert first is not None
            time.sleep(4.5)
            assert not failures, f"session lock renewal failed: {failures}"
            assert r.session.locked_until_utc is not None
            assert (r.session.locked_until_utc - first).total_seconds() > 3
            with pytest.raises(SessionCannotBeLockedError):
                bounded(lambda: _try_lock_session(client, "sess-autorenew", "ar"), 20, "locking a renewed session")
            r.complete_message(m)
    finally:
        renewer.close()


def test_session_auto_lock_renewer(scenarios: ScenarioRun) -> None:
    scenarios.check(session_auto_lock_renewer)


@SCENARIOS
def session_lock_expiry_releases_session(client: ServiceBusClient) -> None:
    # Control for the renewal tests: without renewal, the session is free again after LockDuration (PT2S).
    with client.get_queue_sender("sess-expiry") as sender:
        sender.send_messages(ServiceBusMessage("x", message_id="se-1", session_id="ex"))
    r1 = client.get_queue_receiver("sess-expiry", session_id="ex", max_wait_time=5)
    try:
        (m,) = receive_exactly(r1, 1)
        until = r1.session.locked_until_utc
        assert until is not None
        sleep_until(until, extra=0.5)
        with client.get_queue_receiver("sess-expiry", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as r2:
            (again,) = receive_exactly(r2, 1, timeout=5)
            assert r2.session.session_id == "ex"
            assert again.message_id == "se-1"
            r2.complete_message(again)
    finally:
        r1.close()


def test_session_lock_expiry_releases_session(scenarios: ScenarioRun) -> None:
    scenarios.check(session_lock_expiry_releases_session)


def test_ordering_within_session(client: ServiceBusClient) -> None:
    n = 30
    with client.get_queue_sender("sess-order") as sender:
        for i in range(10):
            sender.send_messages(ServiceBusMessage(f"o-{i}", message_id=f"o-{i}", session_id="o"))
            sender.send_messages(ServiceBusMessage(f"p-{i}", message_id=f"p-{i}", session_id="p"))
        sender.send_messages(
            [ServiceBusMessage(f"o-{i}", message_id=f"o-{i}", session_id="o") for i in range(10, 20)]
            + [ServiceBusMessage(f"p-{i}", message_id=f"p-{i}", session_id="p") for i in range(10, 20)]
        )
        batch = sender.create_message_batch()
        for i in range(20, n):
            batch.add_message(ServiceBusMessage(f"o-{i}", message_id=f"o-{i}", session_id="o"))
        sender.send_messages(batch)
    for sid, count in (("o", n), ("p", 20)):
        with client.get_queue_receiver("sess-order", session_id=sid, max_wait_time=5, prefetch_count=10) as r:
            got = receive_exactly(r, count, timeout=15)
            assert [m.message_id for m in got] == [f"{sid}-{i}" for i in range(count)]
            seqs = [m.sequence_number for m in got]
            assert seqs == sorted(seqs)
            for m in got:
                r.complete_message(m)


def test_session_settlement(client: ServiceBusClient) -> None:
    with client.get_queue_sender("sess-settle") as sender:
        sender.send_messages(ServiceBusMessage("ab", message_id="ss-ab", session_id="z"))
        sender.send_messages(ServiceBusMessage("dl", message_id="ss-dl", session_id="z"))
        sender.send_messages(ServiceBusMessage("df", message_id="ss-df", session_id="z"))
    with client.get_queue_receiver("sess-settle", session_id="z", max_wait_time=5) as r:
        (a,) = receive_exactly(r, 1)
        assert a.message_id == "ss-ab" and a.delivery_count == 0
        r.abandon_message(a)
        (a2,) = receive_exactly(r, 1)
        assert a2.message_id == "ss-ab" and a2.delivery_count == 1  # redelivered first: order is kept
        r.complete_message(a2)
        (d, f) = receive_exactly(r, 2)
        assert (d.message_id, f.message_id) == ("ss-dl", "ss-df")
        r.dead_letter_message(d, reason="Bad", error_description="in a session")
        seq = f.sequence_number
        r.defer_message(f)
        assert_nothing(r, 0.5)
        (f2,) = r.receive_deferred_messages([seq])
        assert f2.message_id == "ss-df" and body_of(f2) == b"df"
        r.complete_message(f2)
    with client.get_queue_receiver("sess-settle", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (x,) = receive_exactly(dlq, 1)
        assert x.message_id == "ss-dl" and x.session_id == "z"
        assert (x.dead_letter_reason, x.dead_letter_error_description) == ("Bad", "in a session")
        dlq.complete_message(x)
