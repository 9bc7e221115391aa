"""Unit tests of the emulator's pure-Python parts (config, codec, broker, store), without AMQP or the SDK.

Messages are encoded with proton's Message codec, delivered payloads decoded with it, and a fake
sink stands in for a receiving link.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from proton import Message, symbol, timestamp

from local.servicebus import codec
from local.servicebus.broker import Broker, BrokerError, set_application_properties
from local.servicebus.config import EmulatorConfig, QueueConfig, load_config, parse_duration_ms
from local.servicebus.store import Store

T0 = 1_800_000_000_000  # a fixed "now" in ms


class FakeSink:
    def __init__(self, credit: int = 100) -> None:
        self._credit = credit
        self.delivered: list[tuple[Message, bytes, bool]] = []
        self.session: tuple[str, int] | None = None
        self.timed_out = False
        self.lost = False

    def credit(self) -> int:
        return self._credit

    def deliver(self, payload: bytes, tag: bytes, settled: bool) -> None:
        m = Message()
        m.decode(payload)
        self.delivered.append((m, tag, settled))
        self._credit -= 1

    def session_assigned(self, session_id: str, locked_until_ms: int) -> None:
        self.session = (session_id, locked_until_ms)

    def session_wait_timeout(self) -> None:
        self.timed_out = True

    def session_lost(self) -> None:
        self.lost = True

    def take(self) -> list[tuple[Message, bytes, bool]]:
        out, self.delivered = self.delivered, []
        return out


def q(name: str = "q", **kw) -> QueueConfig:
    return QueueConfig(name=name, **kw)


def make_broker(*queues: QueueConfig, store: Store | None = None) -> Broker:
    return Broker(EmulatorConfig(namespace="ns", queues=queues or (q(),)), store)


def enc(body: str = "x", **kw) -> bytes:
    return Message(body=body, **kw).encode()


def ann(m: Message, key: str):
    return (m.annotations or {}).get(symbol(key))


def test_duration_parsing() -> None:
    assert parse_duration_ms("PT1M", 0) == 60_000
    assert parse_duration_ms("P1D", 0) == 86_400_000
    assert parse_duration_ms("PT0.5S", 0) == 500
    assert parse_duration_ms("P14D", 0) == 14 * 86_400_000
    assert parse_duration_ms("PT1H30M", 0) == 5_400_000
    assert parse_duration_ms("00:00:30", 0) == 30_000
    assert parse_duration_ms(None, 7) == 7
    with pytest.raises(ValueError):
        parse_duration_ms("soon", 0)


def test_repository_config_loads() -> None:
    cfg = load_config(Path(__file__).resolve().parents[3] / "infra" / "servicebus-config.json")
    names = {qc.name for qc in cfg.queues}
    assert "scheduler" in names
    sched = next(qc for qc in cfg.queues if qc.name == "scheduler")
    assert sched.lock_duration_ms == 30_000 and sched.requires_duplicate_detection  # PT30S
    assert sched.duplicate_window_ms == 300_000 and sched.max_delivery_count == 10


def test_codec_round_trips_simple_values() -> None:
    for v in [None, True, False, 0, 7, -3, 2**40, "text", b"bin", uuid.uuid4(), 1.5]:
        got, end = codec.decode(codec.enc_value(v))
        assert got == v
    m = {"a": 1, "b": "x"}
    inner = b"".join(codec.enc_value(k) + codec.enc_value(v) for k, v in m.items())
    assert codec.decode(codec.enc_map_raw(inner, 4))[0] == m


def test_batch_envelope_is_split_into_messages() -> None:
    inner = [enc(f"m{i}", id=f"id-{i}") for i in range(3)]
    envelope = b"".join(b"\x00\x53\x75" + codec.enc_value(x) for x in inner)
    assert codec.split_batch(envelope) == inner
    # an ordinary message with a binary body is not a batch
    assert codec.split_batch(Message(body=b"hello").encode()) is None
    assert codec.split_batch(enc("value body")) is None


def test_send_deliver_complete_in_order_with_broker_annotations() -> None:
    b = make_broker(q(lock_duration_ms=30_000))
    e = b.entity("q")
    sink = FakeSink()
    b.attach(e, sink, receive_and_delete=False)
    assert b.send(e, [enc("a", id="1"), enc("b", id="2")], now=T0) == [1, 2]
    b.pump(T0)
    got = sink.take()
    assert [m.body for m, _, _ in got] == ["a", "b"]
    m, tag, settled = got[0]
    assert len(tag) == 16 and not settled
    assert ann(m, "x-opt-sequence-number") == 1
    assert ann(m, "x-opt-enqueued-time") == T0
    assert ann(m, "x-opt-locked-until") == T0 + 30_000
    assert m.delivery_count == 0
    assert m.id == "1"
    b.complete(tag)
    with pytest.raises(BrokerError) as err:
        b.complete(tag)
    assert err.value.condition == "com.microsoft:message-lock-lost"
    assert b.counts(e)["locked"] == 1 and 1 not in e.msgs


def test_abandon_redelivers_and_max_delivery_count_dead_letters() -> None:
    b = make_broker(q(max_delivery_count=2))
    e = b.entity("q")
    sink = FakeSink()
    b.attach(e, sink, False)
    b.send(e, [enc("a")], now=T0)
    b.pump(T0)
    (m, tag, _), = sink.take()
    b.abandon(tag, now=T0)
    b.pump(T0)
    (m, tag, _), = sink.take()
    assert m.delivery_count == 1
    b.abandon(tag, now=T0)  # second failed delivery: MaxDeliveryCount 2 reached
    b.pump(T0)
    assert sink.take() == []
    dlq = b.entity("q/$DeadLetterQueue")
    dsink = FakeSink()
    b.attach(dlq, dsink, False)
    b.pump(T0)
    (dm, _, _), = dsink.take()
    assert dm.properties["DeadLetterReason"] == "MaxDeliveryCountExceeded"
    assert dm.body == "a"


def test_lock_expiry_redelivers_with_higher_delivery_count() -> None:
    b = make_broker(q(lock_duration_ms=1000))
    e = b.entity("q")
    sink = FakeSink()
    b.attach(e, sink, False)
    b.send(e, [enc("a")], now=T0)
    b.pump(T0)
    (_, tag, _), = sink.take()
    b.tick(T0 + 999)
    b.pump(T0 + 999)
    assert sink.take() == []
    b.tick(T0 + 1000)
    b.pump(T0 + 1000)
    (m, tag2, _), = sink.take()
    assert m.delivery_count == 1 and tag2 != tag
    with pytest.raises(BrokerError):
        b.complete(tag)  # the old lock is gone


def test_renew_lock_moves_expiry() -> None:
    b = make_broker(q(lock_duration_ms=1000))
    e = b.entity("q")
    sink = FakeSink()
    b.attach(e, sink, False)
    b.send(e, [enc("a")], now=T0)
    b.pump(T0)
    (_, tag, _), = sink.take()
    assert b.renew_lock(tag, now=T0 + 800) == T0 + 1800
    b.tick(T0 + 1500)
    b.pump(T0 + 1500)
    assert sink.take() == []
    b.complete(tag)


def test_dead_letter_sets_reason_and_description_properties() -> None:
    b = make_broker()
    e = b.entity("q")
    sink = FakeSink()
    b.attach(e, sink, False)
    b.send(e, [enc("a", properties={"k": "v", "DeadLetterReason": "old"})], now=T0)
    b.pump(T0)
    (_, tag, _), = sink.take()
    b.dead_letter(tag, "bad", "very bad")
    dsink = FakeSink()
    b.attach(b.entity("q/$deadletterqueue"), dsink, True)
    b.pump(T0)
    (dm, _, settled), = dsink.take()
    assert settled
    assert dm.properties == {"k": "v", "DeadLetterReason": "bad", "DeadLetterErrorDescription": "very bad"}


def test_set_application_properties_without_existing_section() -> None:
    raw = Message(body=b"x", id="m").encode()
    out = set_application_properties(raw, [("A", "1")])
    m = Message()
    m.decode(out)
    assert m.properties == {"A": "1"} and m.id == "m" and m.body == b"x"


def test_duplicate_detection_within_window() -> None:
    b = make_broker(q(requires_duplicate_detection=True, duplicate_window_ms=60_000))
    e = b.entity("q")
    assert b.send(e, [enc("a", id="same")], now=T0) == [1]
    assert b.send(e, [enc("b", id="same")], now=T0 + 1000) == [None]
    assert b.send(e, [enc("c", id="other")], now=T0 + 1000) == [2]
    b.tick(T0 + 61_000)
    assert b.send(e, [enc("d", id="same")], now=T0 + 61_000) == [3]


def test_scheduled_message_appears_at_its_time() -> None:
    b = make_broker()
    e = b.entity("q")
    sink = FakeSink()
    b.attach(e, sink, False)
    when = T0 + 5000
    b.send(e, [enc("later", annotations={symbol("x-opt-scheduled-enqueue-time"): timestamp(when)})], now=T0)
    b.pump(T0)
    assert sink.take() == []
    assert b.peek(e, 1, 10)[0].state == 2  # scheduled
    b.tick(when - 1)
    b.pump(when - 1)
    assert sink.take() == []
    b.tick(when)
    b.pump(when)
    (m, _, _), = sink.take()
    assert m.body == "later" and ann(m, "x-opt-enqueued-time") == when


def test_cancel_scheduled() -> None:
    b = make_broker()
    e = b.entity("q")
    (seq,) = b.schedule(e, [enc("x", annotations={symbol("x-opt-scheduled-enqueue-time"): timestamp(T0 + 10)})],
                        now=T0)
    b.cancel_scheduled(e, [seq])
    assert e.msgs == {}


def test_ttl_drops_or_dead_letters() -> None:
    b = make_broker(q("drop"), q("dl", dead_lettering_on_expiration=True))
    for name in ("drop", "dl"):
        e = b.entity(name)
        b.send(e, [enc("a", ttl=1.0)], now=T0)
        b.tick(T0 + 1000)
        assert e.msgs == {}
    assert b.entity("drop/$DeadLetterQueue").msgs == {}
    (dm,) = b.entity("dl/$DeadLetterQueue").msgs.values()
    m = Message()
    m.decode(dm.encode())
    assert m.properties["DeadLetterReason"] == "TTLExpiredException"


def test_queue_default_ttl_caps_message_ttl() -> None:
    b = make_broker(q(default_ttl_ms=2000))
    e = b.entity("q")
    b.send(e, [enc("a", ttl=60.0), enc("b")], now=T0)
    assert [m.expires_ms for m in e.msgs.values()] == [T0 + 2000, T0 + 2000]


def test_receive_and_delete_removes_on_delivery() -> None:
    b = make_broker()
    e = b.entity("q")
    sink = FakeSink()
    b.attach(e, sink, receive_and_delete=True)
    b.send(e, [enc("a")], now=T0)
    b.pump(T0)
    (m, _, settled), = sink.take()
    assert settled and ann(m, "x-opt-locked-until") is None
    assert e.msgs == {}


def test_defer_and_receive_deferred() -> None:
    b = make_broker()
    e = b.entity("q")
    sink = FakeSink()
    b.attach(e, sink, False)
    (seq,) = b.send(e, [enc("a")], now=T0)
    b.pump(T0)
    (_, tag, _), = sink.take()
    b.defer(tag)
    b.send(e, [enc("b")], now=T0)
    b.pump(T0)
    assert [m.body for m, _, _ in sink.take()] == ["b"]  # the deferred one is not delivered again
    ((msg, token, payload),) = b.receive_deferred(e, [seq], receive_and_delete=False, now=T0)
    m = Message()
    m.decode(payload)
    assert m.body == "a"
    b.settle(token, "completed")
    assert seq not in e.msgs
    with pytest.raises(BrokerError):
        b.receive_deferred(e, [seq], receive_and_delete=False)


def test_release_is_not_a_delivery_attempt() -> None:
    b = make_broker()
    e = b.entity("q")
    sink = FakeSink()
    b.attach(e, sink, False)
    b.send(e, [enc("a")], now=T0)
    b.pump(T0)
    (_, tag, _), = sink.take()
    b.release(tag, now=T0)
    b.pump(T0)
    (m, _, _), = sink.take()
    assert m.delivery_count == 0


def test_prefetching_consumers_share_messages_once() -> None:
    b = make_broker()
    e = b.entity("q")
    s1, s2 = FakeSink(credit=3), FakeSink(credit=3)
    b.attach(e, s1, False)
    b.attach(e, s2, False)
    b.send(e, [enc(str(i)) for i in range(5)], now=T0)
    b.pump(T0)
    bodies = [m.body for m, _, _ in s1.take()] + [m.body for m, _, _ in s2.take()]
    assert sorted(bodies) == ["0", "1", "2", "3", "4"]


def test_sessions_filter_next_available_and_exclusive_lock() -> None:
    b = make_broker(q(requires_session=True, lock_duration_ms=1000))
    e = b.entity("q")
    with pytest.raises(BrokerError):
        b.send(e, [enc("no session")], now=T0)
    b.send(e, [enc("a1", group_id="A"), enc("b1", group_id="B"), enc("a2", group_id="A")], now=T0)
    sa = FakeSink()
    ca = b.attach(e, sa, False, session_filter="A", now=T0)
    assert sa.session == ("A", T0 + 1000)
    with pytest.raises(BrokerError) as err:
        b.attach(e, FakeSink(), False, session_filter="A", now=T0)
    assert err.value.condition == "com.microsoft:session-cannot-be-locked"
    b.pump(T0)
    assert [m.body for m, _, _ in sa.take()] == ["a1", "a2"]
    sn = FakeSink()
    b.attach(e, sn, False, session_filter=None, now=T0)
    assert sn.session is not None and sn.session[0] == "B"
    b.pump(T0)
    assert [m.body for m, _, _ in sn.take()] == ["b1"]
    # nothing left: a next-available receiver waits, then times out
    sw = FakeSink()
    b.attach(e, sw, False, session_filter=None, wait_ms=500, now=T0)
    assert sw.session is None
    b.tick(T0 + 500)
    assert sw.timed_out
    # session state and renewal
    b.set_session_state(e, "A", b"st")
    assert b.get_session_state(e, "A") == b"st"
    assert b.renew_session_lock(e, "A", now=T0 + 900) == T0 + 1900
    b.detach(ca)
    with pytest.raises(BrokerError):
        b.renew_session_lock(e, "A")


def test_session_lock_expiry_tells_the_link() -> None:
    b = make_broker(q(requires_session=True, lock_duration_ms=1000))
    e = b.entity("q")
    b.send(e, [enc("a1", group_id="A")], now=T0)
    sa = FakeSink()
    b.attach(e, sa, False, session_filter="A", now=T0)
    b.pump(T0)
    (_, tag, _), = sa.take()
    b.tick(T0 + 1000)
    assert sa.lost
    with pytest.raises(BrokerError):
        b.complete(tag)
    s2 = FakeSink()
    b.attach(e, s2, False, session_filter="A", now=T0 + 1000)
    b.pump(T0 + 1000)
    (m, _, _), = s2.take()
    assert m.delivery_count == 1


def test_store_survives_restart(tmp_path: Path) -> None:
    cfg = (q("q", requires_duplicate_detection=True), q("s", requires_session=True))
    store = Store(tmp_path)
    b = make_broker(*cfg, store=store)
    e = b.entity("q")
    sink = FakeSink()
    b.attach(e, sink, False)
    b.send(e, [enc("a", id="1"), enc("b", id="2"), enc("c", id="3")], now=T0)
    b.pump(T0)
    got = sink.take()
    b.complete(got[0][1])
    b.abandon(got[1][1])  # delivery count 1
    # message 3 stays locked: after a restart it is available again
    b.commit()
    store.close()

    store2 = Store(tmp_path)
    b2 = make_broker(*cfg, store=store2)
    e2 = b2.entity("q")
    sink2 = FakeSink()
    b2.attach(e2, sink2, False)
    b2.pump(T0)
    got2 = {m.body: m for m, _, _ in sink2.take()}
    assert set(got2) == {"b", "c"}
    assert got2["b"].delivery_count == 1 and got2["c"].delivery_count == 0
    # sequence numbers are not reused, duplicate detection history is kept
    assert b2.send(e2, [enc("d", id="4")], now=T0 + 1) == [4]
    assert b2.send(e2, [enc("again", id="1")], now=T0 + 2) == [None]
    store2.close()


def test_sdk_encoded_batch_is_split_and_parsed() -> None:
    """The exact bytes the SDK's pyamqp puts in a batch transfer (format 0x80013700)."""
    from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
    from azure.servicebus._pyamqp._encode import encode_payload
    from azure.servicebus._pyamqp.message import BatchMessage

    batch = ServiceBusMessageBatch(max_size_in_bytes=262144)
    for i in range(3):
        batch.add_message(ServiceBusMessage(f"b{i}", message_id=f"id-{i}", session_id="S",
                                            application_properties={"n": i}))
    raw = bytes(encode_payload(bytearray(), BatchMessage(*batch._message)))
    inner = codec.split_batch(raw)
    assert inner is not None and len(inner) == 3
    b = make_broker(q(requires_session=True))
    e = b.entity("q")
    assert b.send(e, inner, now=T0) == [1, 2, 3]
    assert [m.p.message_id for m in e.msgs.values()] == ["id-0", "id-1", "id-2"]
    assert {m.session_id for m in e.msgs.values()} == {"S"}
    out = Message()
    out.decode(e.msgs[2].encode(T0 + 1))
    assert out.properties == {"n": 1} and out.group_id == "S"
