"""shared.console.deadletters against the real Service Bus emulator, through the app's clients: messages
dead-lettered by a receiver (reason and description) are peeked back, paged with ``from``, and
stay where they are; ``queue_depths`` counts both queues and stops at the cap."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue

from shared.console.deadletter_actions import copy_of, post_dead_letter_action, resubmit_id
from shared.console.deadletters import get_dead_letters, peek_dead_letters, queue_depths
from shared.console.receivers import close_peek_receivers, peek_receivers
from shared.core.statemachine import Config
from shared.messaging import ServiceBusBus
from shared.runtime import Runtime
from shared.runtime.clients import Clients
from shared.settings import QUEUE_SETTINGS, Settings
from shared.storage.memory import MemoryStore
from tests.conftest import QUEUE_CONFIG, start_servicebus
from tests.unit.harness import REQUIRED_VALUES

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Runtime, Any]]:
    """A broker of its own (the counts below must not see other tests' messages) and a runtime
    whose bus sends through the app's Clients on it."""
    ep = start_servicebus(tmp_path_factory.mktemp("sb-deadletters"), config=QUEUE_CONFIG)
    clients = Clients(Settings.from_env({**REQUIRED_VALUES, "ServiceBusConnection": ep.connection_string}))
    rt = Runtime(store=MemoryStore(), bus=ServiceBusBus(clients.sender),
                 config=Config.from_settings(Settings.from_env(REQUIRED_VALUES)), keys=clients.settings.token_keys,
                 service_bus=clients.service_bus)
    try:
        yield rt, clients.service_bus()
    finally:
        close_peek_receivers()  # the receivers the peeks kept (shared.console.receivers)
        clients.close()
        ep.proc.stop()


def _send(client: Any, queue: str, bodies: list[Any], **props: Any) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(json.dumps(b) if not isinstance(b, bytes) else b,
                                                message_id=uuid.uuid4().hex, application_properties=props or None)
                              for b in bodies])


def _dead_letter_all(client: Any, queue: str, want: int, reason: str, description: str) -> None:
    done = 0
    with client.get_queue_receiver(queue, max_wait_time=2) as receiver:
        while done < want:
            batch = receiver.receive_messages(max_message_count=want - done, max_wait_time=5)
            assert batch, f"only {done} of {want} messages arrived on {queue}"
            for m in batch:
                receiver.dead_letter_message(m, reason=reason, error_description=description)
            done += len(batch)


