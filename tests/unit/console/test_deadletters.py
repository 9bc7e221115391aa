"""shared.console.deadletters without a broker: the query's validation (400 naming the parameter), the
view of a dead letter (reason, order id, body truncation), paging (``next``), the depths' cap,
and 503 when Service Bus fails. The client is a stand-in with the SDK's receiver API; the real
thing is tests/integration/test_deadletters_servicebus.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.servicebus import ServiceBusSubQueue
from azure.servicebus.amqp import AmqpMessageBodyType
from azure.servicebus.exceptions import ServiceBusConnectionError

from shared.console import deadletters
from shared.settings import QUEUE_SETTINGS
from tests.unit.harness import make_runtime


@dataclass
class Msg:
    """What the API reads of a ``ServiceBusReceivedMessage``."""

    sequence_number: int
    body_bytes: bytes = b"{}"
    application_properties: dict[Any, Any] | None = None
    message_id: str | None = "m"
    subject: str | None = None
    delivery_count: int = 10
    dead_letter_reason: str | None = "MaxDeliveryCountExceeded"
    dead_letter_error_description: str | None = "too many deliveries"
    enqueued_time_utc: datetime | None = datetime(2026, 11, 23, 18, 0, tzinfo=UTC)
    body_type: AmqpMessageBodyType = AmqpMessageBodyType.DATA

    @property
    def body(self) -> Any:
        return iter([self.body_bytes])


@dataclass
class FakeClient:
    """Queues by (name, dead letter?): peeks answer from them; ``fail`` raises as the SDK does.
    ``receivers``: every receiver built (each is a connection and its links in the SDK)."""

    queues: dict[tuple[str, bool], list[Msg]] = field(default_factory=dict)
    fail: bool = False
    peeks: list[tuple[str, bool, int, int]] = field(default_factory=list)
    receivers: list[FakeClient.Receiver] = field(default_factory=list)

    def get_queue_receiver(self, queue: str, sub_queue: Any = None) -> FakeClient.Receiver:
        receiver = FakeClient.Receiver(self, queue, sub_queue == ServiceBusSubQueue.DEAD_LETTER)
        self.receivers.append(receiver)
        return receiver

    @dataclass
    class Receiver:
        client: FakeClient
        queue: str
        dead: bool
        closed: bool = False
        fail_next: bool = False  # its next peek fails (e.g. its link was detached meanwhile)

        def __enter__(self) -> FakeClient.Receiver:
            return self

        def __exit__(self, *exc: object) -> None:
            self.close()

        def close(self) -> None:
            self.closed = True

        def peek_messages(self, max_message_count: int, *, sequence_number: int, timeout: float) -> list[Msg]:
            assert not self.closed, "a peek on a closed receiver"
            self.client.peeks.append((self.queue, self.dead, max_message_count, sequence_number))
            if self.client.fail or self.fail_next:
                self.fail_next = False
                raise ServiceBusConnectionError(message="connection refused")
            msgs = self.client.queues.get((self.queue, self.dead), [])
            return [m for m in msgs if m.sequence_number >= sequence_number][:max_message_count]


def _get(client: FakeClient, **params: str) -> Any:
    return deadletters.get_dead_letters(make_runtime(), params, client=client)


@pytest.mark.parametrize(("params", "field"), [
    ({}, "queue"), ({"queue": ""}, "queue"), ({"queue": "nope"}, "queue"),
    ({"queue": "scheduler/$DeadLetterQueue"}, "queue"),
    ({"queue": "scheduler", "limit": "0"}, "limit"), ({"queue": "scheduler", "limit": "51"}, "limit"),
    ({"queue": "scheduler", "limit": "-1"}, "limit"), ({"queue": "scheduler", "limit": "1.5"}, "limit"),
    ({"queue": "scheduler", "limit": "\u0663"}, "limit"), ({"queue": "scheduler", "limit": ""}, "limit"),
    ({"queue": "scheduler", "limit": "0" * 40 + "5"}, "limit"),
    ({"queue": "scheduler", "from": "-1"}, "from"), ({"queue": "scheduler", "from": "x"}, "from"),
    ({"queue": "scheduler", "from": str(2**63)}, "from"), ({"queue": "scheduler", "from": "1" * 40}, "from"),
    ({"queue": "scheduler", "from": " 5"}, "from"),
    ({"queue": "scheduler", "continuationToken": "x"}, "continuationToken"),
    ({"queue": "scheduler", "Limit": "5"}, "Limit"),
    ({"queue": "scheduler", "$top": "5"}, "$top"),
])
def test_a_bad_query_is_a_400_naming_the_parameter(params: dict[str, str], field: str) -> None:
    client = FakeClient()
    r = _get(client, **params)
    assert r.status == 400 and r.content_type == "application/problem+json"
    assert r.body["errors"] == [{"field": field, "message": r.body["errors"][0]["message"]}]
    assert r.body["detail"].startswith(f"{field}:")
    assert client.peeks == []  # nothing asked of Service Bus


def test_the_function_key_in_the_query_is_no_unknown_parameter() -> None:
    client = FakeClient({("scheduler", True): [Msg(7)]})
    assert _get(client, queue="scheduler", code="x").status == 200


@pytest.mark.parametrize("queue", ["SchedulerQueue", "schedulerqueue", "scheduler", "SCHEDULER"])
def test_the_queue_is_a_setting_or_a_queue_name_in_any_case(queue: str) -> None:
    client = FakeClient({("scheduler", True): [Msg(7)]})
    r = _get(client, queue=queue, limit="50", **{"from": str(2**63 - 1)})
    assert r.status == 200
    assert (r.body["queue"], r.body["setting"]) == ("scheduler", "SchedulerQueue")
    assert client.peeks == [("scheduler", True, 51, 2**63 - 1)]


def test_a_page_lists_every_queue_to_switch_to() -> None:
    r = _get(FakeClient({}), queue="scheduler")
    assert r.status == 200
    assert [q["setting"] for q in r.body["queues"]] == [s.name for s in QUEUE_SETTINGS]
    assert {"setting": "PaymentQueue", "name": "agent-payment"} in r.body["queues"]


def test_a_dead_letter_as_the_api_shows_it() -> None:
    body = json.dumps({"orderId": "from-body", "step": "payment"}).encode()
    client = FakeClient({("agent-payment", True): [
        Msg(3, body, {b"orderId": b"from-props"}, subject="request", dead_letter_reason="Poison",
            dead_letter_error_description="not JSON"),
        Msg(4, body),
        Msg(5, b"\xff not json", {"orderId": 5}),
    ]})
    r = _get(client, queue="PaymentQueue")
    assert r.status == 200 and r.body["next"] is None
    first, second, third = r.body["messages"]
    assert first == {"sequenceNumber": 3, "messageId": "m", "enqueuedAt": "2026-11-23T18:00:00.000000Z",
                     "deliveryCount": 10, "reason": "Poison", "description": "not JSON", "orderId": "from-props",
                     "subject": "request", "body": body.decode(), "bodyTruncated": False}
    assert second["orderId"] == "from-body" and second["reason"] == "MaxDeliveryCountExceeded"
    assert third["orderId"] is None and third["body"] == "\ufffd not json"  # bad bytes replaced, not an error


def test_the_body_is_cut_at_2000_characters() -> None:
    long = json.dumps({"orderId": "o-1", "pad": "é" * 3000}).encode()
    client = FakeClient({("alerts", True): [Msg(1, long), Msg(2, b"x" * 2000)]})
    cut, whole = _get(client, queue="alerts").body["messages"]
    assert len(cut["body"]) == 2000 and cut["bodyTruncated"] is True
    assert cut["orderId"] == "o-1"  # read from the whole body, not the cut one
    assert whole["body"] == "x" * 2000 and whole["bodyTruncated"] is False


def test_pages_follow_next() -> None:
    client = FakeClient({("replies", True): [Msg(n) for n in (2, 3, 5, 8, 13)]})
    seen, start = [], "0"
    while start is not None:
        page = _get(client, queue="replies", limit="2", **{"from": start}).body
        seen.append([m["sequenceNumber"] for m in page["messages"]])
        start = None if page["next"] is None else str(page["next"])
    assert seen == [[2, 3], [5, 8], [13]]
    assert [p[2] for p in client.peeks] == [3, 3, 3]  # one peek a page, one more than the page
    assert [p[3] for p in client.peeks] == [1, 5, 13]


def test_service_bus_down_is_a_503() -> None:
    r = _get(FakeClient(fail=True), queue="alerts")
    assert r.status == 503 and r.content_type == "application/problem+json"
    assert "alerts/$DeadLetterQueue" in r.body["detail"] and "ServiceBusConnectionError" in r.body["detail"]


def test_no_service_bus_setting_is_a_503(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.runtime import clients
    from shared.settings import Settings
    from tests.unit.harness import REQUIRED_VALUES

    monkeypatch.setattr(clients.get_clients, "value", clients.Clients(Settings.from_env(REQUIRED_VALUES)))
    r = deadletters.get_dead_letters(make_runtime(), {"queue": "alerts"})
    assert r.status == 503 and "ServiceBusConnection" in r.body["detail"]


def test_queue_depths_count_both_queues_of_every_setting_up_to_the_cap() -> None:
    client = FakeClient({("scheduler", False): [Msg(n) for n in range(1, 4)],
                         ("scheduler", True): [Msg(n) for n in range(1, 6)],
                         ("alerts", True): [Msg(n) for n in range(1, 5)]})
    depths = deadletters.queue_depths(make_runtime(), cap=4, client=client)
    assert [d["setting"] for d in depths] == [s.name for s in QUEUE_SETTINGS]
    by_setting = {d["setting"]: d for d in depths}
    assert by_setting["SchedulerQueue"] == {"setting": "SchedulerQueue", "name": "scheduler", "active": 3,
                                            "deadLetter": 4, "activeCapped": False, "deadLetterCapped": True}
    assert by_setting["AlertsQueue"]["deadLetter"] == 4 and not by_setting["AlertsQueue"]["deadLetterCapped"]
    assert by_setting["RepliesQueue"]["active"] == 0
    assert len(client.peeks) == 2 * len(QUEUE_SETTINGS)  # one peek each
    assert {p[2] for p in client.peeks} == {5}


def test_queue_depths_raise_when_service_bus_fails() -> None:
    with pytest.raises(deadletters.ServiceBusUnavailable):
        deadletters.queue_depths(make_runtime(), client=FakeClient(fail=True))
