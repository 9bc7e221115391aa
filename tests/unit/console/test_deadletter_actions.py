"""shared.console.deadletter_actions without a broker: the request's validation (400 naming the field),
404 for a dead letter that is not there, resubmit = a copy with a new deterministic id sent BEFORE
the dead letter is completed, discard = completed, every other locked message given back, 409 when
it cannot be locked, 503 when Service Bus fails, and the log line with ``by`` and the order. The
stand-in has the SDK's receiver and sender API; the real thing is
tests/integration/test_deadletters_servicebus.py."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusSubQueue
from azure.servicebus.amqp import AmqpMessageBodyType
from azure.servicebus.exceptions import ServiceBusConnectionError

from shared.console import deadletter_actions as actions
from tests.unit.harness import make_runtime


@dataclass
class Dead:
    """What the actions read of a ``ServiceBusReceivedMessage`` in a dead-letter queue."""

    sequence_number: int
    body_bytes: bytes = b'{"orderId": "o-1", "step": "payment"}'
    application_properties: dict[Any, Any] | None = None
    message_id: str | None = "m-1"
    body_type: AmqpMessageBodyType = AmqpMessageBodyType.DATA
    session_id: str | None = None
    partition_key: str | None = None
    time_to_live: timedelta | None = None
    content_type: str | None = "application/json"
    correlation_id: str | None = None
    subject: str | None = None
    to: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None

    @property
    def body(self) -> Any:
        return iter([self.body_bytes])


@dataclass
class Broker:
    """One dead-letter queue (oldest first) with locks, and what was sent to each queue. ``locked``:
    sequence numbers another caller holds; ``fail``: the operation that raises as the SDK does."""

    dead: list[Dead] = field(default_factory=list)
    locked: set[int] = field(default_factory=set)
    fail: str | None = None
    sent: list[tuple[str, Any]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def _maybe_fail(self, what: str) -> None:
        if self.fail == what:
            raise ServiceBusConnectionError(message=f"{what} refused")

    def get_queue_receiver(self, queue: str, sub_queue: Any = None, **kwargs: Any) -> Broker.Receiver:
        assert sub_queue == ServiceBusSubQueue.DEAD_LETTER
        return Broker.Receiver(self, queue)

    def get_queue_sender(self, queue: str) -> Broker.Sender:
        return Broker.Sender(self, queue)

    @dataclass
    class Sender:
        broker: Broker
        queue: str

        def __enter__(self) -> Broker.Sender:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def send_messages(self, message: Any) -> None:
            self.broker._maybe_fail("send")
            self.broker.sent.append((self.queue, message))
            self.broker.log.append(f"send {message.message_id}")

    @dataclass
    class Receiver:
        broker: Broker
        queue: str

        def __enter__(self) -> Broker.Receiver:
            self.broker._maybe_fail("open")
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def peek_messages(self, max_message_count: int, *, sequence_number: int, timeout: float) -> list[Dead]:
            return [m for m in self.broker.dead if m.sequence_number >= sequence_number][:max_message_count]

        def receive_messages(self, max_message_count: int, max_wait_time: float) -> list[Dead]:
            free = [m for m in self.broker.dead if m.sequence_number not in self.broker.locked]
            batch = free[:max_message_count]
            self.broker.locked.update(m.sequence_number for m in batch)
            self.broker.log.append(f"receive {[m.sequence_number for m in batch]}")
            return batch

        def complete_message(self, message: Dead) -> None:
            self.broker._maybe_fail("complete")
            self.broker.dead.remove(message)
            self.broker.locked.discard(message.sequence_number)
            self.broker.log.append(f"complete {message.sequence_number}")

        def abandon_message(self, message: Dead) -> None:
            self.broker.locked.discard(message.sequence_number)
            self.broker.log.append(f"abandon {message.sequence_number}")


def _post(broker: Broker, queue: str, seq: str, action: str, by: str = "ana") -> Any:
    return actions.post_dead_letter_action(make_runtime(), queue, seq, action, by=by, client=broker)


@pytest.mark.parametrize(("queue", "seq", "field"), [
    ("", "1", "queue"), (None, "1", "queue"), ("nope", "1", "queue"), ("scheduler/$DeadLetterQueue", "1", "queue"),
    ("../scheduler", "1", "queue"), ("scheduler", "", "sequenceNumber"), ("scheduler", None, "sequenceNumber"),
    ("scheduler", "0", "sequenceNumber"), ("scheduler", "-1", "sequenceNumber"), ("scheduler", "1.5", "sequenceNumber"),
    ("scheduler", "\u0663", "sequenceNumber"), ("scheduler", str(2**63), "sequenceNumber"),
    ("scheduler", "1" * 40, "sequenceNumber"), ("scheduler", " 5", "sequenceNumber"),
    ("scheduler", "0x10", "sequenceNumber"),
])
@pytest.mark.parametrize("action", actions.ACTIONS)
def test_a_bad_request_is_a_400_naming_the_field(queue: str | None, seq: str | None, field: str, action: str) -> None:
    broker = Broker([Dead(1)])
    r = actions.post_dead_letter_action(make_runtime(), queue, seq, action, by="ana", client=broker)
    assert r.status == 400 and r.content_type == "application/problem+json"
    assert r.body["errors"] == [{"field": field, "message": r.body["errors"][0]["message"]}]
    assert r.body["detail"].startswith(f"{field}:")
    assert broker.log == [] and len(broker.dead) == 1  # nothing asked of Service Bus


@pytest.mark.parametrize("action", actions.ACTIONS)
def test_no_such_dead_letter_is_a_404_and_locks_nothing(action: str) -> None:
    broker = Broker([Dead(3), Dead(9)])
    for seq in ("1", "4", "10", str(2**63 - 1)):
        r = _post(broker, "scheduler", seq, action)
        assert r.status == 404 and r.content_type == "application/problem+json", (seq, r.body)
    assert broker.log == [] and [m.sequence_number for m in broker.dead] == [3, 9]


def test_resubmit_sends_a_copy_then_completes_and_gives_the_others_back(caplog: pytest.LogCaptureFixture) -> None:
    props = {b"orderId": b"o-7", "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
             "DeadLetterReason": "MaxDeliveryCountExceeded", b"DeadLetterErrorDescription": b"too many"}
    target = Dead(5, b'{"step": "payment"}', props, message_id="req-1", session_id="s-1", partition_key="s-1",
                  time_to_live=timedelta(minutes=3), correlation_id="c-1", subject="request", to="x",
                  reply_to="replies", reply_to_session_id="rs")
    broker = Broker([Dead(2), Dead(3), target, Dead(8)])
    with caplog.at_level(logging.INFO, logger="orders"):
        r = _post(broker, "PaymentQueue", "5", "resubmit", by="ana@contoso.com")
    assert r.status == 200
    assert r.body == {"queue": "agent-payment", "setting": "PaymentQueue", "sequenceNumber": 5, "action": "resubmit",
                      "messageId": "req-1", "orderId": "o-7", "resubmittedAs": "resubmit:5:req-1",
                      "by": "ana@contoso.com"}
    (queue, copy), = broker.sent
    assert queue == "agent-payment" and copy.message_id == "resubmit:5:req-1"
    assert b"".join(copy.body) == b'{"step": "payment"}'
    assert dict(copy.application_properties) == {b"orderId": b"o-7", "traceparent": props["traceparent"]}
    assert (copy.session_id, copy.partition_key, copy.time_to_live) == ("s-1", "s-1", timedelta(minutes=3))
    assert (copy.content_type, copy.correlation_id, copy.subject, copy.to, copy.reply_to, copy.reply_to_session_id) \
        == ("application/json", "c-1", "request", "x", "replies", "rs")
    # the copy is sent BEFORE the dead letter is completed; the others locked on the way are given back
    assert broker.log == ["receive [2, 3, 5, 8]", "send resubmit:5:req-1", "complete 5", "abandon 2", "abandon 3",
                          "abandon 8"]
    assert [m.sequence_number for m in broker.dead] == [2, 3, 8] and broker.locked == set()
    logged = [json.loads(rec.getMessage()) for rec in caplog.records if "deadletter." in rec.getMessage()]
    assert logged == [{"event": "deadletter.resubmitted", "orderId": "o-7", "by": "ana@contoso.com",
                       "messageId": "req-1", "resubmittedAs": "resubmit:5:req-1", "queue": "agent-payment",
                       "sequenceNumber": 5, "action": "resubmit"}]


def test_the_copys_id_is_new_deterministic_and_at_most_128_characters() -> None:
    assert actions.resubmit_id(5, "req-1") == actions.resubmit_id(5, "req-1") != "req-1"
    assert actions.resubmit_id(5, "x") != actions.resubmit_id(6, "x")  # one id per dead letter
    assert len(actions.resubmit_id(2**63 - 1, "a" * 128)) == 128
    assert actions.resubmit_id(7, None) == "resubmit:7:"


def test_discard_completes_it_and_sends_nothing(caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker([Dead(2, message_id="a"), Dead(3, b"not json", message_id="b")])
    with caplog.at_level(logging.INFO, logger="orders"):
        r = _post(broker, "scheduler", "3", "discard", by="key")
    assert r.status == 200 and r.body["orderId"] is None and r.body["resubmittedAs"] is None
    assert (r.body["action"], r.body["messageId"], r.body["by"]) == ("discard", "b", "key")
    assert broker.sent == [] and [m.sequence_number for m in broker.dead] == [2]
    assert broker.log == ["receive [2, 3]", "complete 3", "abandon 2"]
    logged = [json.loads(rec.getMessage()) for rec in caplog.records if "deadletter." in rec.getMessage()]
    assert [(e["event"], e["by"], "orderId" in e) for e in logged] == [("deadletter.discarded", "key", False)]


def test_a_long_queue_is_received_in_batches_until_the_one_is_found() -> None:
    broker = Broker([Dead(n) for n in range(1, 121)])
    r = _post(broker, "scheduler", "110", "discard")
    assert r.status == 200
    assert [line for line in broker.log if line.startswith("receive")] == [
        f"receive {list(range(1, 51))}", f"receive {list(range(51, 101))}", f"receive {list(range(101, 121))}"]
    assert len(broker.dead) == 119 and broker.locked == set()


def test_one_past_the_scan_limit_is_a_409_and_everything_is_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(actions, "MAX_SCAN", 4)
    monkeypatch.setattr(actions, "SCAN_BATCH", 3)
    broker = Broker([Dead(n) for n in range(1, 8)])
    r = _post(broker, "scheduler", "6", "resubmit")
    assert r.status == 409 and "first 4" in r.body["detail"]
    assert broker.sent == [] and len(broker.dead) == 7 and broker.locked == set()


def test_a_dead_letter_another_caller_holds_is_a_409() -> None:
    broker = Broker([Dead(1), Dead(2), Dead(3)], locked={2})
    r = _post(broker, "scheduler", "2", "discard")
    assert r.status == 409 and "locked by another caller" in r.body["detail"]
    assert broker.locked == {2} and len(broker.dead) == 3  # its lock is the other caller's; the rest given back


def test_a_failed_send_completes_nothing_and_is_a_503() -> None:
    broker = Broker([Dead(1), Dead(2)], fail="send")
    r = _post(broker, "scheduler", "2", "resubmit")
    assert r.status == 503 and "ServiceBusConnectionError" in r.body["detail"]
    assert [m.sequence_number for m in broker.dead] == [1, 2] and broker.locked == set()
    assert "complete 2" not in broker.log


def test_a_failed_completion_after_the_send_leaves_the_dead_letter_and_a_retry_sends_the_same_id() -> None:
    """The crash window: the copy went, the dead letter stayed. Resubmitted again, the second copy
    has the same message id (duplicate detection drops it inside its window)."""
    broker = Broker([Dead(4, message_id="req-9")], fail="complete")
    r = _post(broker, "scheduler", "4", "resubmit")
    assert r.status == 503 and "the copy was sent as resubmit:4:req-9" in r.body["detail"], r.body
    assert len(broker.dead) == 1 and broker.locked == set()
    broker.fail = None
    assert _post(broker, "scheduler", "4", "resubmit").status == 200
    assert [m.message_id for _, m in broker.sent] == ["resubmit:4:req-9", "resubmit:4:req-9"] and broker.dead == []


def test_service_bus_down_is_a_503() -> None:
    r = _post(Broker([Dead(1)], fail="open"), "alerts", "1", "discard")
    assert r.status == 503 and r.content_type == "application/problem+json"
    assert "alerts/$DeadLetterQueue" in r.body["detail"]


def test_a_value_body_cannot_be_resubmitted_but_can_be_discarded() -> None:
    broker = Broker([Dead(1, body_type=AmqpMessageBodyType.VALUE)])
    r = _post(broker, "alerts", "1", "resubmit")
    assert r.status == 422 and "discard it" in r.body["detail"]
    assert broker.sent == [] and len(broker.dead) == 1 and broker.locked == set()
    assert _post(broker, "alerts", "1", "discard").status == 200 and broker.dead == []


def test_a_partition_key_other_than_the_session_is_not_copied() -> None:
    copy = actions.copy_of(Dead(1, session_id="s", partition_key="p"), "id")
    assert (copy.session_id, copy.partition_key) == ("s", None)  # the SDK refuses one that differs
    copy = actions.copy_of(Dead(1, partition_key="p"), "id")
    assert (copy.session_id, copy.partition_key) == (None, "p")