def test_dead_letters_are_peeked_with_their_reason_and_paged(sb: tuple[Runtime, Any]) -> None:
    rt, client = sb
    _send(client, "agent-payment", [{"orderId": f"o-{i}", "step": "payment"} for i in range(5)])
    _send(client, "agent-payment", [b"\xffnot json" + b"x" * 3000], orderId="o-props")
    _dead_letter_all(client, "agent-payment", 6, "PoisonMessage", "not a request the agent knows")

    first = peek_dead_letters(rt, "agent-payment", limit=4, from_seq=0)
    assert (first["queue"], first["setting"]) == ("agent-payment", "PaymentQueue")
    assert [m["orderId"] for m in first["messages"]] == ["o-0", "o-1", "o-2", "o-3"]
    m = first["messages"][0]
    assert (m["reason"], m["description"]) == ("PoisonMessage", "not a request the agent knows")
    assert m["deliveryCount"] >= 0 and m["enqueuedAt"].endswith("Z") and len(m["messageId"]) == 32
    assert json.loads(m["body"]) == {"orderId": "o-0", "step": "payment"} and m["bodyTruncated"] is False
    seqs = [m["sequenceNumber"] for m in first["messages"]]
    assert seqs == sorted(seqs) and first["next"] > seqs[-1]

    second = peek_dead_letters(rt, "agent-payment", limit=4, from_seq=first["next"])
    assert [m["orderId"] for m in second["messages"]] == ["o-4", "o-props"]
    assert second["next"] is None
    last = second["messages"][1]
    assert last["bodyTruncated"] is True and len(last["body"]) == 2000 and last["body"].startswith("\ufffd")

    # Peeking took nothing: the dead letters are all still there, none locked.
    with client.get_queue_receiver("agent-payment", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        assert len(dlq.peek_messages(max_message_count=50)) == 6
    # The HTTP side, by the setting's name.
    r = get_dead_letters(rt, {"queue": "PaymentQueue", "limit": "50", "from": str(seqs[2])})
    assert r.status == 200 and [m["orderId"] for m in r.body["messages"]] == ["o-2", "o-3", "o-4", "o-props"]


def test_max_delivery_count_exceeded_is_the_reason_service_bus_gives(sb: tuple[Runtime, Any]) -> None:
    rt, client = sb
    _send(client, "agent-shipping", [{"orderId": "o-abandoned"}])
    with client.get_queue_receiver("agent-shipping", max_wait_time=2) as receiver:
        for _ in range(10):  # the queue's MaxDeliveryCount (infra/servicebus-config.json)
            for m in receiver.receive_messages(max_message_count=1, max_wait_time=5):
                receiver.abandon_message(m)
    page = peek_dead_letters(rt, "agent-shipping", limit=20)
    assert [(m["orderId"], m["reason"]) for m in page["messages"]] == [("o-abandoned", "MaxDeliveryCountExceeded")]


def test_queue_depths_count_active_and_dead_letters_up_to_the_cap(sb: tuple[Runtime, Any]) -> None:
    rt, client = sb
    _send(client, "alerts", [{"n": i} for i in range(7)])
    _dead_letter_all(client, "alerts", 3, "Test", "three of seven")
    _send(client, "order-status", [{"n": i} for i in range(2)])

    depths = {d["setting"]: d for d in queue_depths(rt, cap=100)}
    assert list(depths) == [s.name for s in QUEUE_SETTINGS]
    assert depths["AlertsQueue"] == {"setting": "AlertsQueue", "name": "alerts", "active": 4, "deadLetter": 3,
                                     "activeCapped": False, "deadLetterCapped": False}
    assert (depths["StatusQueue"]["active"], depths["StatusQueue"]["deadLetter"]) == (2, 0)
    assert (depths["SchedulerQueue"]["active"], depths["SchedulerQueue"]["deadLetter"]) == (0, 0)

    capped = {d["setting"]: d for d in queue_depths(rt, cap=3)}
    assert capped["AlertsQueue"] == {"setting": "AlertsQueue", "name": "alerts", "active": 3, "deadLetter": 3,
                                     "activeCapped": True, "deadLetterCapped": False}
    assert (capped["StatusQueue"]["active"], capped["StatusQueue"]["activeCapped"]) == (2, False)
    # Counting received nothing: the four active alerts are still there.
    with client.get_queue_receiver("alerts") as receiver:
        assert len(receiver.peek_messages(max_message_count=50)) == 4
    # Both counts peeked on the same receivers, one per queue and dead-letter queue, kept open
    # between them; kept open, they take nothing: a message sent since is received by the app's receiver.
    assert peek_receivers(client).built == 2 * len(QUEUE_SETTINGS)
    assert queue_depths(rt, cap=100) == list(depths.values())
    assert peek_receivers(client).built == 2 * len(QUEUE_SETTINGS)
    _send(client, "order-status", [{"n": "after"}])
    got: list[Any] = []
    with client.get_queue_receiver("order-status", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        while len(got) < 3 and (batch := receiver.receive_messages(max_message_count=10, max_wait_time=5)):
            got.extend(batch)
    assert sorted(str(json.loads(b"".join(m.body))["n"]) for m in got) == ["0", "1", "after"]


# ---------------------------------------------------------------- resubmit and discard (issue 30, deliverable 6)

def _dead_seqs(client: Any, queue: str) -> list[int]:
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        return [m.sequence_number for m in dlq.peek_messages(max_message_count=250)]


def _drain(client: Any, queue: str) -> list[Any]:
    """Every message now in ``queue``, received and deleted."""
    got: list[Any] = []
    with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        while batch := receiver.receive_messages(max_message_count=50, max_wait_time=2):
            got.extend(batch)
    return got


def test_resubmit_sends_a_copy_the_queue_keeps_and_discard_removes(sb: tuple[Runtime, Any]) -> None:
    """Right after dead-lettering, inside the queue's duplicate-detection window: a copy with the
    original id would be dropped; the resubmitted copy (a new id) arrives, with what the app needs."""
    rt, client = sb
    queue = "agent-inventory"
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(json.dumps({"orderId": f"o-{i}", "step": "reserve"}),
                                                message_id=f"req-{i}", content_type="application/json",
                                                reply_to="replies", correlation_id=f"c-{i}", subject="request",
                                                application_properties={"traceparent": f"tp-{i}"})
                              for i in range(3)])
    _dead_letter_all(client, queue, 3, "PoisonMessage", "the agent refused it")
    first, second, third = _dead_seqs(client, queue)

    r = post_dead_letter_action(rt, "InventoryQueue", str(second), "resubmit", by="ana")
    assert r.status == 200, r.body
    assert _dead_seqs(client, queue) == [first, third]
    copies = _drain(client, queue)
    assert len(copies) == 1, "the copy was dropped (duplicate detection) or sent twice"
    assert r.body == {"queue": queue, "setting": "InventoryQueue", "sequenceNumber": second, "action": "resubmit",
                      "messageId": "req-1", "orderId": "o-1", "resubmittedAs": f"resubmit:{second}:req-1", "by": "ana"}
    (copy,) = copies
    assert copy.message_id == f"resubmit:{second}:req-1"
    assert json.loads(b"".join(copy.body)) == {"orderId": "o-1", "step": "reserve"}
    assert (copy.content_type, copy.reply_to, copy.correlation_id, copy.subject) == (
        "application/json", "replies", "c-1", "request")
    props = {(k.decode() if isinstance(k, bytes) else k): v for k, v in copy.application_properties.items()}
    assert props == {"traceparent": b"tp-1"} or props == {"traceparent": "tp-1"}  # no DeadLetterReason

    r = post_dead_letter_action(rt, queue, str(third), "discard", by="bo")
    assert r.status == 200
    assert (r.body["action"], r.body["orderId"], r.body["resubmittedAs"]) == ("discard", "o-2", None)
    assert _dead_seqs(client, queue) == [first] and _drain(client, queue) == []
    # Gone: a second action on either is a 404; the one left is untouched and free (not locked).
    for seq in (second, third):
        assert post_dead_letter_action(rt, queue, str(seq), "resubmit", by="ana").status == 404
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (left,) = dlq.receive_messages(max_message_count=5, max_wait_time=5)
        assert left.sequence_number == first and left.dead_letter_reason == "PoisonMessage"
        dlq.abandon_message(left)


