"""Conformance: sending, message properties, receive modes and settlement, driven only through the SDK.

Each test owns its queue in Config.json, so tests do not interfere.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageBatch,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessageNotFoundError, MessagingEntityNotFoundError

from tests.conftest import Endpoint
from tests.local.servicebus.support import (
    app_props,
    assert_nothing,
    body_of,
    bounded,
    receive_exactly,
    utcnow,
)

pytestmark = pytest.mark.integration


# --- send ---------------------------------------------------------------------------------------


def test_send_single_messages(client: ServiceBusClient) -> None:
    big = bytes(range(256)) * 400  # 100 KiB: spans many AMQP frames
    with client.get_queue_sender("send-single") as sender:
        sender.send_messages(ServiceBusMessage("hello", message_id="s-1"))
        sender.send_messages(ServiceBusMessage(b"\x00\x01binary\xff", message_id="s-2"))
        sender.send_messages(ServiceBusMessage(big, message_id="s-3"))
    with client.get_queue_receiver("send-single") as receiver:
        got = receive_exactly(receiver, 3)
        by_id = {m.message_id: m for m in got}
        assert set(by_id) == {"s-1", "s-2", "s-3"}
        assert body_of(by_id["s-1"]) == b"hello"
        assert str(by_id["s-1"]) == "hello"
        assert body_of(by_id["s-2"]) == b"\x00\x01binary\xff"
        assert body_of(by_id["s-3"]) == big
        seqs = [by_id[i].sequence_number for i in ("s-1", "s-2", "s-3")]
        assert all(isinstance(s, int) for s in seqs)
        assert seqs == sorted(seqs) and len(set(seqs)) == 3, f"sequence numbers not increasing: {seqs}"
        now = utcnow()
        for m in got:
            assert m.enqueued_time_utc is not None
            assert abs((m.enqueued_time_utc - now).total_seconds()) < 30
            receiver.complete_message(m)
        assert_nothing(receiver, 0.5)


def test_send_batch_object(client: ServiceBusClient) -> None:
    with client.get_queue_sender("send-batch") as sender:
        batch = sender.create_message_batch()
        assert isinstance(batch, ServiceBusMessageBatch)
        for i in range(10):
            batch.add_message(ServiceBusMessage(f"batch-{i}", message_id=f"b-{i}", application_properties={"idx": i}))
        assert len(batch) == 10
        sender.send_messages(batch)
    with client.get_queue_receiver("send-batch") as receiver:
        got = receive_exactly(receiver, 10)
        assert sorted(m.message_id for m in got) == sorted(f"b-{i}" for i in range(10))
        for m in got:
            assert body_of(m) == f"batch-{app_props(m)['idx']}".encode()
        # Sequence numbers follow the order of the messages in the batch.
        ordered = sorted(got, key=lambda m: app_props(m)["idx"])
        seqs = [m.sequence_number for m in ordered]
        assert seqs == sorted(seqs) and len(set(seqs)) == 10, seqs
        for m in got:
            receiver.complete_message(m)
        assert_nothing(receiver, 0.5)


def test_send_list_of_messages(client: ServiceBusClient) -> None:
    n = 200
    with client.get_queue_sender("send-list") as sender:
        sender.send_messages([ServiceBusMessage(f"list-{i}", message_id=f"l-{i}") for i in range(5)])
        sender.send_messages([ServiceBusMessage(f"list-{i}", message_id=f"l-{i}") for i in range(5, n)])
    with client.get_queue_receiver("send-list", prefetch_count=50) as receiver:
        got = receive_exactly(receiver, n, timeout=20)
        assert sorted(m.message_id for m in got) == sorted(f"l-{i}" for i in range(n))
        assert all(body_of(m) == f"list-{m.message_id[2:]}".encode() for m in got)
        for m in got:
            receiver.complete_message(m)
        assert_nothing(receiver, 0.5)


# --- properties ---------------------------------------------------------------------------------


def test_message_properties_round_trip(client: ServiceBusClient) -> None:
    props = {"s": "text", "u": "héllo ✓ 日本", "i": 42, "max32": 2**31 - 1, "neg": -7, "t": True, "fl": False,
             "f": 1.5}
    sent = ServiceBusMessage(
        b'{"a": 1}',
        message_id="props-1",
        correlation_id="corr-1",
        reply_to="reply-queue",
        subject="the-subject",
        content_type="application/json",
        to="someone",
        application_properties=props,
        time_to_live=dt.timedelta(minutes=5),
    )
    with client.get_queue_sender("props") as sender:
        sender.send_messages(sent)
    with client.get_queue_receiver("props") as receiver:
        (m,) = receive_exactly(receiver, 1)
        assert body_of(m) == b'{"a": 1}'
        assert m.message_id == "props-1"
        assert m.correlation_id == "corr-1"
        assert m.reply_to == "reply-queue"
        assert m.subject == "the-subject"
        assert m.content_type == "application/json"
        assert m.to == "someone"
        assert m.time_to_live == dt.timedelta(minutes=5)
        got = app_props(m)
        for k, v in props.items():
            assert k in got, f"application property {k!r} lost: {got}"
            assert got[k] == v and type(got[k]) is type(v), f"{k}: sent {v!r}, got {got[k]!r}"
        receiver.complete_message(m)


def test_unicode_and_empty_bodies_round_trip(client: ServiceBusClient) -> None:
    with client.get_queue_sender("props") as sender:
        sender.send_messages(ServiceBusMessage("héllo ✓ 日本", message_id="uni-1", subject="sübject ✓"))
        sender.send_messages(ServiceBusMessage(b"", message_id="empty-1"))
    with client.get_queue_receiver("props") as receiver:
        got = {m.message_id: m for m in receive_exactly(receiver, 2)}
        assert body_of(got["uni-1"]) == "héllo ✓ 日本".encode()
        assert str(got["uni-1"]) == "héllo ✓ 日本"
        assert got["uni-1"].subject == "sübject ✓"
        assert body_of(got["empty-1"]) == b""
        for m in got.values():
            receiver.complete_message(m)


def test_session_id_round_trip(client: ServiceBusClient) -> None:
    with client.get_queue_sender("props-session") as sender:
        sender.send_messages(
            ServiceBusMessage("x", message_id="ps-1", session_id="sess-A", reply_to_session_id="reply-sess")
        )
    with client.get_queue_receiver("props-session", session_id="sess-A", max_wait_time=5) as receiver:
        (m,) = receive_exactly(receiver, 1)
        assert m.session_id == "sess-A"
        assert m.reply_to_session_id == "reply-sess"
        assert m.message_id == "ps-1"
        receiver.complete_message(m)


# --- receive modes --------------------------------------------------------------------------------


def test_peek_lock_hides_locked_message(client: ServiceBusClient) -> None:
    with client.get_queue_sender("peeklock") as sender:
        sender.send_messages(ServiceBusMessage("locked", message_id="pl-1"))
    with client.get_queue_receiver("peeklock") as a, client.get_queue_receiver("peeklock") as b:
        (m,) = receive_exactly(a, 1)
        assert m.delivery_count == 0
        uuid.UUID(str(m.lock_token))
        # Queue LockDuration is PT30S.
        assert m.locked_until_utc is not None
        left = (m.locked_until_utc - utcnow()).total_seconds()
        assert 20 < left <= 32, f"locked_until_utc is {left:.1f}s ahead, expected about 30s"
        assert_nothing(b, 0.5)  # locked: not given to another receiver
        a.complete_message(m)
        assert_nothing(b, 0.5)


def test_receive_and_delete(client: ServiceBusClient) -> None:
    with client.get_queue_sender("receive-and-delete") as sender:
        sender.send_messages([ServiceBusMessage(f"rd-{i}", message_id=f"rd-{i}") for i in range(3)])
    with client.get_queue_receiver("receive-and-delete", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as r:
        got = receive_exactly(r, 3)
        assert sorted(m.message_id for m in got) == ["rd-0", "rd-1", "rd-2"]
    # Gone from the queue: no redelivery to a new peek-lock receiver, nothing to peek.
    with client.get_queue_receiver("receive-and-delete") as r:
        assert_nothing(r, 0.5)
        assert r.peek_messages(max_message_count=10) == []


# --- settlement -----------------------------------------------------------------------------------


def test_complete_removes_message(client: ServiceBusClient) -> None:
    with client.get_queue_sender("complete") as sender:
        sender.send_messages([ServiceBusMessage("c-1", message_id="c-1"), ServiceBusMessage("c-2", message_id="c-2")])
    with client.get_queue_receiver("complete") as r:
        got = receive_exactly(r, 2)
        for m in got:
            r.complete_message(m)
        assert r.peek_messages(max_message_count=10) == []
    with client.get_queue_receiver("complete") as r:
        assert_nothing(r, 0.5)


def test_abandon_redelivers_with_incremented_delivery_count(client: ServiceBusClient) -> None:
    with client.get_queue_sender("abandon") as sender:
        sender.send_messages(ServiceBusMessage("ab", message_id="ab-1"))
    with client.get_queue_receiver("abandon") as r:
        (m,) = receive_exactly(r, 1)
        assert m.delivery_count == 0
        seq = m.sequence_number
        r.abandon_message(m)
        # Available again at once, long before the 30 s lock would have expired.
        t0 = time.monotonic()
        (m2,) = receive_exactly(r, 1, timeout=5)
        assert time.monotonic() - t0 < 5
        assert (m2.message_id, m2.sequence_number, body_of(m2)) == ("ab-1", seq, b"ab")
        assert m2.delivery_count == 1
        r.abandon_message(m2)
        (m3,) = receive_exactly(r, 1, timeout=5)
        assert m3.delivery_count == 2
        r.complete_message(m3)
        assert_nothing(r, 0.5)


def test_dead_letter_with_reason_and_description(client: ServiceBusClient) -> None:
    with client.get_queue_sender("deadletter") as sender:
        sender.send_messages(ServiceBusMessage("poison", message_id="dl-1", application_properties={"k": "v"}))
    with client.get_queue_receiver("deadletter") as r:
        (m,) = receive_exactly(r, 1)
        r.dead_letter_message(m, reason="BadOrder", error_description="total is negative")
        assert_nothing(r, 0.5)
        assert r.peek_messages(max_message_count=10) == []
    with client.get_queue_receiver("deadletter", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (d,) = receive_exactly(dlq, 1)
        assert d.message_id == "dl-1"
        assert body_of(d) == b"poison"
        assert d.dead_letter_reason == "BadOrder"
        assert d.dead_letter_error_description == "total is negative"
        assert app_props(d)["k"] == "v"
        dlq.complete_message(d)
        assert_nothing(dlq, 0.5)


def test_defer_and_receive_deferred_by_sequence_number(client: ServiceBusClient) -> None:
    with client.get_queue_sender("defer") as sender:
        sender.send_messages(
            [ServiceBusMessage("later", message_id="df-1"), ServiceBusMessage("now", message_id="df-2")]
        )
    with client.get_queue_receiver("defer") as r:
        got = {m.message_id: m for m in receive_exactly(r, 2)}
        seq = got["df-1"].sequence_number
        r.defer_message(got["df-1"])
        r.complete_message(got["df-2"])
        # A deferred message is never delivered by an ordinary receive.
        assert_nothing(r, 0.5)
        (d,) = r.receive_deferred_messages([seq])
        assert d.message_id == "df-1"
        assert d.sequence_number == seq
        assert body_of(d) == b"later"
        assert d.locked_until_utc is not None and d.locked_until_utc > utcnow()
        r.complete_message(d)
        # Completed: it no longer exists, by sequence number either.
        with pytest.raises(MessageNotFoundError):
            r.receive_deferred_messages([seq])
        assert_nothing(r, 0.5)


def test_prefetch_two_receivers_each_message_once(client: ServiceBusClient) -> None:
    n = 60
    with client.get_queue_sender("prefetch") as sender:
        sender.send_messages([ServiceBusMessage(f"p-{i}", message_id=f"p-{i}") for i in range(n)])
    seen: list[str] = []
    with client.get_queue_receiver("prefetch", prefetch_count=20) as a, \
            client.get_queue_receiver("prefetch", prefetch_count=20) as b:
        deadline = time.monotonic() + 20
        while len(seen) < n and time.monotonic() < deadline:
            for r in (a, b):
                for m in r.receive_messages(max_message_count=10, max_wait_time=0.5):
                    seen.append(m.message_id)
                    r.complete_message(m)
        assert sorted(seen) == sorted(f"p-{i}" for i in range(n)), "messages lost or delivered twice"
        assert_nothing(a, 0.5)
    with client.get_queue_receiver("prefetch") as r:
        assert r.peek_messages(max_message_count=10) == []


def test_released_message_is_available_again_without_a_delivery_count(client: ServiceBusClient) -> None:
    # The SDK releases (AMQP "released") what reaches an idle receiver, and drains and releases on close.
    # A released message was never delivered: it is available again at once, with its delivery count unchanged.
    a = client.get_queue_receiver("release")
    with a:
        assert a.receive_messages(max_message_count=5, max_wait_time=0.3) == []  # leaves link credit open
        with client.get_queue_sender("release") as sender:
            sender.send_messages(ServiceBusMessage("r", message_id="rel-1"))
        time.sleep(0.3)  # the message may flow to the idle receiver's open credit
        a.close()  # synchronous: drain the link and release what arrived
    with client.get_queue_receiver("release") as b:
        (m,) = receive_exactly(b, 1, timeout=3)  # not held until the 30 s lock expires
        assert m.message_id == "rel-1"
        assert m.delivery_count == 0
        b.complete_message(m)


# --- unknown entity ---------------------------------------------------------------------------------


# The unknown-entity tests use a client with the SDK's default options (retries on), as the app does.


def test_unknown_entity_sender_fails_fast(sb: Endpoint) -> None:
    client = ServiceBusClient.from_connection_string(sb.connection_string)

    def send() -> None:
        with client.get_queue_sender("no-such-queue") as sender:
            sender.send_messages(ServiceBusMessage("x"))

    t0 = time.monotonic()
    with client, pytest.raises(MessagingEntityNotFoundError):
        bounded(send, 20, "send to an unknown queue")
    assert time.monotonic() - t0 < 10, "not-found should fail fast, not after retries/timeouts"


def test_unknown_entity_receiver_fails_fast(sb: Endpoint) -> None:
    client = ServiceBusClient.from_connection_string(sb.connection_string)

    def receive() -> None:
        with client.get_queue_receiver("no-such-queue") as receiver:
            receiver.receive_messages(max_message_count=1, max_wait_time=5)

    t0 = time.monotonic()
    with client, pytest.raises(MessagingEntityNotFoundError):
        bounded(receive, 20, "receive from an unknown queue")
    assert time.monotonic() - t0 < 10, "not-found should fail fast, not after retries/timeouts"


def test_unknown_entity_peek_fails_fast(sb: Endpoint) -> None:
    client = ServiceBusClient.from_connection_string(sb.connection_string)

    def peek() -> None:
        with client.get_queue_receiver("no-such-queue") as receiver:
            receiver.peek_messages(max_message_count=1)

    t0 = time.monotonic()
    with client, pytest.raises(MessagingEntityNotFoundError):
        bounded(peek, 20, "peek on an unknown queue")
    assert time.monotonic() - t0 < 10


def test_unknown_entity_dead_letter_and_session_receivers_fail_fast(sb: Endpoint) -> None:
    client = ServiceBusClient.from_connection_string(sb.connection_string)

    def receive(**kwargs: object) -> None:
        with client.get_queue_receiver("no-such-queue", **kwargs) as receiver:  # type: ignore[arg-type]
            receiver.receive_messages(max_message_count=1, max_wait_time=5)

    with client:
        for kwargs in ({"sub_queue": ServiceBusSubQueue.DEAD_LETTER}, {"session_id": NEXT_AVAILABLE_SESSION},
                       {"session_id": "s"}):
            t0 = time.monotonic()
            with pytest.raises(MessagingEntityNotFoundError):
                bounded(lambda kw=kwargs: receive(**kw), 20, f"receive from an unknown queue with {kwargs}")
            assert time.monotonic() - t0 < 10, f"not-found should fail fast ({kwargs})"


def test_dead_letters_in_peek_lock_are_abandoned_and_completed_where_they_are(client: ServiceBusClient) -> None:
    """What the console's resubmit/discard relies on (shared/console/deadletter_actions.py): dead
    letters received in peek-lock, oldest first, abandoned again and again (past MaxDeliveryCount 2:
    a dead letter is never dead-lettered again) are at once available, delivery count + 1; one
    completed by its sequence number is gone, the others stay."""
    with client.get_queue_sender("dlq-settle") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"dls-{i}") for i in range(3)])
    with client.get_queue_receiver("dlq-settle") as r:
        for m in receive_exactly(r, 3):
            r.dead_letter_message(m, reason="Test")
    with client.get_queue_receiver("dlq-settle", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        seqs = [m.sequence_number for m in dlq.peek_messages(max_message_count=10)]
        assert len(seqs) == 3 and seqs == sorted(seqs)
        for round_ in range(3):
            got = receive_exactly(dlq, 3, timeout=5)
            assert [m.sequence_number for m in got] == seqs  # oldest first
            assert [m.delivery_count for m in got] == [round_] * 3, [m.delivery_count for m in got]
            for m in got:
                dlq.abandon_message(m)
        got = receive_exactly(dlq, 3, timeout=5)
        (middle,) = [m for m in got if m.sequence_number == seqs[1]]
        dlq.complete_message(middle)
        for m in got:
            if m is not middle:
                dlq.abandon_message(m)
        left = dlq.peek_messages(max_message_count=10, sequence_number=seqs[0])  # (a receiver's peek goes on
        assert [m.sequence_number for m in left] == [seqs[0], seqs[2]]          # from its last one without it)
        assert [m.dead_letter_reason for m in receive_exactly(dlq, 2, timeout=5)] == ["Test", "Test"]
