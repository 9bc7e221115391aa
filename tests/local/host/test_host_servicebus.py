"""Service Bus triggers against the local emulator, driven and checked through the SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from tests.conftest import Endpoint, start_servicebus

from .conftest import SAMPLE_QUEUES, Host, start_host, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    ep = start_servicebus(tmp_path_factory.mktemp("sb-data"), config=SAMPLE_QUEUES)
    yield ep
    ep.proc.stop()


@pytest.fixture(scope="module")
def host(sb: Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    h = start_host(tmp_path_factory.mktemp("host-sb"), instances=2,
                   values={"ServiceBusConnection": sb.connection_string, "SlowSeconds": "4"})
    yield h
    h.proc.stop()


def send(sb: Endpoint, queue: str, *messages: ServiceBusMessage) -> None:
    with ServiceBusClient.from_connection_string(sb.connection_string) as c, c.get_queue_sender(queue) as s:
        s.send_messages(list(messages))


def receive(sb: Endpoint, queue: str, count: int, timeout: float = 15, sub_queue=None) -> list:
    got = []
    deadline = time.monotonic() + timeout
    with ServiceBusClient.from_connection_string(sb.connection_string) as c, \
            c.get_queue_receiver(queue, sub_queue=sub_queue) as r:
        while len(got) < count and time.monotonic() < deadline:
            for m in r.receive_messages(max_message_count=count - len(got), max_wait_time=2):
                got.append(m)
                r.complete_message(m)
    return got


def test_message_fields_and_output_binding(sb: Endpoint, host: Host):
    mid = f"m-{time.time_ns()}"
    send(sb, "sample-in", ServiceBusMessage('{"hello": "world"}', message_id=mid, correlation_id="corr-1",
                                            reply_to="replies", content_type="application/json",
                                            application_properties={"traceparent": "00-abc", "n": 7}))
    rec = wait_for(lambda: [r for r in host.read("received") if r["message_id"] == mid], 20, what="the message")
    assert len(rec) == 1
    r = rec[0]
    assert r["body"] == '{"hello": "world"}' and r["correlation_id"] == "corr-1" and r["reply_to"] == "replies"
    assert r["content_type"] == "application/json" and r["delivery_count"] == 1
    assert r["props"] == {"traceparent": "00-abc", "n": 7} and r["enqueued"]
    out = receive(sb, "sample-out", 1)
    assert [str(m) for m in out] == ['forwarded:{"hello": "world"}']


def test_many_messages_each_processed_once(sb: Endpoint, host: Host):
    tag = f"batch-{time.time_ns()}"
    send(sb, "sample-in", *[ServiceBusMessage(f"{tag}-{i}", message_id=f"{tag}-{i}") for i in range(40)])
    wait_for(lambda: len({r["message_id"] for r in host.read("received") if r["message_id"].startswith(tag)}) == 40,
             30, what="40 messages")
    time.sleep(1)
    recs = [r for r in host.read("received") if r["message_id"].startswith(tag)]
    assert len(recs) == 40  # completed: none redelivered
    assert len(receive(sb, "sample-out", 40, timeout=20)) == 40


def test_exception_abandons_until_dead_letter(sb: Endpoint, host: Host):
    mid = f"poison-{time.time_ns()}"
    send(sb, "sample-poison", ServiceBusMessage("bad", message_id=mid))
    dead = receive(sb, "sample-poison", 1, timeout=30, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert [m.message_id for m in dead] == [mid]
    assert dead[0].dead_letter_reason == "MaxDeliveryCountExceeded"
    attempts = [r["delivery_count"] for r in host.read("poison") if r["message_id"] == mid]
    assert sorted(attempts) == [1, 2, 3]  # MaxDeliveryCount 3 in servicebus-config.json
    assert any("Executed 'Functions.always_fails' (Failed" in line for line in host.proc.lines)


def test_lock_renewed_and_concurrency_limited(sb: Endpoint, host: Host):
    # LockDuration is 3 s and each call takes 4 s: without renewal every message would come back.
    tag = f"slow-{time.time_ns()}"
    send(sb, "sample-slow", *[ServiceBusMessage(tag, message_id=f"{tag}-{i}") for i in range(10)])
    wait_for(lambda: len([r for r in host.read("slow-end") if r["message_id"].startswith(tag)]) >= 10, 40,
             what="10 slow messages")
    time.sleep(1)
    starts = [r for r in host.read("slow-start") if r["message_id"].startswith(tag)]
    assert len(starts) == 10 and all(r["delivery_count"] == 1 for r in starts)
    assert max(r["active"] for r in starts) <= 4  # maxConcurrentCalls 4 per instance (host.json)
    assert max(r["active"] for r in starts) >= 2


def test_sessions_in_order_one_at_a_time(sb: Endpoint, host: Host):
    tag = f"s{time.time_ns()}"
    sessions = [f"{tag}-{k}" for k in range(3)]
    send(sb, "sample-sessions", *[ServiceBusMessage(f"{i}", session_id=sid) for i in range(5) for sid in sessions])
    wait_for(lambda: len([r for r in host.read("session-end") if r["session_id"].startswith(tag)]) == 15, 30,
             what="15 session messages")
    for sid in sessions:
        events = sorted([(r["at"], "start", r["body"]) for r in host.read("session-start") if r["session_id"] == sid]
                        + [(r["at"], "end", r["body"]) for r in host.read("session-end") if r["session_id"] == sid])
        assert [b for _, kind, b in events if kind == "start"] == ["0", "1", "2", "3", "4"]  # in order, once each
        kinds = [kind for _, kind, _ in events]
        assert kinds == ["start", "end"] * 5  # one message of a session at a time


def test_survives_broker_restart(sb: Endpoint, host: Host):
    sb.proc.stop()
    time.sleep(1.5)
    data_dir = Path(sb.proc.args[sb.proc.args.index("--data-dir") + 1])
    restarted = start_servicebus(data_dir, port=sb.port, config=SAMPLE_QUEUES)
    sb.proc = restarted.proc  # the module fixture stops this one
    mid = f"after-restart-{time.time_ns()}"
    send(sb, "sample-in", ServiceBusMessage("again", message_id=mid))
    wait_for(lambda: [r for r in host.read("received") if r["message_id"] == mid], 45, what="a message after restart")
    assert host.proc.alive()