def test_a_second_resubmit_after_a_crash_sends_no_second_copy(sb: tuple[Runtime, Any]) -> None:
    """The crash window: the copy was sent, the dead letter was not completed. Resubmitted again,
    the second copy has the same id, and the queue's duplicate detection drops it."""
    rt, client = sb
    queue = "agent-delivery"
    _send(client, queue, [{"orderId": "o-crash", "step": "deliver"}])
    _dead_letter_all(client, queue, 1, "PoisonMessage", "refused")
    (seq,) = _dead_seqs(client, queue)
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (dead,) = dlq.peek_messages(max_message_count=1)
        with client.get_queue_sender(queue) as sender:  # what the first attempt sent before it died
            sender.send_messages(copy_of(dead, resubmit_id(seq, dead.message_id)))
    r = post_dead_letter_action(rt, queue, str(seq), "resubmit", by="ana")
    assert r.status == 200 and _dead_seqs(client, queue) == []
    assert [m.message_id for m in _drain(client, queue)] == [resubmit_id(seq, dead.message_id)]


def test_one_dead_letter_among_many_is_found_and_the_others_are_given_back(sb: tuple[Runtime, Any]) -> None:
    rt, client = sb
    queue = "replies"
    _send(client, queue, [{"orderId": f"o-{i}"} for i in range(120)])
    _dead_letter_all(client, queue, 120, "Test", "many")
    seqs = _dead_seqs(client, queue)
    r = post_dead_letter_action(rt, queue, str(seqs[110]), "discard", by="ana")
    assert r.status == 200 and r.body["orderId"] == "o-110"
    assert _dead_seqs(client, queue) == seqs[:110] + seqs[111:]
    # every other one was given back at once (abandoned, not left locked until the lock expires)
    taken = 0
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                   receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as dlq:
        while batch := dlq.receive_messages(max_message_count=50, max_wait_time=2):
            taken += len(batch)
    assert taken == 119
